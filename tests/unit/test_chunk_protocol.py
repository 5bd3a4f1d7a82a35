"""CorkedHttpToolsProtocol places the chunk framing wherever the reads split it.

The protocol starts following a chunked body at the end of the read that completed its head,
from the parser's events. Here a request is fed to the real protocol (in memory, with the
transport of ``test_framework_internals``) in two reads split at every byte: a body under the
limit always reaches the application whole, one that declares past it is always refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from oipserve.front.http.extensions import BODY_REFUSED
from oipserve.front.http.limits import ConnectionLimits
from oipserve.front.http.protocol import CorkedHttpToolsProtocol
from tests.support.transport import MemoryTransport, connected

LIMIT = 1000
HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
UNDER = b"5;a=b\r\nhello\r\n0A\r\n0123456789\r\n0\r\nx-t: 1\r\n\r\n"
# 5 + 990 declared: at the limit; then 6 more: past it, before their data
OVER = b"5\r\nhello\r\n3DE\r\n" + b"x" * 990 + b"\r\n6\r\n"


def run(reads: list[bytes]) -> tuple[MemoryTransport, list[dict], dict]:
    """Feed ``reads`` to the protocol, letting the application run between them."""
    received: list[dict] = []
    scopes: list[dict] = []

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        scopes.append(scope)
        while True:
            message = await receive()
            received.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        if message["type"] == "http.request":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> MemoryTransport:
        protocol_class = CorkedHttpToolsProtocol.configured(ConnectionLimits(), LIMIT)
        protocol, state, transport = connected(protocol_class, app)
        for data in reads:
            if not transport.closing:
                protocol.data_received(data)
            for _ in range(5):
                await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*state.tasks), 5)
        closed = transport.closing  # before connection_lost, which closes it anyway
        protocol.connection_lost(None)
        transport.closing = closed
        return transport

    transport = asyncio.run(main())
    return transport, received, scopes[0]


def body_of(received: list[dict]) -> bytes:
    return b"".join(m.get("body", b"") for m in received)


def test_reads_at_every_split_of_a_body_under_the_limit_reach_the_app_whole() -> None:
    request = HEAD + UNDER
    for cut in range(len(HEAD) - 3, len(request)):
        transport, received, scope = run([request[:cut], request[cut:]])
        assert body_of(received) == b"hello0123456789", cut
        assert not transport.closing and BODY_REFUSED not in scope, cut
        assert transport.written[0].startswith(b"HTTP/1.1 200"), cut


def test_reads_at_every_split_of_a_body_past_the_limit_are_refused() -> None:
    request = HEAD + OVER
    for cut in range(len(HEAD) - 3, len(request)):
        transport, received, scope = run([request[:cut], request[cut:]])
        assert transport.closing, cut
        written = b"".join(transport.written)
        assert written.startswith(b"HTTP/1.1 413 "), (cut, written)
        assert b"connection: close\r\n" in written
        assert written.endswith(
            b'{"error":"the request body is larger than the limit of 1000 bytes"}'
        )
        assert scope[BODY_REFUSED] == ("the request body is larger than the limit of 1000 bytes")
        assert received[-1] == {"type": "http.disconnect"}, cut


@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_small_reads_after_the_head_are_followed(step: int) -> None:
    reads = [HEAD] + [OVER[i : i + step] for i in range(0, len(OVER), step)]
    transport, _, _ = run(reads)
    assert b"".join(transport.written).startswith(b"HTTP/1.1 413 ")
    reads = [HEAD] + [UNDER[i : i + step] for i in range(0, len(UNDER), step)]
    transport, received, _ = run(reads)
    assert body_of(received) == b"hello0123456789"


def test_a_content_length_body_is_not_followed() -> None:
    """A Content-Length body whose bytes look like a huge chunk size is just a body."""
    body = b"FFFFFFFFFFFF\r\n" * 10
    head = HEAD.replace(b"transfer-encoding: chunked", b"content-length: %d" % len(body))
    transport, received, _ = run([head + body[:20], body[20:]])
    assert body_of(received) == body
    assert transport.written[0].startswith(b"HTTP/1.1 200")
