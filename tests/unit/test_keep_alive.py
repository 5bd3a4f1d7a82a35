"""An idle keep-alive connection is closed ``timeout_keep_alive`` after its last response.

``CorkedHttpToolsProtocol`` keeps uvicorn's keep-alive timeout with its one deadline timer
per connection instead of a timer armed at every response (``protocol.py``, 7.). Driven
here in memory (the transport of ``test_framework_internals``) with a short timeout: the
idle connection closes on time, not a tick late; a request that comes first keeps it
open; and pipelined requests are still answered in turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from oipserve.front.http.limits import ConnectionLimits
from oipserve.front.http.protocol import CorkedHttpToolsProtocol
from tests.support.transport import MemoryTransport, connected

# Whole seconds: uvicorn types ``timeout_keep_alive`` as an int, and the compiled protocol
#   reads it as one.
KEEP_ALIVE = 1
GET = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n"


async def _app(scope: dict, receive: Callable, send: Callable) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _connection() -> tuple[CorkedHttpToolsProtocol, MemoryTransport]:
    """Our protocol on a memory transport, with its limits' timer ticking every 10 s (the
    default) and a keep-alive timeout of ``KEEP_ALIVE``."""
    protocol_class = CorkedHttpToolsProtocol.configured(ConnectionLimits())
    protocol, _, transport = connected(protocol_class, _app, timeout_keep_alive=KEEP_ALIVE)
    return protocol, transport


async def _answered(transport: MemoryTransport, count: int) -> float:
    """Waits until ``count`` responses are written; the loop time then."""
    loop = asyncio.get_running_loop()
    while sum(w.startswith(b"HTTP/1.1 200") for w in transport.written) < count:
        await asyncio.sleep(0.005)
    return loop.time()


async def _closed(transport: MemoryTransport, within: float) -> float | None:
    """Waits up to ``within`` seconds for the connection to be closed; the loop time then."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while not transport.closing:
        if loop.time() > until:
            return None
        await asyncio.sleep(0.01)
    return loop.time()


def test_an_idle_connection_closes_at_its_keep_alive_timeout() -> None:
    async def main() -> tuple[float, float | None]:
        protocol, transport = _connection()
        protocol.data_received(GET)
        answered = await _answered(transport, 1)
        closed = await _closed(transport, 5.0)
        protocol.connection_lost(None)
        return answered, closed

    answered, closed = asyncio.run(main())
    assert closed is not None, "an idle keep-alive connection was never closed"
    # On time: not before the timeout, and not at the limits' next tick (10 s).
    assert KEEP_ALIVE - 0.05 <= closed - answered < KEEP_ALIVE + 2.0


def test_a_request_before_the_timeout_keeps_the_connection_open() -> None:
    async def main() -> tuple[bool, float, float | None]:
        loop = asyncio.get_running_loop()
        protocol, transport = _connection()
        protocol.data_received(GET)
        await _answered(transport, 1)
        await asyncio.sleep(KEEP_ALIVE / 2)
        protocol.data_received(GET)  # the next request, after half the timeout
        second = await _answered(transport, 2)
        # Past the first response's timeout, the connection must still be open.
        await asyncio.sleep(max(0.0, second + KEEP_ALIVE * 0.6 - loop.time()))
        open_then = not transport.closing
        closed = await _closed(transport, 5.0)
        protocol.connection_lost(None)
        return open_then, second, closed

    open_then, second, closed = asyncio.run(main())
    assert open_then, "closed by the first response's keep-alive timeout, after a second request"
    assert closed is not None and closed - second >= KEEP_ALIVE - 0.05


def test_pipelined_requests_are_answered_in_turn_and_then_time_out() -> None:
    async def main() -> tuple[int, bool]:
        protocol, transport = _connection()
        protocol.data_received(GET * 3)
        await _answered(transport, 3)
        closed = await _closed(transport, 5.0)
        protocol.connection_lost(None)
        return sum(w.startswith(b"HTTP/1.1 200") for w in transport.written), closed is not None

    answers, closed = asyncio.run(main())
    assert answers == 3
    assert closed
