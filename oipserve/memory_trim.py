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
request. Without glibc (``malloc_trim`` missing) it does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("oipserve")

#: Anonymous RSS growth since the last trim that triggers the next one.
GROWTH = 32 * 1024 * 1024
#: Seconds between two looks at the RSS.
INTERVAL = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


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
        assert trim is not None
        baseline = anonymous_rss()
        while True:
            await asyncio.sleep(INTERVAL)
            rss = anonymous_rss()
            if rss < baseline:
                baseline = rss  # memory went back by itself: grow from here
            elif rss - baseline >= GROWTH:
                await asyncio.to_thread(trim, 0)
                baseline = anonymous_rss()
                log.debug("trimmed the heap: %d MiB -> %d MiB", rss >> 20, baseline >> 20)
