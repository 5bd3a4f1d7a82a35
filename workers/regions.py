"""Clients' shared-memory objects as a worker maps them (the system shared-memory extension).

The front registers a client's region and sends, per tensor, the object's name and
identity (``ObjectRef``: name, st_dev, st_ino) with an offset and a size; the worker
maps the object itself, once, and reads inputs from it and writes outputs into it in
place. Mappings are kept in a small LRU keyed by (st_dev, st_ino), so a client that
reuses one region for every request costs one ``mmap`` in all.

Before each use the object is looked up again by name (one ``stat``): an object that
was unlinked, replaced by another under the same name, or truncated below the tensor
is an error for that request (a ``RegionError``), never an access past its end,
which would kill the worker with SIGBUS. A client that shrinks its object *while* a
request is running can still do that (docs/shared-memory.md: the worker dies, the
request gets 503, the front starts a replacement).

``overlaps_an_input`` tells whether an output would be written over an input's bytes in
the same object: ONNX Runtime must not then write outputs into the region while inputs
are still being read from it (``workers.outputs``).
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from collections.abc import Iterable

from oipserve.wire.messages import ObjectRef, OutputTarget, TensorDesc
from oipserve.wire.shm import SHM_DIR

__all__ = ["RegionCache", "RegionError", "RegionRefusal", "overlaps_an_input"]

#: Mappings kept at most; the least recently used one is unmapped beyond that.
MAX_MAPPINGS = 32


class RegionError(Exception):
    """A client's region cannot be used for this request; the message says why."""


class RegionRefusal(RegionError):
    """A RegionError in Triton's core words, which the front puts the request's id before
    (kind REFUSED): BYTES data in the region that core's ValidateBytesInputs refuses."""


def overlaps_an_input(inputs: Iterable[TensorDesc], targets: Iterable[OutputTarget]) -> bool:
    """Whether some output's room (``offset``, ``nbytes``) overlaps some input's bytes in
    the same object.

    Objects are compared by identity (st_dev, st_ino), not by region name: two names
    registered over one object, or one object under two keys (a hard link), are one
    object. Ranges that only touch (one ends where the other begins) do not overlap.
    """
    spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for tensor in inputs:
        if tensor.region is not None and tensor.nbytes:
            key = (tensor.region.dev, tensor.region.ino)
            spans.setdefault(key, []).append((tensor.offset, tensor.offset + tensor.nbytes))
    if not spans:
        return False
    for target in targets:
        start, end = target.offset, target.offset + target.nbytes
        for first, last in spans.get((target.region.dev, target.region.ino), ()):
            if start < last and first < end:
                return True
    return False


class RegionCache:
    """Client objects mapped once, by identity, in least-recently-used order."""

    def __init__(self, limit: int = MAX_MAPPINGS) -> None:
        self._limit = limit
        self._maps: OrderedDict[tuple[int, int], mmap.mmap] = OrderedDict()

    def __len__(self) -> int:
        return len(self._maps)

    def view(self, ref: ObjectRef, offset: int, nbytes: int) -> memoryview:
        """``nbytes`` at ``offset`` of the object, checked against its current size."""
        path = os.path.join(SHM_DIR, ref.name)
        end = offset + nbytes
        try:
            info = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            raise RegionError(
                f"shared memory object '{ref.name}' no longer exists (the client removed it "
                "after registering the region)"
            ) from None
        if (info.st_dev, info.st_ino) != (ref.dev, ref.ino):
            raise RegionError(
                f"shared memory object '{ref.name}' is not the one registered (it was removed "
                "and created again); register the region again"
            )
        if info.st_size < end:
            raise RegionError(
                f"shared memory object '{ref.name}' has {info.st_size} bytes, fewer than the "
                f"{end} this tensor needs: it was truncated after the region was registered"
            )
        if nbytes == 0:
            return memoryview(b"")
        key = (ref.dev, ref.ino)
        mapping = self._maps.get(key)
        if mapping is not None and len(mapping) >= end:
            self._maps.move_to_end(key)
        else:
            if mapping is not None:
                self._unmap(key)
            mapping = self._map(path, ref, end)
            self._maps[key] = mapping
            while len(self._maps) > self._limit:
                self._unmap(next(iter(self._maps)))
        return memoryview(mapping)[offset:end]

    def _map(self, path: str, ref: ObjectRef, end: int) -> mmap.mmap:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise RegionError(
                f"cannot open shared memory object '{ref.name}': {exc.strerror}"
            ) from None
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != (ref.dev, ref.ino) or info.st_size < end:
                raise RegionError(f"shared memory object '{ref.name}' changed while opening it")
            return mmap.mmap(fd, info.st_size)
        finally:
            os.close(fd)

    def _unmap(self, key: tuple[int, int]) -> None:
        mapping = self._maps.pop(key, None)
        if mapping is None:
            return
        try:
            mapping.close()
        except BufferError:
            # NOTE: a view is still alive (an ONNX Runtime value being dropped); the
            #   mapping goes away with the last one.
            pass

    def forget(self, objects: list[ObjectRef]) -> None:
        """The front unregistered regions of these objects: unmap them."""
        for ref in objects:
            self._unmap((ref.dev, ref.ino))

    def close(self) -> None:
        for key in list(self._maps):
            self._unmap(key)
