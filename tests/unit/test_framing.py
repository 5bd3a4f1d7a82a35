"""The frames between processes (``wire.framing``): ``frame_into`` writes what ``frame``
makes, and ``FrameSplitter`` gives back every body however the stream is cut."""

from __future__ import annotations

import msgspec
import pytest

from oipserve.wire.framing import FrameSplitter, frame, frame_into

_ENCODER = msgspec.msgpack.Encoder()
#: Bodies of 0 to ~70,000 bytes (lengths that need one to three bytes of the prefix).
_MESSAGES = [{"n": i, "text": "x" * (i * i * 7 % 70_001)} for i in range(40)]


def _stream() -> bytes:
    out = bytearray(b"kept")
    for message in _MESSAGES:
        frame_into(_ENCODER, message, out)
    return bytes(out[4:])


def test_frame_into_adds_what_frame_makes() -> None:
    assert _stream() == b"".join(frame(_ENCODER, m) for m in _MESSAGES)


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 1000, 65_536, 1 << 20])
def test_every_body_comes_back_however_the_stream_is_cut(cut: int) -> None:
    stream, splitter, bodies = _stream(), FrameSplitter(), []
    for start in range(0, len(stream), cut):
        bodies += splitter.feed(stream[start : start + cut])
    assert [msgspec.msgpack.decode(body) for body in bodies] == _MESSAGES
    assert splitter.feed(b"") == []
