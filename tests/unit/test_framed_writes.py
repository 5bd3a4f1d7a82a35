"""When a socket between two fronts writes what it is sent (``scaleout.framed``): what one
turn sends together, at the turn's end or at an earlier flush (the primary's
answers of a batch, flushed by its batcher)."""

from __future__ import annotations

import asyncio

import msgspec

from oipserve.scaleout.framed import FramedProtocol
from oipserve.wire.framing import FrameSplitter


class _Transport:
    """The writes a protocol makes, each kept whole."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False


def _opened() -> tuple[FramedProtocol[int], _Transport]:
    protocol: FramedProtocol[int] = FramedProtocol(
        msgspec.msgpack.Decoder(int), lambda _: None, lambda: None
    )
    transport = _Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


def _messages(write: bytes) -> list[int]:
    return [msgspec.msgpack.decode(body) for body in FrameSplitter().feed(write)]


async def test_what_one_turn_sends_goes_in_one_write_at_its_end() -> None:
    protocol, transport = _opened()
    protocol.send(1)
    protocol.send(2)
    assert transport.writes == []
    await asyncio.sleep(0)
    assert [_messages(write) for write in transport.writes] == [[1, 2]]


async def test_a_flush_writes_what_was_sent_at_once_in_one_write() -> None:
    """The primary's answers of one batch (``batch_desk``): written when the batcher flushes,
    before the turn's end; what is sent after goes at the turn's end."""
    protocol, transport = _opened()
    protocol.send(1)
    protocol.send(2)
    protocol.flush()
    assert [_messages(write) for write in transport.writes] == [[1, 2]]
    protocol.flush()  # nothing left: no write
    protocol.send(3)
    assert len(transport.writes) == 1
    await asyncio.sleep(0)
    assert [_messages(write) for write in transport.writes] == [[1, 2], [3]]
