"""Clients' own shared memory (the system shared-memory extension): the registry of regions.

A client creates a POSIX shared-memory object, registers a region of it under a name
(``key``, ``offset``, ``byte_size``), and then names the region in inference requests
instead of sending tensor bytes. This module holds what the front knows of those
regions: it checks a key (one POSIX name, never one of the server's own segments),
records the object's identity (``st_dev``/``st_ino``) and counts the requests that use
each region. An unregister of a region in use is deferred, as Triton does it (2.53 on):
the call returns at once, the region stays listed (and usable) until the last request
that uses it ends, then it is dropped. Workers map the objects themselves
(``workers.regions``); the front touches a region's bytes only with ``pread``/``pwrite``
(dynamic batching), which a client that truncates its object cannot turn into a SIGBUS.

The front keeps **no descriptor** per registration: it opens the object to check it,
closes it, and opens it again by name (checking the identity, as a worker does) for each
``pread``/``pwrite``. A descriptor held per registration let one client use up the
front's descriptors by registering one object under thousands of names, after which
every other client's requests failed. ``--max-shm-regions`` bounds the table itself.

Off unless ``--allow-client-shm`` (docs/shared-memory.md, docs/security.md).

This module is the registry (register, status, unregister, ``use``); its parts, one job a
module: ``shm_objects`` (a key as a POSIX name, its object opened), ``region_parameters``
(a tensor's shared-memory parameters read), ``region_use`` (one region, and a request's
hold on it: use counts, ``preadv``/``pwrite``). ``__all__`` keeps the names the rest of the
front imports from here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from oipserve.errors import AlreadyExists, Forbidden, InvalidInput, NotFound
from oipserve.request.region_parameters import (
    RegionRequest,
    region_parameters,
    region_request,
    wants_region,
)
from oipserve.request.region_use import ClientRegion, RegionStatus, RegionUse
from oipserve.request.shm_objects import object_name, open_object
from oipserve.wire.messages import ObjectRef
from oipserve.wire.shm import SHM_DIR

if TYPE_CHECKING:
    from hardware import Inventory

log = logging.getLogger("oipserve.shm")

__all__ = [
    "DEFAULT_MAX_REGIONS",
    "ClientRegion",
    "ClientRegions",
    "RegionRequest",
    "RegionStatus",
    "RegionUse",
    "cuda_refusal",
    "object_name",
    "region_parameters",
    "region_request",
    "wants_region",
]

#: Registered regions per server unless ``--max-shm-regions`` says otherwise.
DEFAULT_MAX_REGIONS = 1024

FLAG_MESSAGE = (
    "Client shared memory is disabled on this server; start it with --allow-client-shm true "
    "(or OIPSERVE_ALLOW_CLIENT_SHM=true) to let clients register their own shared memory"
)

#: The prefix of the shared-memory keys Triton's Python backend creates; Triton refuses a
#: client's key that starts with it (after any leading '/'), naming it, and so do we.
RESERVED_PREFIX = "triton_python_backend_shm_region_"


def cuda_refusal(inventory: Inventory) -> str:
    """What CUDA shared-memory requests are answered (400) on this machine."""
    if not inventory.gpus:
        return "CUDA shared memory is not available: no GPU"
    return (
        "CUDA shared memory is not implemented yet in oipserve (docs/shared-memory.md has "
        "the design); use system shared memory"
    )


class RegionMirror(Protocol):
    """The server's other HTTP fronts (``--http-workers``), which keep the same table."""

    async def added(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    async def removed(self, name: str | None) -> set[str]:
        """Every other front unregisters ``name`` (all when None) as ``unregister`` does;
        the names that requests on some front still use."""
        ...

    async def idle(self, names: list[str]) -> None:
        """Return once no other front uses any of ``names`` any more."""
        ...


class ClientRegions:
    """The registered regions by name; refuses registration unless allowed."""

    def __init__(
        self,
        allowed: bool,
        own_prefix: str,
        cuda_refusal: str = "CUDA shared memory is not available: no GPU",
        limit: int = DEFAULT_MAX_REGIONS,
    ) -> None:
        self.allowed = allowed
        self._own_prefix = own_prefix
        #: Regions registered at most (``--max-shm-regions``); one more is a 400.
        self.limit = limit
        self._regions: dict[str, ClientRegion] = {}
        #: Hears the objects of unregistered regions, once no request uses them, so
        #: that the workers unmap them.
        self.on_closed: Callable[[list[ObjectRef]], None] | None = None
        #: What a CUDA shared-memory request is answered (400).
        self.cuda_refusal = cuda_refusal
        #: The other HTTP fronts, told of each registration and unregistration.
        self.mirror: RegionMirror | None = None
        #: Waits for other fronts to finish with unregistered regions (``_wait_elsewhere``).
        self._waits: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._regions)

    # ---- register, status, unregister -------------------------------------------

    async def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Open and check the client's object and keep the region under ``name``; with
        ``--http-workers``, every other HTTP front registers it too before this returns
        (if one cannot, the registration is undone here and its error raised)."""
        self._register(name, key, offset, byte_size)
        if self.mirror is None:
            return
        try:
            await self.mirror.added(name, key, offset, byte_size)
        except BaseException:
            await self.unregister(name)
            raise

    def check_allowed(self) -> None:
        """403 unless ``--allow-client-shm``: register and unregister (system and CUDA)."""
        if not self.allowed:
            raise Forbidden(FLAG_MESSAGE)

    def _register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_allowed()
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        if key.lstrip("/").startswith(RESERVED_PREFIX):
            # Triton's words (L0_shared_memory test_register_reserved_names matches them).
            raise InvalidInput(
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{RESERVED_PREFIX}'"
            )
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if len(self._regions) >= self.limit:
            raise InvalidInput(
                f"failed to register shared memory region '{name}': this server already has "
                f"{len(self._regions)} regions registered, its limit (--max-shm-regions); "
                "unregister regions that are no longer used, or reuse one region at "
                "several offsets"
            )
        for what, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidInput(f"'{what}' must be a non-negative integer, got {value!r}")
        try:
            object_name(key)
        except InvalidInput as exc:  # Triton's words first (its QA tests match them)
            raise InvalidInput(
                f"cannot register shared memory region '{name}' - invalid shm key '{key}': "
                f"{exc.message}"
            ) from None
        fd = open_object(key)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"shared memory key '{key}' is not a shared-memory object")
            ref = ObjectRef(object_name(key), info.st_dev, info.st_ino)
            if (info.st_dev, info.st_ino) in self._own_objects():
                raise InvalidInput(
                    f"shared memory key '{key}' is one of this server's own segments, which "
                    "clients cannot register"
                )
            if offset + byte_size > info.st_size:
                raise InvalidInput(
                    f"failed to register shared memory region '{name}': invalid args: offset "
                    f"{offset} + byte_size {byte_size} is past the end of object '{key}' "
                    f"({info.st_size} bytes)"
                )
        finally:
            # NOTE: not kept open: a descriptor per registration is what let one client
            #   exhaust the front's descriptors (the identity check replaces it).
            os.close(fd)
        self._regions[name] = ClientRegion(name, key, offset, byte_size, ref)

    def _own_objects(self) -> set[tuple[int, int]]:
        """(st_dev, st_ino) of every segment of this server (front and workers)."""
        own: set[tuple[int, int]] = set()
        try:
            names = os.listdir(SHM_DIR)
        except FileNotFoundError:
            return own
        for entry in names:
            if entry.startswith(self._own_prefix):
                try:
                    info = os.stat(os.path.join(SHM_DIR, entry), follow_symlinks=False)
                except OSError:
                    continue
                own.add((info.st_dev, info.st_ino))
        return own

    def cuda_status(self, name: str | None) -> list[dict[str, object]]:
        """CUDA regions: none can be registered (``cuda_refusal``), so none is listed and a
        name is unknown. Unregistering them is a no-op that succeeds, so that clients which
        clean up first (Triton's examples) work on this server."""
        if name is None:
            return []
        raise NotFound(f"Unable to find cuda shared memory region: '{name}' ({self.cuda_refusal})")

    def registered(self) -> list[tuple[str, str, int, int]]:
        """Each region as registered (name, key, offset, byte size), but those being
        unregistered: what another front registers to use them too."""
        return [
            (region.name, region.key, region.offset, region.byte_size)
            for region in self._regions.values()
            if not region.pending
        ]

    def status(self, name: str | None) -> list[RegionStatus]:
        if name is None:
            return [region.status() for region in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    async def unregister(self, name: str | None) -> list[str]:
        """Unregister one region (all when ``name`` is None); the names of those that
        requests still use, whose removal is deferred.

        Triton's rule (2.53 on): the call does not wait. A region that no request uses is
        dropped at once; one in use is marked and stays in the table, listed by status,
        usable by new requests and its name taken, until the last request that uses it
        ends (``ClientRegion.done_with``). An unknown name is not an error. With
        ``--http-workers`` the other fronts mark theirs too, and this front keeps the
        region until their requests end as well.

        Refused (403, Triton's phrase first) while client shared memory is off, as Triton
        refuses it: a deliberate change, an unregister used to succeed with the flag off.
        """
        self.check_allowed()
        regions = self._matching(name)
        fresh = [region for region in regions if not region.pending]
        for region in fresh:
            region.on_idle = self._forget_one
        if self.mirror is not None and fresh:
            await self._unregister_elsewhere(name, fresh)
        else:
            self._forget([region for region in fresh if region.uses == 0])
        return [region.name for region in regions if region.uses]

    def _matching(self, name: str | None) -> list[ClientRegion]:
        if name is None:
            return list(self._regions.values())
        region = self._regions.get(name)
        return [] if region is None else [region]

    async def _unregister_elsewhere(self, name: str | None, fresh: list[ClientRegion]) -> None:
        """The other fronts unregister it too; each of ``fresh`` that one of them still
        uses is held here (one use) until none does, so that status lists it meanwhile."""
        if self.mirror is None:
            return
        for region in fresh:
            region.uses += 1  # the other fronts' hold, while they answer
        busy: set[str] = set()
        try:
            busy = await self.mirror.removed(name)
        finally:
            # NOTE: not done_with(): the idle ones are forgotten together (one message
            #   to each worker for an unregister-all).
            for region in fresh:
                if region.name not in busy:
                    region.uses -= 1
            self._forget([region for region in fresh if region.uses == 0])
            elsewhere = [region for region in fresh if region.name in busy]
            if elsewhere:
                task = asyncio.ensure_future(self._wait_elsewhere(elsewhere))
                self._waits.add(task)
                task.add_done_callback(self._waits.discard)

    async def _wait_elsewhere(self, regions: list[ClientRegion]) -> None:
        if self.mirror is None:
            return
        try:
            await self.mirror.idle([region.name for region in regions])
        except Exception:
            log.exception("shared memory: waiting for the other fronts' requests failed")
        finally:
            for region in regions:
                region.done_with()

    async def idle(self, names: Iterable[str]) -> None:
        """Return once none of the unregistered regions ``names`` is used here any more
        (what a primary asks of the other HTTP fronts with ``--http-workers``)."""
        for name in names:
            region = self._regions.get(name)
            if region is not None and region.pending:
                await region.idle()

    def _forget_one(self, region: ClientRegion) -> None:
        self._forget([region])

    def _forget(self, regions: list[ClientRegion]) -> None:
        """Drop unregistered regions no request uses; the workers unmap their objects."""
        gone = [region for region in regions if self._regions.get(region.name) is region]
        for region in gone:
            del self._regions[region.name]
        if gone and self.on_closed is not None:
            self.on_closed([region.ref for region in gone])

    def close(self) -> None:
        """At shutdown: forget every region (no request runs any more; nothing is open)."""
        self._regions.clear()
        for task in list(self._waits):
            task.cancel()

    # ---- inference ----------------------------------------------------------------

    def use(self, request: RegionRequest, where: str) -> RegionUse:
        """Hold the named region for one tensor of a request; 400 when it does not fit."""
        region = self._regions.get(request.region)
        if region is None:
            raise InvalidInput(f"{where}: Unable to find shared memory region: '{request.region}'")
        if request.offset + request.byte_size > region.byte_size:
            # Triton's three phrases (its clients and QA tests match them), then the numbers.
            end = request.offset + request.byte_size
            if request.offset >= region.byte_size:
                what = "Invalid offset for shared memory region"
            elif end >= 1 << 64:
                what = "Integer overflow detected: byte_size + offset passes 2**64 in region"
            else:
                what = "Invalid offset + byte size for shared memory region"
            raise InvalidInput(
                f"{where}: {what}: '{request.region}' (offset {request.offset} + byte size "
                f"{request.byte_size} > region size {region.byte_size})"
            )
        return RegionUse(region, request.offset, request.byte_size)
