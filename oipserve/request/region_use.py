"""One registered region, and one request's hold on it (``client_regions``).

A ``ClientRegion`` is what the registry keeps of a registration: its object's identity,
its place in the object, and the count of requests that use it, whose drop to zero lets
an unregistered region go (Triton's deferred unregister). A ``RegionUse`` is one tensor's
hold, released once; the front reads and writes the tensor's bytes through it with
``preadv``/``pwrite`` on the object opened by name and checked to be the one registered,
never a mapping (a client that truncates its object cannot turn it into a SIGBUS).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TypedDict

from oipserve.errors import InvalidInput
from oipserve.request.shm_objects import open_failure, open_name
from oipserve.wire.messages import ObjectRef


class RegionStatus(TypedDict):
    """A registered region as the status calls report it (REST and gRPC: the same fields)."""

    name: str
    key: str
    offset: int
    byte_size: int


class ClientRegion:
    """One registered region: its object's identity, its place in it, the requests using it."""

    __slots__ = ("name", "key", "offset", "byte_size", "ref", "uses", "on_idle", "_idle")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, ref: ObjectRef) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.ref = ref
        #: Requests in flight that read or write this region (on a primary with
        #: ``--http-workers``, plus one while another front may still use it).
        self.uses = 0
        #: Set once the region is unregistered (``pending``): called when ``uses`` drops
        #: to 0, to drop it from the table (Triton's ``awaiting_unregister``).
        self.on_idle: Callable[[ClientRegion], None] | None = None
        self._idle: asyncio.Event | None = None

    @property
    def pending(self) -> bool:
        """Unregistered, kept until the requests that use it end."""
        return self.on_idle is not None

    def status(self) -> RegionStatus:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def done_with(self) -> None:
        self.uses -= 1
        if self.uses == 0:
            # NOTE: synchronously, before the request's response is written: a client
            #   that asks for the status once its answer arrived finds the region gone.
            if self.on_idle is not None:
                self.on_idle(self)
            if self._idle is not None:
                self._idle.set()

    async def idle(self) -> None:
        """Return once no request uses the region (at once when none does)."""
        if self.uses:
            if self._idle is None:
                self._idle = asyncio.Event()  # one event: several may wait
            await self._idle.wait()


class RegionUse:
    """One request's hold on a region: where its tensor lies in the object.

    Released once (``release``) when nothing of the request reads or writes it any
    more; it goes in the request's ``owned`` list, next to its segment leases.
    """

    __slots__ = ("region", "offset", "nbytes", "relative", "_held")

    def __init__(self, region: ClientRegion, relative: int, nbytes: int) -> None:
        self.region = region
        #: The tensor's offset in the region (what the client gave) and in the object.
        self.relative = relative
        self.offset = region.offset + relative
        self.nbytes = nbytes
        region.uses += 1
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.region.done_with()

    def read_into(self, target: memoryview) -> None:
        """Copy the tensor's bytes into ``target`` with ``preadv`` (no mapping: no SIGBUS)."""
        fd = self._open()
        try:
            got = os.preadv(fd, [target], self.offset)
        finally:
            os.close(fd)
        if got != len(target):
            raise InvalidInput(self.truncated(len(target)))

    def check_room(self, what: str, needed: int) -> None:
        """InvalidInput when ``needed`` bytes of ``what`` do not fit the tensor's place."""
        if needed > self.nbytes:
            raise InvalidInput(self.too_small(what, needed))

    def write(self, data: memoryview) -> None:
        """Write an output's bytes at the tensor's place with ``pwrite``."""
        self.check_room("an output", len(data))
        fd = self._open()
        try:
            if os.fstat(fd).st_size < self.offset + len(data):
                raise InvalidInput(self.truncated(len(data)))
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], self.offset + done)
        finally:
            os.close(fd)

    def _open(self) -> int:
        """The region's object, opened by name for one read or write and checked to be the
        object registered (the same rule as a worker's, ``workers.regions``)."""
        region = self.region
        try:
            fd = open_name(region.ref.name)
        except FileNotFoundError:
            raise InvalidInput(
                f"shared memory object '{region.ref.name}' of region '{region.name}' no "
                "longer exists (the client removed it after registering the region)"
            ) from None
        except OSError as exc:
            raise open_failure(region.key, exc) from None
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (region.ref.dev, region.ref.ino):
            os.close(fd)
            raise InvalidInput(
                f"shared memory object '{region.ref.name}' of region '{region.name}' is not "
                "the one registered (it was removed and created again); register the region "
                "again"
            )
        return fd

    def truncated(self, needed: int) -> str:
        return (
            f"shared memory region '{self.region.name}' (key '{self.region.key}') no longer "
            f"holds {needed} bytes at offset {self.offset}: its object was truncated"
        )

    def too_small(self, what: str, needed: int) -> str:
        return (
            f"{what} needs {needed} bytes but its shared memory region "
            f"'{self.region.name}' gives {self.nbytes} (shared_memory_byte_size)"
        )
