"""The HTTP port's protocol hands a connection that opens with HTTP/2's preface to ``h2c``
(issue #39: gRPC on the HTTP port), whatever the reads' split, and parses everything else
as HTTP/1.1, a request whose first bytes look like the preface's ("P" of POST) included."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvicorn
from uvicorn.server import ServerState

from oipserve.front.http.h2c import H2_PREFACE
from oipserve.front.http.limits import ConnectionLimits
from oipserve.front.http.protocol import CorkedHttpToolsProtocol
from tests.support.transport import MemoryTransport

Handed = list[tuple[asyncio.Transport, bytes, float]]


async def _app(scope: dict, receive: Callable, send: Callable) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _feed(reads: list[bytes], h2c: bool = True) -> tuple[Handed, MemoryTransport, bool]:
    """Feed ``reads`` to a fresh connection; what was handed over, the transport, and
    whether the protocol is still among uvicorn's connections."""
    handed: Handed = []

    def take(transport: asyncio.Transport, data: bytes, since: float) -> None:
        handed.append((transport, data, since))

    async def main() -> tuple[MemoryTransport, bool]:
        protocol_class = CorkedHttpToolsProtocol.configured(
            ConnectionLimits(), 1024, take if h2c else None
        )
        config = uvicorn.Config(_app, http=protocol_class, lifespan="off", log_config=None)
        state = ServerState()
        protocol = protocol_class(config=config, server_state=state, app_state={})
        transport = MemoryTransport()
        protocol.connection_made(transport)
        for data in reads:
            protocol.data_received(data)
            for _ in range(5):
                await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*state.tasks), 5)
        kept = protocol in state.connections
        protocol.connection_lost(None)
        return transport, kept

    transport, kept = asyncio.run(main())
    return handed, transport, kept


def test_a_preface_in_pieces_is_handed_over_whole_with_what_follows() -> None:
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    pieces = [H2_PREFACE[:1], H2_PREFACE[1:5], H2_PREFACE[5:] + settings]
    handed, transport, kept = _feed(pieces)
    assert [data for _, data, _ in handed] == [H2_PREFACE + settings]
    assert handed[0][0] is transport  # the raw transport, not our corked proxy
    assert not kept  # uvicorn's shutdown no longer closes or waits for it
    assert b"".join(transport.written) == b""  # HTTP/1.1 wrote nothing


def test_http1_is_parsed_as_ever_even_when_it_begins_like_the_preface() -> None:
    request = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi"
    for reads in ([request], [request[:1], request[1:]], [b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"]):
        handed, transport, _ = _feed(reads)
        assert handed == []
        assert b"".join(transport.written).startswith(b"HTTP/1.1 200 "), reads


def test_without_h2c_the_preface_is_a_bad_request_as_before() -> None:
    handed, transport, _ = _feed([H2_PREFACE], h2c=False)
    assert handed == []
    assert b"".join(transport.written).startswith(b"HTTP/1.1 400 ")
