"""HTTP content coding of request and response bodies: gzip and deflate, both ways.

Kept apart from body reading and rendering because both use it and neither is
about it: a body is decompressed as it is read, a response compressed after it
is rendered.

Decompression is the one place where a small request costs much more than its
size (a 1 MiB gzip body can inflate to 1 GiB), so ``Inflater`` bounds it three
ways: the output is produced ``STEP`` bytes at a time and refused (413) as soon
as it passes the limit, never inflated further; the event loop is given back
between steps, so other requests go on while a large body inflates; and
whatever follows the end of the compressed stream is refused (400), not
silently dropped.

WHY slices on the loop rather than a thread pool: one step is well under a
millisecond, so a request waiting behind a bomb waits at most that long per
bomb in flight, with no thread, no hand-off and no lock; a thread pool would
need its own bound and on a small machine would take the core from the loop
anyway (zlib releases the GIL, but the cores are shared). Bodies that inflate
to less than ``STEP`` never yield at all.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable

from oipserve.errors import InvalidInput, PayloadTooLarge

#: Bytes of output inflated before the event loop is given back (~0.5 ms of zlib).
STEP = 256 * 1024
#: Bytes of compressed input handed to zlib at a time: zlib keeps what a step did
#: not consume as a new ``bytes`` (``unconsumed_tail``), so a large input would
#: otherwise be copied once per step.
INPUT_SLICE = 64 * 1024


class Inflater:
    """Inflates one gzip or deflate body as its chunks arrive, bounded by ``limit``."""

    __slots__ = ("encoding", "limit", "out", "_zlib")

    def __init__(self, encoding: str, limit: int) -> None:
        if encoding not in ("gzip", "deflate"):
            raise ValueError(f"not a compressed encoding: {encoding}")
        self.encoding = encoding
        self.limit = limit
        #: The output so far; a bytearray so that it grows in place, without joins.
        self.out = bytearray()
        self._zlib: zlib._Decompress | None = None

    async def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Inflate ``data``, yielding to the loop between steps; 413 past the limit."""
        view = memoryview(data)
        for start in range(0, len(view), INPUT_SLICE):
            chunk: bytes | memoryview = view[start : start + INPUT_SLICE]
            decompressor = self._decompressor(chunk)
            while True:
                if decompressor.eof:
                    if chunk:
                        raise InvalidInput(
                            f"the {self.encoding} request body has data after its end"
                            " (trailing bytes or a second gzip member)"
                        )
                    break
                try:
                    piece = decompressor.decompress(chunk, STEP)
                except zlib.error as exc:
                    raise InvalidInput(
                        f"the {self.encoding} request body cannot be decompressed: {exc}"
                    ) from None
                if len(self.out) + len(piece) > self.limit:
                    raise PayloadTooLarge(
                        f"the decompressed body is larger than the limit of {self.limit} bytes"
                    )
                self.out += piece
                if len(piece) < STEP:
                    # NOTE: zlib stops short of ``STEP`` only when its input is used up
                    #   or the stream ended; what follows the end is refused above.
                    if not decompressor.eof:
                        break
                    chunk = decompressor.unused_data
                    continue
                # A full step: more may be pending inside zlib even with no input left.
                chunk = (
                    decompressor.unused_data if decompressor.eof else decompressor.unconsumed_tail
                )
                await asyncio.sleep(0)  # give the loop back between steps

    def finish(self) -> bytearray:
        """The whole output; 400 if the compressed stream did not end."""
        if self._zlib is None or not self._zlib.eof:
            raise InvalidInput(f"the {self.encoding} request body is truncated")
        return self.out

    def _decompressor(self, first: bytes | memoryview) -> zlib._Decompress:
        if self._zlib is None:
            if self.encoding == "gzip":
                wbits = 16 + zlib.MAX_WBITS
            elif bytes(first[:1]) == b"\x78":
                wbits = zlib.MAX_WBITS  # zlib-wrapped, as RFC 9110 says
            else:
                wbits = -zlib.MAX_WBITS  # raw deflate, as browsers sometimes send
            self._zlib = zlib.decompressobj(wbits)
        return self._zlib


def choose_encoding(accept: str | None) -> str:
    """Pick gzip, deflate or identity from Accept-Encoding by q-value (first wins ties)."""
    if not accept:
        return "identity"
    best, best_q = "identity", 0.0
    for item in accept.split(","):
        name, _, params = item.strip().partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate", "identity"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        if q > best_q:
            best, best_q = name, q
    return best


#: Bytes of input compressed before the event loop is given back: about 3 ms of zlib at
#: level 6 on JSON text (20 MB/s here), 2 ms on binary tensors.
COMPRESS_STEP = 64 * 1024


def _compressor(encoding: str) -> zlib._Compress:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    return zlib.compressobj(6, zlib.DEFLATED, wbits)


def compress(parts: list[bytes | memoryview], encoding: str) -> bytes:
    """``parts``, in order, as one gzip or zlib-wrapped deflate stream (small responses)."""
    compressor = _compressor(encoding)
    out = [compressor.compress(part) for part in parts]
    out.append(compressor.flush())
    return b"".join(out)


async def compress_stream(
    parts: list[bytes | memoryview], encoding: str, done: Callable[[], None]
) -> AsyncIterator[bytes]:
    """``parts`` as one compressed stream, ``COMPRESS_STEP`` bytes of input at a time.

    For large responses: compressing 10 MB of JSON at once held the event loop for half
    a second. The loop is given back between steps; ``done`` is called once every part
    has been read (the worker's segment they are views of can then be released).
    """
    compressor = _compressor(encoding)
    try:
        for part in parts:
            view = memoryview(part)
            for start in range(0, len(view), COMPRESS_STEP):
                out = compressor.compress(view[start : start + COMPRESS_STEP])
                if out:
                    yield out
                await asyncio.sleep(0)
    finally:
        done()
    yield compressor.flush()
