"""Shared-memory segments and the pool that reuses them.

Tensor bytes cross between the front and the workers only through POSIX
shared memory. A segment is created once, kept in a pool by size class and
reused for later requests, so the hot path makes no ``shm_open``/``unlink``
calls. Every segment name starts with ``oipserve-<front pid>-`` so that the
front can sweep all of them (its own and its workers') at shutdown, and so a
later start can remove what a killed server left behind.

We map ``/dev/shm`` files directly instead of using
``multiprocessing.shared_memory``: on Python 3.11 that class registers every
attach with a resource tracker shared by the spawned workers, which unlinks
segments at the wrong time.
"""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
from collections.abc import Callable
from typing import Final

from mypy_extensions import mypyc_attr

SHM_DIR: Final = "/dev/shm"
NAME_PREFIX: Final = "oipserve-"

#: Smallest segment handed out; tiny requests all share this class.
MIN_SEGMENT: Final = 64 * 1024
#: Alignment of tensors placed inside one segment (cache line, and enough for any dtype).
ALIGNMENT: Final = 64


def owner_prefix(front_pid: int) -> str:
    return f"{NAME_PREFIX}{front_pid}-"


def align(offset: int) -> int:
    return (offset + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


def layout(sizes: list[int]) -> tuple[list[int], int]:
    """Aligned offsets for tensors packed one after another in one segment, and the
    segment's size (at least 1 byte: zero-element tensors still need a segment)."""
    offsets = []
    pos = 0
    for size in sizes:
        offsets.append(pos)
        pos = align(pos + size)
    return offsets, max(pos, 1)


class Segment:
    """One POSIX shared-memory object mapped into this process."""

    __slots__ = ("name", "size", "_mmap", "buf")

    def __init__(self, name: str, size: int, mapping: mmap.mmap) -> None:
        self.name = name
        self.size = size
        self._mmap = mapping
        self.buf = memoryview(mapping)

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            # NOTE: reserve the pages now. A sparse tmpfs file that later cannot
            #   grow (a small /dev/shm in a container) kills the writer with SIGBUS;
            #   fallocate turns that into an OSError here instead.
            os.posix_fallocate(fd, 0, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            _unlink(name)
            raise
        os.close(fd)
        return cls(name, size, mapping)

    @classmethod
    def attach(cls, name: str) -> Segment:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, mapping)

    def unlink(self) -> None:
        _unlink(self.name)

    def close(self) -> None:
        self.buf.release()
        try:
            self._mmap.close()
        except BufferError:
            # NOTE: numpy views made from this segment are still alive (a response
            #   still being sent); the mapping goes away when the last one does.
            pass


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def size_class(nbytes: int) -> int:
    """Round up to a size class: powers of two with four steps each (waste under 25%)."""
    if nbytes <= MIN_SEGMENT:
        return MIN_SEGMENT
    top = 1 << (nbytes - 1).bit_length()
    step = top // 8
    return -(-nbytes // step) * step


class Lease:
    """One segment lent out by a pool until ``release``."""

    __slots__ = ("segment", "pool")

    def __init__(self, segment: Segment, pool: BufferPool) -> None:
        self.segment = segment
        self.pool = pool

    @property
    def name(self) -> str:
        return self.segment.name

    @property
    def buf(self) -> memoryview:
        return self.segment.buf

    def release(self) -> None:
        self.pool.release(self)


#: Segments this large or larger are created in a thread by ``acquire_async``.
CREATE_IN_THREAD: Final = 4 * 1024 * 1024


#: Errors of a segment that ``/dev/shm`` has no room for (``posix_fallocate``).
NO_ROOM: Final = (errno.ENOSPC, errno.ENOMEM)


def idle_cap(shm_dir: str = SHM_DIR) -> int:
    """Idle bytes a pool keeps for reuse: 1 GiB, or an eighth of ``/dev/shm`` when that is
    smaller. Every front and worker has a pool: three pools keeping 1 GiB each filled a
    container's 2 GiB ``/dev/shm``, and new requests failed (found by fuzzing)."""
    try:
        stats = os.statvfs(shm_dir)
    except OSError:
        return 1 << 30
    return min(1 << 30, stats.f_blocks * stats.f_frsize // 8)


class BufferPool:
    """Segments by size class, created on demand and reused.

    ``on_drop`` hears the names of segments the pool unlinks (when it holds
    too many idle bytes), so that processes which attached them can let go. A segment
    ``/dev/shm`` has no room for is tried again once the pool's idle segments are gone
    (``NO_ROOM``: an OSError still, when that was not enough).
    """

    def __init__(
        self,
        prefix: str,
        *,
        max_idle_bytes: int | None = None,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        self._prefix = prefix
        self._counter = 0
        self._idle: dict[int, list[Segment]] = {}
        self._idle_bytes = 0
        self._max_idle_bytes = idle_cap() if max_idle_bytes is None else max_idle_bytes
        self._leased: dict[str, Segment] = {}
        self._on_drop = on_drop

    def acquire(self, nbytes: int) -> Lease:
        size = size_class(nbytes)
        idle = self._idle.get(size)
        if idle:
            segment = idle.pop()
            self._idle_bytes -= size
        else:
            self._counter += 1
            name = f"{self._prefix}{self._counter}"
            try:
                segment = Segment.create(name, size)
            except OSError as exc:
                if not self._made_room(exc):
                    raise
                segment = Segment.create(name, size)
        self._leased[segment.name] = segment
        return Lease(segment, self)

    async def acquire_async(self, nbytes: int) -> Lease:
        """``acquire`` for an event loop: a large new segment is created in a thread.

        Creating a segment reserves its pages (``posix_fallocate`` zeroes them): about
        25 ms per 100 MB, which would hold the loop. An idle segment of the size is
        taken at once, as ``acquire`` does.
        """
        size = size_class(nbytes)
        if size < CREATE_IN_THREAD or self._idle.get(size):
            return self.acquire(nbytes)
        self._counter += 1
        name = f"{self._prefix}{self._counter}"
        try:
            segment = await self._create_in_thread(name, size)
        except OSError as exc:
            if not self._made_room(exc):
                raise
            segment = await self._create_in_thread(name, size)
        self._leased[segment.name] = segment
        return Lease(segment, self)

    async def _create_in_thread(self, name: str, size: int) -> Segment:
        creating = asyncio.ensure_future(asyncio.to_thread(Segment.create, name, size))
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            # NOTE: the thread goes on; what it creates joins the idle segments.
            creating.add_done_callback(self._adopt)
            raise

    def _made_room(self, exc: OSError) -> bool:
        """Whether a segment's creation that failed with ``exc`` is worth trying again:
        ``/dev/shm`` had no room, and this pool's idle segments are now gone."""
        return exc.errno in NO_ROOM and self.drop_idle()

    def drop_idle(self) -> bool:
        """Unlink every idle segment (``/dev/shm`` is full); whether there was one."""
        idle, self._idle = self._idle, {}
        self._idle_bytes = 0
        for segments in idle.values():
            for segment in segments:
                self._drop(segment)
        return bool(idle)

    def _adopt(self, created: asyncio.Future[Segment]) -> None:
        if not created.cancelled() and created.exception() is None:
            segment = created.result()
            self._leased[segment.name] = segment
            self.release(Lease(segment, self))

    def release(self, lease: Lease) -> None:
        segment = self._leased.pop(lease.segment.name, None)
        if segment is None:
            return  # released twice; the first release won
        if self._idle_bytes + segment.size > self._max_idle_bytes:
            self._drop(segment)
            return
        self._idle.setdefault(segment.size, []).append(segment)
        self._idle_bytes += segment.size

    def release_by_name(self, name: str) -> None:
        segment = self._leased.get(name)
        if segment is not None:
            self.release(Lease(segment, self))

    @property
    def leased_count(self) -> int:
        return len(self._leased)

    @property
    def total_bytes(self) -> int:
        return self._idle_bytes + sum(s.size for s in self._leased.values())

    def _drop(self, segment: Segment) -> None:
        segment.unlink()
        segment.close()
        if self._on_drop is not None:
            self._on_drop(segment.name)

    def close(self) -> None:
        """Unlink every segment, idle or leased; the pool is unusable afterwards."""
        for segments in self._idle.values():
            for segment in segments:
                segment.unlink()
                segment.close()
        for segment in self._leased.values():
            segment.unlink()
            segment.close()
        self._idle.clear()
        self._leased.clear()
        self._idle_bytes = 0


# NOTE: compiled (mypyc), and extended by the workers' ``CheckedSegments``, which is not.
@mypyc_attr(allow_interpreted_subclasses=True)
class SegmentCache:
    """Segments of another process, attached once by name and kept mapped.

    With ``keep_up_to`` (the owner's pool's idle cap, ``idle_cap``: the same on both sides
    of one ``/dev/shm``), a larger segment is mapped for the use at hand only, not kept:
    its owner never keeps it idle (it unlinks it once it comes back), and its pages are
    freed only once no process maps it. Kept, the mapping held them until the owner's next
    word (a worker's output until its next reply, which never came while every request
    then failed for want of room: with a small ``/dev/shm`` every request after a large
    one got a 503; found by fuzzing). The mapping goes with the last view of it.
    """

    def __init__(self, keep_up_to: int | None = None) -> None:
        self._segments: dict[str, Segment] = {}
        self._keep_up_to = keep_up_to

    def get(self, name: str) -> Segment:
        segment = self._segments.get(name)
        if segment is None:
            segment = Segment.attach(name)
            keep_up_to = self._keep_up_to
            if keep_up_to is None or segment.size <= keep_up_to:
                self._segments[name] = segment
        return segment

    def forget(self, name: str) -> None:
        segment = self._segments.pop(name, None)
        if segment is not None:
            segment.close()

    def forget_prefix(self, prefix: str) -> None:
        for name in [n for n in self._segments if n.startswith(prefix)]:
            self.forget(name)

    def close(self) -> None:
        for segment in self._segments.values():
            segment.close()
        self._segments.clear()


def _segment_names() -> list[str]:
    try:
        return os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []


def sweep(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with ``prefix``; returns the names."""
    removed = [name for name in _segment_names() if name.startswith(prefix)]
    for name in removed:
        _unlink(name)
    return removed


def sweep_stale() -> list[str]:
    """Remove segments left by oipserve processes that no longer exist (kill -9)."""
    removed = []
    for name in _segment_names():
        if not name.startswith(NAME_PREFIX):
            continue
        pid_text = name[len(NAME_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and not process_alive(int(pid_text)):
            _unlink(name)
            removed.append(name)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts: it answers EPERM).

    Stale segments are those of owners no longer alive; a worker also asks it of its front.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
