"""When a socket between two fronts writes what it is sent (``scaleout.framed``): a replica's
requests together at the end of the loop's turn, the primary's answers each at once."""

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


def _opened(*, at_once: bool) -> tuple[FramedProtocol[int], _Transport]:
    protocol: FramedProtocol[int] = FramedProtocol(
        msgspec.msgpack.Decoder(int), lambda _: None, lambda: None, at_once=at_once
    )
    transport = _Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


def _messages(write: bytes) -> list[int]:
    return [msgspec.msgpack.decode(body) for body in FrameSplitter().feed(write)]


async def test_what_one_turn_sends_goes_in_one_write_at_its_end() -> None:
    protocol, transport = _opened(at_once=False)
    protocol.send(1)
    protocol.send(2)
    assert transport.writes == []
    await asyncio.sleep(0)
    assert [_messages(write) for write in transport.writes] == [[1, 2]]


async def test_at_once_each_message_is_written_as_it_is_sent() -> None:
    protocol, transport = _opened(at_once=True)
    protocol.send(1)
    assert [_messages(write) for write in transport.writes] == [[1]]
    protocol.send(2)
    assert [_messages(write) for write in transport.writes] == [[1], [2]]
    await asyncio.sleep(0)
    assert len(transport.writes) == 2  # nothing left for the turn's end
