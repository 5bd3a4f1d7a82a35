"""HTTP content coding of request and response bodies: gzip and deflate, both ways.

Kept apart from body reading and rendering because both use it and neither is
about it: a body is decompressed as it is read, a response compressed after it
is rendered.

Decompression is the one place where a small request costs much more than its
size (a 1 MiB gzip body can inflate to 1 GiB), so ``Inflater`` bounds it three
ways: the output is produced ``STEP`` bytes at a time and refused (413) as soon
as it passes the limit, never inflated further; the event loop is not held
meanwhile; and whatever follows the end of the compressed stream is refused
(400), not silently dropped.

WHERE the zlib work runs: a small body (until its output reaches
``INFLATE_IN_THREAD``) on the loop, a step at a time, the loop given back between
steps; a small response (up to ``COMPRESS_ON_LOOP_MAX``) on the loop at once;
anything larger in a thread (``off_loop.in_thread``), where zlib lets go of the
GIL while it works. Steps on the loop were cheap on a quiet machine (256 KiB
inflated in ~0.5 ms, 64 KiB compressed in ~3 ms), but their cost is the machine's:
on a slower, shared 2-core one a 64 KiB compression step took ~6 ms, and a probe
request needs a few loop turns, each waiting for one step of every large body in
flight, so it waited 25-30 ms. In a thread no step is the loop's.
"""

from __future__ import annotations

import asyncio
import mmap
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial

from oipserve.errors import InvalidInput, PayloadTooLarge
from oipserve.runtime.off_loop import copy_into, in_thread, nothing_to_release

#: Bytes of output inflated per step (one zlib call): the most inflated past the limit
#: before a bomb is refused, and on the loop the work between two turns (~0.5 ms).
STEP = 256 * 1024
#: Bytes of compressed input handed to zlib at a time: zlib keeps what a step did
#: not consume as a new ``bytes`` (``unconsumed_tail``), so a large input would
#: otherwise be copied once per step.
INPUT_SLICE = 64 * 1024
#: Once a body has inflated to this many bytes, the rest of it is inflated in a thread,
#: each chunk as it arrives in one trip: bodies smaller than this never leave the loop.
INFLATE_IN_THREAD = 1024 * 1024
#: Full steps inflated per trip to a thread (at most 4 MiB of output): a bomb's chunk
#: does not keep a thread of the shared pool for long.
TRIP_STEPS = 16
#: Bytes of each block the output past ``INFLATE_IN_THREAD`` is gathered in. Fixed
#: blocks, never regrown: a growing bytearray is copied whole when realloc cannot
#: extend it (up to ~28 ms per step at 80 MB here, holding the GIL, so the loop would
#: wait for it even from a thread). Each block is an anonymous mapping of its own, not
#: heap: the blocks are filled in the thread pool, and malloc serves each thread from an
#: arena of its own that keeps what is freed. Heap blocks made every refused gzip bomb
#: leave ~256 MiB resident for good (issue #35: 326 -> 585 -> 842 MB); a mapping goes
#: back to the system when it is closed (``discard``, ``release_blocks``).
BLOCK = 4 * 1024 * 1024


class Inflater:
    """Inflates one gzip or deflate body as its chunks arrive, bounded by ``limit``."""

    __slots__ = ("encoding", "limit", "size", "_head", "_blocks", "_fill", "_zlib")

    def __init__(self, encoding: str, limit: int) -> None:
        if encoding not in ("gzip", "deflate"):
            raise ValueError(f"not a compressed encoding: {encoding}")
        self.encoding = encoding
        self.limit = limit
        #: Bytes of output so far.
        self.size = 0
        #: The output up to ``INFLATE_IN_THREAD`` (and the step that passed it).
        self._head = bytearray()
        #: The output after ``_head``, ``BLOCK`` bytes a block, the last filled to ``_fill``.
        self._blocks: list[mmap.mmap] = []
        self._fill = BLOCK
        self._zlib: zlib._Decompress | None = None

    async def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Inflate ``data``; 413 as soon as the output passes the limit.

        On the loop while the output is under ``INFLATE_IN_THREAD``, the loop given
        back after each full step; from there on in a thread, ``TRIP_STEPS`` full steps
        a trip (a whole chunk of ordinary data is one trip).
        """
        try:
            await self._feed(memoryview(data))
        except BaseException:
            self.discard()
            raise

    async def _feed(self, view: memoryview) -> None:
        steps = self._steps(view)
        while True:
            if self.size < INFLATE_IN_THREAD:
                more = _take(steps, 1)
            else:
                # NOTE: nothing to release: a request gone meanwhile drops the
                #   Inflater once the thread is done with it.
                more = await in_thread(
                    partial(_take, steps, TRIP_STEPS), nothing_to_release, after_success=False
                )
            if not more:
                return
            if self.size < INFLATE_IN_THREAD:
                await asyncio.sleep(0)  # give the loop back between steps

    def finish(self) -> list[bytes | bytearray | memoryview]:
        """The whole output, in order, in one part or more; 400 if the stream did not end."""
        if self._zlib is None or not self._zlib.eof:
            raise InvalidInput(f"the {self.encoding} request body is truncated")
        parts: list[bytes | bytearray | memoryview] = [self._head]
        parts += [memoryview(block) for block in self._blocks]
        if self._blocks:
            parts[-1] = parts[-1][: self._fill]
        self._blocks = []  # NOTE: now the caller's, to hand to ``release_blocks``
        return parts

    def discard(self) -> None:
        """Give the output's memory back now (a refused or abandoned body).

        The blocks are unmapped in a thread: unmapping 256 MiB of touched pages takes
        tens of milliseconds, which the loop would otherwise wait for.
        """
        blocks, self._blocks = self._blocks, []
        self._head = bytearray()
        if blocks:
            asyncio.get_running_loop().run_in_executor(None, _close_all, blocks)

    def _steps(self, view: memoryview) -> Iterator[bool]:
        """Inflates ``view`` a step at a time, pausing (yielding) after each full step."""
        for start in range(0, len(view), INPUT_SLICE):
            pending: bytes | memoryview | None = view[start : start + INPUT_SLICE]
            while pending is not None:
                pending = self._step(pending)
                if pending is not None:
                    yield True

    def _step(self, data: bytes | memoryview) -> bytes | memoryview | None:
        """Inflate up to ``STEP`` bytes from ``data``; the input left to inflate after
        this step (perhaps empty, with output still inside zlib), None when there is none."""
        decompressor = self._decompressor(data)
        if decompressor.eof:
            if data:
                raise InvalidInput(
                    f"the {self.encoding} request body has data after its end"
                    " (trailing bytes or a second gzip member)"
                )
            return None
        try:
            piece = decompressor.decompress(data, STEP)
        except zlib.error as exc:
            raise InvalidInput(
                f"the {self.encoding} request body cannot be decompressed: {exc}"
            ) from None
        self._keep(piece)
        if len(piece) == STEP:  # a full step: more may be pending inside zlib
            return decompressor.unused_data if decompressor.eof else decompressor.unconsumed_tail
        # NOTE: zlib stops short of ``STEP`` only when its input is used up or the stream
        #   ended; what follows the end is refused by the next step.
        return (decompressor.unused_data or None) if decompressor.eof else None

    def _keep(self, piece: bytes) -> None:
        """Add ``piece`` to the output; 413 if it takes the output past the limit."""
        if self.size + len(piece) > self.limit:
            raise PayloadTooLarge(
                f"the decompressed body is larger than the limit of {self.limit} bytes"
            )
        if self.size < INFLATE_IN_THREAD:
            self._head += piece  # (grows in place, without joins)
        else:
            self._into_blocks(memoryview(piece))
        self.size += len(piece)

    def _into_blocks(self, piece: memoryview) -> None:
        while piece:
            if self._fill == BLOCK:
                # NOTE: a fresh mapping's pages are zero-filled by the kernel as they are
                #   first written: nothing zeroes them ahead.
                self._blocks.append(mmap.mmap(-1, BLOCK))
                self._fill = 0
            size = min(len(piece), BLOCK - self._fill)
            copy_into(memoryview(self._blocks[-1]), self._fill, size, piece[:size])
            self._fill += size
            piece = piece[size:]

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


def release_blocks(parts: list[bytes | bytearray | memoryview]) -> None:
    """Unmap the blocks among an inflated body's ``parts`` (``Inflater.finish``), once
    they are copied; call it off the loop (see ``Inflater.discard``). Other parts are
    left alone; ``parts`` must not be used afterwards."""
    for part in parts:
        if isinstance(part, memoryview) and isinstance(part.obj, mmap.mmap):
            block = part.obj
            part.release()
            _close(block)


def _close_all(blocks: list[mmap.mmap]) -> None:
    for block in blocks:
        _close(block)


def _close(block: mmap.mmap) -> None:
    try:
        block.close()
    except BufferError:
        pass  # still viewed somewhere: unmapped with the last view


def _take(steps: Iterator[bool], count: int) -> bool:
    """Run ``steps`` to its ``count``-th pause; False once it has run to its end."""
    return all(next(steps, False) for _ in range(count))


#: Responses of this many bytes or fewer are compressed on the loop, at once: about
#: 0.5 ms of zlib at level 6 on JSON text on a quiet machine, 1.5 ms on a slow shared one.
#: Larger ones go through ``compress_stream``.
COMPRESS_ON_LOOP_MAX = 16 * 1024
#: Bytes of input compressed per trip to a thread (~20 ms of zlib on JSON text at the
#: ~12 MB/s of a slow 2-core machine; a trip costs the loop ~0.1 ms).
COMPRESS_STEP = 256 * 1024


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
    """``parts`` as one compressed stream, ``COMPRESS_STEP`` bytes of input at a time,
    each step in a thread (zlib lets go of the GIL while it compresses).

    For large responses: compressing 10 MB of JSON at once held the event loop for half
    a second, and 64 KiB steps on the loop still held it 5-6 ms each on a slow machine.
    ``done`` is called once every part has been read (the worker's segment they are
    views of can then be released): after the last step, or, when the stream is
    abandoned during a step, once that step's thread has finished with the part.
    """
    compressor = _compressor(encoding)
    released = False
    try:
        for part in parts:
            view = memoryview(part)
            for start in range(0, len(view), COMPRESS_STEP):
                step = partial(compressor.compress, view[start : start + COMPRESS_STEP])
                try:
                    out = await in_thread(step, done, after_success=False)
                except BaseException:
                    released = True  # by in_thread, once the thread is done
                    raise
                if out:
                    yield out
    finally:
        if not released:
            done()
    yield compressor.flush()
