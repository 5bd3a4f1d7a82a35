"""The REST front's uvicorn server: its configuration, and the shutdown that answers the
backlog. Every HTTP front (the primary and, with ``--http-workers``, the others) runs one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from typing import cast

import uvicorn

from oipserve.config.settings import Settings
from oipserve.errors import SHUTDOWN_UNANSWERED
from oipserve.front.header_rules import App, HeadChecked
from oipserve.front.http.h2c import H2Handover
from oipserve.front.http.lane import InferLane
from oipserve.front.http.limits import ConnectionLimits
from oipserve.front.http.parser_log import quiet_bad_heads
from oipserve.front.http.protocol import CorkedHttpToolsProtocol
from oipserve.front.http.syn_filter import drop_new_connections

log = logging.getLogger("oipserve")


#: How long handshakes already under way at shutdown get to complete once the listener
#: drops new SYNs (``syn_filter``): one round trip (a client in the same data centre,
#: under a millisecond) and then plenty; every shutdown waits it once.
HANDSHAKE_WAIT = 0.05

#: How long connections taken from the backlog at shutdown get for their request heads to
#: arrive before uvicorn closes those still without one.
BACKLOG_HEAD_WAIT = 0.05


class UvicornServer(uvicorn.Server):
    """uvicorn's server, with signals left to us so that shutdown order stays ours.

    At shutdown it also answers the connections the kernel had already accepted: uvicorn
    closes the listening socket, which resets every connection still in its backlog, so
    a client that had sent its request saw a reset and no answer (11 of 16 closed-loop
    clients at SIGTERM). Those connections are accepted and served first, then closed;
    before that the listener stops taking new ones (``syn_filter``), so that none can
    complete its handshake between the last accept and the close.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        quiet_bad_heads()  # one debug line per unparsable head, not a warning (parser_log)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._serve_backlog()
        await super().shutdown(sockets)

    async def _wait_tasks_to_complete(self) -> None:
        """uvicorn's wait for the requests under way, which it cancels at
        ``--shutdown-timeout``: those still unanswered then get a 503 with
        ``{"error": ...}`` first, where uvicorn answered a plain-text 500 and logged a
        traceback for each (found by fuzzing; ``parser_log`` quiets the log)."""
        try:
            await super()._wait_tasks_to_complete()
        except asyncio.CancelledError:
            for connection in list(self.server_state.connections):
                if isinstance(connection, CorkedHttpToolsProtocol):
                    connection.refuse_unanswered(SHUTDOWN_UNANSWERED)
            raise

    async def _serve_backlog(self) -> None:
        listeners = [
            socket.socket(fileno=os.dup(listener.fileno()))
            for server in self.servers
            for listener in server.sockets
        ]
        try:
            # New SYNs are dropped from here on; the handshakes already under way get
            # HANDSHAKE_WAIT to complete, and the loop goes on accepting meanwhile.
            dropping = [drop_new_connections(listener) for listener in listeners]
            if any(dropping):
                await asyncio.sleep(HANDSHAKE_WAIT)
            # NOTE: no await from the first accept to close(): without the filter, a
            #   connection that completes its handshake after the last accept is reset.
            waiting = [c for listener in listeners for c in _accept_all(listener)]
            for server in self.servers:
                server.close()
        finally:
            for listener in listeners:
                listener.close()
        if not waiting:
            return
        loop = asyncio.get_running_loop()
        config = self.config

        def protocol() -> asyncio.Protocol:
            # uvicorn types the class as asyncio.Protocol, whose constructor takes nothing.
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        for connection in waiting:
            connection.setblocking(False)
            try:
                await loop.connect_accepted_socket(protocol, connection)
            except OSError:
                connection.close()
        log.info("answering %d connections accepted before shutdown", len(waiting))
        await asyncio.sleep(BACKLOG_HEAD_WAIT)


def _accept_all(listener: socket.socket) -> list[socket.socket]:
    """Every connection in ``listener``'s backlog, without waiting for more."""
    accepted: list[socket.socket] = []
    listener.setblocking(False)
    while True:
        try:
            accepted.append(listener.accept()[0])
        except (BlockingIOError, InterruptedError):
            return accepted
        except OSError:
            return accepted  # EMFILE and the like: what is left is reset, as before


def _drain_seconds(settings: Settings) -> int:
    """``--shutdown-timeout`` as uvicorn's drain takes it: the seconds as given. uvicorn
    types it an int but hands it to ``asyncio.wait_for`` as is, where a float works and
    0 means at once; ``int(x) or None`` made 0.5 and 0 an unbounded drain and cut 1.5 to
    1 (found by fuzzing)."""
    return cast(int, settings.shutdown_timeout)


#: The body a request to the metrics port may declare (it answers GET without reading one).
METRICS_MAX_BODY = 64 * 1024


def http_server(
    settings: Settings, app: App, h2c: H2Handover, lane: InferLane | None = None
) -> UvicornServer:
    """The OIP REST front's ``app`` on uvicorn, with our HTTP protocol.

    Every front's app is put behind the request-head rules they share
    (``oipserve.front.header_rules``), so that no front can answer a head differently.
    A connection that opens with HTTP/2's preface goes to ``h2c`` (the front's gRPC
    listener, or ``refuse_h2c`` without gRPC): gRPC on the HTTP port. A plain infer
    request goes to ``lane`` (the app's infer responder, below the app) when there is one.
    """
    config = uvicorn.Config(
        HeadChecked(app),
        interface="asgi3",  # HeadChecked returns the app's coroutine: not detectable
        http=CorkedHttpToolsProtocol.configured(
            ConnectionLimits.of(settings), settings.max_request_bytes, h2c, lane
        ),
        loop="none",
        lifespan="off",
        access_log=False,
        # PERF: no X-Forwarded-* rewriting per request; nothing here uses the client address.
        proxy_headers=False,
        log_config=None,
        log_level=settings.log_level,
        timeout_graceful_shutdown=_drain_seconds(settings),
        h11_max_incomplete_event_size=None,
    )
    return UvicornServer(config)


def metrics_server(settings: Settings, app: App) -> UvicornServer:
    """``GET /metrics`` on a second uvicorn server on the same loop, with the same protocol
    and limits as the HTTP port (it had uvicorn's own: no head timeout, no head limit)."""
    config = uvicorn.Config(
        app,
        http=CorkedHttpToolsProtocol.configured(ConnectionLimits.of(settings), METRICS_MAX_BODY),
        loop="none",
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level=settings.log_level,
        timeout_graceful_shutdown=_drain_seconds(settings),
    )
    return UvicornServer(config)
