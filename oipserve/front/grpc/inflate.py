"""A compressed gRPC message inflated off the loop, bounded by the receive limit.

A client may compress its messages (``grpc-encoding: gzip`` or ``deflate``). A message
is inflated in a thread (zlib lets go of the GIL), and never past the limit a plain
message has: a small message that inflates to gigabytes (a "zip bomb") is refused once
its output passes the limit, having cost at most that much memory.
"""

from __future__ import annotations

import asyncio
import mmap
import zlib

from oipserve.errors import InvalidInput, PayloadTooLarge

__all__ = ["ENCODINGS", "inflate"]

#: zlib's window bits for each compressed ``grpc-encoding`` this server reads.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
#: The ``grpc-encoding`` values a call may use.
ENCODINGS = frozenset(("identity", *_WBITS))
#: Output of inflating a message taken at a time.
_INFLATE_STEP = 1024 * 1024


async def inflate(data: bytes | memoryview, encoding: str, limit: int) -> bytes | memoryview:
    """``data`` (compressed with ``encoding``) inflated in a thread, up to ``limit`` bytes.

    A message that inflates to more than ``_INFLATE_STEP`` is inflated step by step into
    anonymous memory (no step's output is held twice, and the memory goes back to the
    system once freed), so a refused bomb costs at most the limit. Raises
    ``PayloadTooLarge`` past the limit, ``InvalidInput`` for data that does not inflate.
    """
    inflater = zlib.decompressobj(_WBITS[encoding])

    def run() -> bytes | memoryview:
        first = inflater.decompress(data, _INFLATE_STEP)
        if inflater.eof and len(first) <= limit:
            _check_nothing_after(inflater)
            return first
        memory = memoryview(mmap.mmap(-1, limit))
        filled = 0
        chunk = first
        while True:
            if filled + len(chunk) > limit:
                memory.release()
                raise PayloadTooLarge(
                    f"Received message larger than max (over {limit} once inflated)"
                )
            memory[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            if inflater.eof:
                _check_nothing_after(inflater)
                return memory[:filled]
            tail = inflater.unconsumed_tail
            if not chunk and not tail:
                raise zlib.error("a truncated compressed message")
            chunk = inflater.decompress(tail, _INFLATE_STEP)

    try:
        return await asyncio.to_thread(run)
    except zlib.error as exc:
        raise InvalidInput(f"the message does not inflate: {exc}") from None


def _check_nothing_after(inflater: zlib._Decompress) -> None:
    """zlib.error for bytes after the end of the compressed stream (trailing bytes, a
    second gzip member): one message is one stream, as REST's bodies are (found by
    fuzzing: they were ignored)."""
    if inflater.unused_data:
        raise zlib.error("data after the end of the compressed stream")
