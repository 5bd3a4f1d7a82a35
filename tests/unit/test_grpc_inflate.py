"""A compressed gRPC message inflated up to the receive limit, and no further."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest

from oipserve.errors import InvalidInput, PayloadTooLarge
from oipserve.front.grpc.inflate import ENCODINGS, inflate

_COMPRESS = {"gzip": gzip.compress, "deflate": zlib.compress}


def test_the_encodings_a_call_may_use() -> None:
    assert ENCODINGS == {"identity", "gzip", "deflate"}


@pytest.mark.parametrize("encoding", sorted(_COMPRESS))
@pytest.mark.parametrize("size", [0, 1000, 3 * 1024 * 1024 + 7])
async def test_a_message_inflates_to_what_was_compressed(encoding: str, size: int) -> None:
    message = os.urandom(size // 2) + bytes(size - size // 2)
    inflated = await inflate(_COMPRESS[encoding](message), encoding, limit=size)
    assert bytes(inflated) == message


@pytest.mark.parametrize("size", [1000, 3 * 1024 * 1024])
async def test_one_byte_over_the_limit_is_refused(size: int) -> None:
    with pytest.raises(PayloadTooLarge, match=f"over {size - 1} once inflated"):
        await inflate(gzip.compress(bytes(size)), "gzip", limit=size - 1)


@pytest.mark.parametrize("encoding", sorted(_COMPRESS))
@pytest.mark.parametrize("after", [b"GARBAGE", "second"])
async def test_data_after_the_compressed_stream_is_refused(encoding: str, after: object) -> None:
    """One message is one stream: trailing bytes, or a second member, were ignored."""
    compress = _COMPRESS[encoding]
    tail = compress(b"more") if after == "second" else after
    assert isinstance(tail, bytes)
    with pytest.raises(InvalidInput, match="data after the end of the compressed stream"):
        await inflate(compress(b"request") + tail, encoding, limit=1024)
    big = os.urandom(2 * 1024 * 1024)  # inflated step by step (the other return)
    with pytest.raises(InvalidInput, match="data after the end of the compressed stream"):
        await inflate(compress(big) + tail, encoding, limit=4 * 1024 * 1024)


async def test_a_bomb_is_refused_once_past_the_limit() -> None:
    bomb = gzip.compress(bytes(256 * 1024 * 1024))
    with pytest.raises(PayloadTooLarge):
        await inflate(bomb, "gzip", limit=4 * 1024 * 1024)


@pytest.mark.parametrize(
    "data",
    [b"not compressed at all", gzip.compress(bytes(5 * 1024 * 1024))[:-64]],
    ids=["garbage", "truncated"],
)
async def test_what_does_not_inflate_is_invalid_input(data: bytes) -> None:
    with pytest.raises(InvalidInput, match="does not inflate"):
        await inflate(data, "gzip", limit=64 * 1024 * 1024)
