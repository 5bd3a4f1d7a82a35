"""Giving the heap a session leaves back to the system, once, after an unload or a failed load.

Why: an ONNX Runtime session's initializers, graph and kernels are many malloc blocks on
glibc's arenas. Freed by an unload they stay resident (glibc returns only the top of a heap):
measured, 30 load/unload cycles of a model with 16 MiB of weights left a worker at 132 MiB
against 98 after the first cycle, and 100 cycles of one with 4 MiB at 103 against 91
(``benchmarks/load_unload_memory.py``, ``tests/e2e/test_memory_after_unload.py``). The
session itself is freed; its pages are not. ``malloc_trim(0)`` returns every arena's free
pages (``madvise``); with it a worker stays within 1 MiB of where it was after the first cycle.

Only after an unload or a failed load, never per request: on tiny requests a worker that
returns memory eagerly pays for it on the next ones (see ``oipserve.runtime.memory_trim``,
the front's own trimmer, which the workers do not run). A trim of a worker's heap took 1 to 2
ms here; the worker answers the unload after it. Without glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


_TRIM = _malloc_trim()


def return_free_heap() -> None:
    """Return the free pages of every malloc arena to the system (nothing without glibc)."""
    if _TRIM is not None:
        _TRIM(0)
