"""gzip and deflate both ways (``rest/coding.py``): what is inflated or compressed, where.

A body inflates on the loop until its output reaches ``INFLATE_IN_THREAD``, then in a
thread, into fixed blocks; the limit and the end of the stream are enforced the same
way on both sides of that line. A large response is compressed in a thread a step at a
time, and the segment its parts are views of is released exactly once.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib

import numpy as np
import pytest

from oipserve.errors import InvalidInput, PayloadTooLarge
from oipserve.front.rest import coding
from oipserve.front.rest.accept_encoding import choose_encoding
from oipserve.front.rest.coding import BLOCK, INFLATE_IN_THREAD, STEP, Inflater, compress_stream

MiB = 1024 * 1024


def _text(size: int) -> bytes:
    """``size`` bytes of JSON-like text (compresses about 3:1, like numbers do)."""
    values = np.random.default_rng(size).random(size // 8 + 1)
    return ",".join(f"{value:.5f}" for value in values).encode()[:size]


def _inflate(body: bytes, encoding: str, limit: int, chunk: int) -> Inflater:
    async def run() -> Inflater:
        inflater = Inflater(encoding, limit)
        for start in range(0, len(body), chunk):
            await inflater.feed(body[start : start + chunk])
        return inflater

    return asyncio.run(run())


def _output(inflater: Inflater) -> bytes:
    return b"".join(bytes(part) for part in inflater.finish())


@pytest.mark.parametrize("size", [0, 1000, INFLATE_IN_THREAD - 1, 3 * BLOCK + 12345])
@pytest.mark.parametrize("chunk", [65_536, 1 << 30], ids=["64KiB-chunks", "one-chunk"])
def test_the_output_is_the_body(size: int, chunk: int) -> None:
    data = _text(size)
    for encoding, packed in [
        ("gzip", gzip.compress(data, 1)),
        ("deflate", zlib.compress(data)),
        ("deflate", zlib.compress(data)[2:-4]),  # raw deflate
    ]:
        assert _output(_inflate(packed, encoding, 1 << 30, chunk)) == data


def test_small_bodies_stay_on_the_loop_large_ones_go_to_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_loop: list[bool] = []
    step = Inflater._step

    def recording(self: Inflater, data: bytes | memoryview) -> bytes | memoryview | None:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return step(self, data)

    monkeypatch.setattr(Inflater, "_step", recording)
    small = _text(INFLATE_IN_THREAD // 2)
    _inflate(gzip.compress(small, 1), "gzip", 1 << 30, 65_536)
    assert on_loop and all(on_loop)
    on_loop.clear()
    large = _text(4 * INFLATE_IN_THREAD)
    _inflate(gzip.compress(large, 1), "gzip", 1 << 30, 65_536)
    # NOTE: the steps up to INFLATE_IN_THREAD of output run on the loop, the rest not.
    assert on_loop[0] and not on_loop[-1]
    assert on_loop.count(True) < len(on_loop) // 2


@pytest.mark.parametrize("limit", [INFLATE_IN_THREAD // 2, 5 * BLOCK + 7])
def test_a_bomb_is_refused_at_the_limit(limit: int) -> None:
    bomb = gzip.compress(bytes(8 * BLOCK), 9)
    inflater = Inflater("gzip", limit)

    async def run() -> None:
        await inflater.feed(bomb)

    with pytest.raises(PayloadTooLarge, match="larger than the limit"):
        asyncio.run(run())
    assert limit - STEP < inflater.size <= limit
    assert len(inflater._blocks) <= limit // BLOCK + 1


@pytest.mark.parametrize("size", [1000, 3 * INFLATE_IN_THREAD])
@pytest.mark.parametrize("after", [b"x", gzip.compress(b" ")], ids=["garbage", "second-member"])
@pytest.mark.parametrize("separate", [False, True], ids=["same-chunk", "next-chunk"])
def test_data_after_the_end_is_refused(size: int, after: bytes, separate: bool) -> None:
    packed = gzip.compress(_text(size), 1)

    async def run() -> None:
        inflater = Inflater("gzip", 1 << 30)
        if separate:
            await inflater.feed(packed)
            await inflater.feed(after)
        else:
            await inflater.feed(packed + after)

    with pytest.raises(InvalidInput, match="has data after its end"):
        asyncio.run(run())


@pytest.mark.parametrize("size", [1000, 3 * INFLATE_IN_THREAD])
def test_a_truncated_stream_is_refused(size: int) -> None:
    inflater = _inflate(gzip.compress(_text(size), 1)[:-6], "gzip", 1 << 30, 65_536)
    with pytest.raises(InvalidInput, match="truncated"):
        inflater.finish()


def _parts(size: int) -> list[bytes | memoryview]:
    text = _text(size)
    return [b'{"outputs": [', memoryview(text), np.arange(size // 4, dtype=np.float32).tobytes()]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [coding.COMPRESS_ON_LOOP_MAX + 1, 3 * coding.COMPRESS_STEP + 5])
def test_compress_stream_is_the_parts_released_once(encoding: str, size: int) -> None:
    parts = _parts(size)
    released: list[int] = []

    async def run() -> bytes:
        stream = compress_stream(parts, encoding, lambda: released.append(1))
        return b"".join([piece async for piece in stream])

    out = asyncio.run(run())
    decompress = gzip.decompress if encoding == "gzip" else zlib.decompress
    assert decompress(out) == b"".join(bytes(part) for part in parts)
    assert released == [1]


def test_compress_stream_abandoned_releases_once() -> None:
    parts = _parts(8 * coding.COMPRESS_STEP)
    released: list[int] = []

    async def run() -> None:
        stream = compress_stream(parts, "gzip", lambda: released.append(1))
        async for _ in stream:
            break
        assert released == []
        await stream.aclose()

    asyncio.run(run())
    assert released == [1]


def test_compress_stream_cancelled_in_a_step_releases_once_the_step_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread still reads the part: the release waits for it."""
    in_step = threading.Event()
    go_on = threading.Event()
    real = coding._compressor

    class Held:
        def __init__(self, encoding: str) -> None:
            self.inner = real(encoding)

        def compress(self, data: memoryview) -> bytes:
            in_step.set()
            go_on.wait(10)
            return self.inner.compress(data)

        def flush(self) -> bytes:
            return self.inner.flush()

    monkeypatch.setattr(coding, "_compressor", Held)
    released: list[int] = []

    async def run() -> None:
        done = asyncio.Event()

        def release() -> None:
            released.append(1)
            done.set()

        stream = compress_stream(_parts(coding.COMPRESS_STEP), "gzip", release)
        task = asyncio.ensure_future(stream.__anext__())
        assert await asyncio.to_thread(in_step.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert released == []  # the step is still running
        go_on.set()
        await asyncio.wait_for(done.wait(), 10)
        await stream.aclose()

    asyncio.run(run())
    assert released == [1]


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("gzip", "gzip"),
        ("gzip;q=0", "identity"),
        # q's name is case-insensitive and need not come first (RFC 9110, 12.4.2); both
        # were compressed all the same (found by fuzzing)
        ("GZIP;Q=0", "identity"),
        ("gzip;foo=1;q=0", "identity"),
        ("gzip; q=0.5, deflate;Q=0.8", "deflate"),
        ("deflate;q=abc, gzip", "gzip"),
        (None, "identity"),
    ],
)
def test_accept_encoding_by_quality(accept: str | None, chosen: str) -> None:
    assert choose_encoding(accept) == chosen
