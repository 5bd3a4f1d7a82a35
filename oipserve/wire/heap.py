"""Large heap blocks go back to the operating system when they are freed.

glibc serves big allocations with mmap only above a threshold that it raises by itself
(up to 32 MiB) each time such a block is freed; above that, freed blocks stay in the
heap and the process keeps the memory for good. A server that sometimes decodes a large
request (a JSON tensor, a big gRPC message, an image batch) would then keep its peak
forever (issue #18 measured 862 MB in the front). Fixing the threshold makes every
block from 1 MiB up its own mapping, unmapped on free; smaller blocks are unaffected.
The front calls this once at start. The workers do not: measured on tiny requests it
cost them 10-18 us a request (ONNX Runtime's per-run buffers became mmap/munmap pairs),
and what they keep after a large request is ONNX Runtime's own arena, which this does
not return anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["return_large_blocks_to_os"]

log = logging.getLogger("oipserve.heap")

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Blocks this large or larger are mmap'd, and unmapped when freed.
LARGE_BLOCK = 1 << 20


def return_large_blocks_to_os(threshold: int = LARGE_BLOCK) -> bool:
    """Set glibc's mmap and trim thresholds; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt to call
        log.debug("mallopt is not available; large blocks stay with the allocator")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 2 * threshold)
    )
