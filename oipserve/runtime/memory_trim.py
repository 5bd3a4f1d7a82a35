"""Giving freed heap memory back to the system after large, short-lived allocations.

Why: glibc's malloc keeps freed memory inside its arenas unless it lies at the
top of a heap. grpc's core inflates a compressed message into many small slices
on its own threads; when the message is refused (too large) they are all freed,
but the pages stay resident. Measured: each refused 64 MiB-inflated message left
the front ~65 MiB larger, for good. ``malloc_trim(0)`` returns such free pages
from every arena (``madvise``), which brings RSS back to idle.

``MemoryTrimmer`` checks the front's anonymous RSS once a second (one read of
``/proc/self/status``, microseconds) and trims only when it has grown by
``GROWTH`` since the last trim, in a thread (a trim can take milliseconds on a
large heap and takes malloc's locks: better not on the event loop). Never per
request. A trim that finds the growth still in use is retried with back-off (1 to 16 s)
before that level counts as live memory. Without glibc (``malloc_trim`` missing) it does
nothing.

``return_large_blocks_to_os`` (called once at start) fixes glibc's mmap threshold: glibc
serves big allocations with mmap only above a threshold that it raises by itself (up to
32 MiB) each time such a block is freed, so a front that once decoded a large request (a
JSON tensor) kept its peak heap for good (issue #18 measured 862 MB). Fixed, every block
from 8 MiB up is its own mapping, unmapped on free; smaller freed blocks stay in the heap
for the next requests, and the trimmer returns them once the heap has grown by ``GROWTH``.
PERF: at 1 MiB every 1 MiB gRPC message (the request's bytes, the response, grpc's copy
of it) was a fresh mapping that faulted in page by page (about 600 faults a call): the
1 MiB gRPC row ran 1.5x faster and at 0.42x the front's CPU a call with 8 MiB.

The workers do not call it: on tiny requests it cost them 10-18 us each (ONNX Runtime's
per-run buffers became mmap/munmap pairs), and what they keep after a large request is
ONNX Runtime's own arena anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
from _ctypes import CFuncPtr  # the type of a C function (ctypes keeps its name private)
from collections.abc import Callable

from oipserve.errors import InternalError

log = logging.getLogger("oipserve")

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Blocks this large or larger are mmap'd, and unmapped when freed.
LARGE_BLOCK = 1 << 23


def _glibc(function: str) -> CFuncPtr | None:
    """A glibc allocator function, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)[function]
    except (OSError, AttributeError):
        return None


def return_large_blocks_to_os(threshold: int = LARGE_BLOCK) -> bool:
    """Set glibc's mmap and trim thresholds; False where the C library is not glibc."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        log.debug("mallopt is not available; large blocks stay with the allocator")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 2 * threshold)
    )


#: Anonymous RSS growth since the last trim that triggers the next one.
GROWTH = 32 * 1024 * 1024
#: Seconds between two looks at the RSS.
INTERVAL = 1.0
#: Trims in a row that may find the growth still there before it counts as live memory.
RETRIES = 5


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    function = _glibc("malloc_trim")
    if function is None:
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


def anonymous_rss() -> int:
    """This process's resident anonymous memory in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MemoryTrimmer:
    """A background task that trims malloc's arenas after the front's heap has grown."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._trim is not None and anonymous_rss():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        trim = self._trim
        if trim is None:  # start() runs this only with malloc_trim found
            raise InternalError("the memory trimmer runs without malloc_trim")
        baseline = anonymous_rss()
        kept = 0  # trims in a row that left the heap GROWTH above the baseline
        while True:
            # Backing off while the growth survives trims: 1, 2, 4, 8, 16 s.
            await asyncio.sleep(INTERVAL * (1 << kept))
            rss = anonymous_rss()
            if rss < baseline:
                baseline, kept = rss, 0  # memory went back by itself: grow from here
            elif rss - baseline >= GROWTH:
                await asyncio.to_thread(trim, 0)
                after = anonymous_rss()
                log.debug("trimmed the heap: %d MiB -> %d MiB", rss >> 20, after >> 20)
                # NOTE: a trim that finds the memory still in use (a message being inflated
                #   right then, or a refused call grpc has not freed yet) gives nothing
                #   back; taking that level as the new baseline left the freed pages for
                #   good. The growth becomes the baseline only after it survived RETRIES
                #   trims over half a minute: then it is live memory.
                kept = kept + 1 if after - baseline >= GROWTH else 0
                if kept == 0 or kept >= RETRIES:
                    baseline, kept = after, 0
            else:
                kept = 0
