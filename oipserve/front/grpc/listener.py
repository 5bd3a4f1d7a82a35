"""The gRPC listener: connections accepted, calls made, and a stop that lets calls end.

``H2Server.serve`` binds the port (``serve_unix`` a private socket too);
``front.grpc.rpcs.GrpcServer`` calls ``stop``, which stops accepting, sends every
connection a GOAWAY in two phases (RFC 9113, 6.8: clients open new calls elsewhere, and
calls sent before they heard it are still served; a stream is cut once the second goes
out, ``_cut_streams``), waits up to ``grace`` for those phases and the calls still
running, and closes what is left; a connection's socket then lingers, within the same
grace, until its peer took the last answers (``front.grpc.linger``).

The public port's connections are bounded (``front.grpc.keepalive``): at most
``max_connections`` at once (past it a new one is refused and closed at once, the open
ones kept), and each is watched for idleness and silence by one timer of its own. The
private socket's connections (the other fronts' forwarded calls) are neither counted
nor watched. A connection ended by a connection error frees its slot at once; its
socket lingers briefly, bounded, so that its GOAWAY is not lost (``front.grpc.linger``);
a connection that ends well lingers so too. ``stop`` aborts those still lingering at
the end of its grace.

``adopt`` takes the HTTP/2 connections that came to the HTTP port (h2c with prior
knowledge, ``front.http.protocol``): they are this listener's in every way (the cap, the
watch, the preface's time counted from their connect, the call table and so its
restrictions, and ``stop``'s GOAWAYs).

``serve_rest`` hands it the REST app: then a stream whose request is not gRPC, on any of
its connections, is served by that app (``front.http.h2_asgi``: OIP REST over HTTP/2,
for Knative's single ``h2c`` port); without it such a stream is answered 415 as before.
"""

from __future__ import annotations

import asyncio
import functools
import socket

from oipserve.config.settings import Settings
from oipserve.errors import SHUTDOWN_UNANSWERED
from oipserve.front.grpc.call import Call
from oipserve.front.grpc.call_table import CallTable
from oipserve.front.grpc.h2.connection import Connection
from oipserve.front.grpc.h2.connection_state import PREFACE_TIMEOUT
from oipserve.front.grpc.keepalive import ConnectionLimits, Refusals, Watch
from oipserve.front.grpc.linger import Lingering
from oipserve.front.header_rules import App
from oipserve.front.http import limits as http_limits
from oipserve.front.http.h2_asgi import RestOverH2
from oipserve.front.http.h2_connection import Http2Connection

_POLL_SECONDS = 0.02


class _Refused(asyncio.Protocol):
    """A connection past the cap: closed at once, nothing written and nothing read.

    NOTE: no SETTINGS and GOAWAY first: grpc core, having read the server's SETTINGS,
    takes the connection as made and retries the call on a new one for as long as its
    deadline allows (a call without one hung); a connection closed before the server's
    preface is a failed connect, answered UNAVAILABLE at once.
    """

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def _cut_streams(connection: Connection) -> None:
    """The connection's client has had the shutdown's first GOAWAY (its second went out):
    each ModelStreamInfer stream serves what it received until now and no later message
    (``call_receive.shutting_down``). Cut at the stop's start instead, a message the
    client sent in the GOAWAY's round trip was not served, where a unary call it opened
    then was."""
    for call in list(connection.streams.values()):
        if isinstance(call, Call):
            call.shutting_down()


class H2Server:
    """gRPC over this package's HTTP/2, on one listening socket."""

    def __init__(
        self,
        table: CallTable,
        preface_timeout: float = PREFACE_TIMEOUT,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self._table = table
        #: Seconds a client has to open (preface and SETTINGS) before it is closed.
        self._preface_timeout = preface_timeout
        self._limits = limits or ConnectionLimits()
        self._connections: set[Connection] = set()
        #: The public port's connections, each with its watch.
        self._watched: dict[Connection, Watch] = {}
        self._refusals = Refusals()
        self._listeners: list[asyncio.Server] = []
        #: ``stop`` began: connections handed over by ``adopt`` are refused.
        self._stopping = False
        #: Sockets closing after a connection error's GOAWAY, or after their connection
        #: ended well (not counted by the cap: those at most a quarter of it).
        self._lingering = Lingering(graceful_bound=max(1, self._limits.max_connections // 4))

    @property
    def connections(self) -> int:
        """Connections open on the public port (what the cap counts)."""
        return len(self._watched)

    @property
    def lingering(self) -> int:
        """Sockets lingering after a connection error's GOAWAY (``front.grpc.linger``)."""
        return len(self._lingering)

    def _connection(self, preface_timeout: float | None = None) -> asyncio.Protocol:
        """A connection on the public port: counted against the cap, and watched."""
        cap = self._limits.max_connections
        if len(self._watched) >= cap:
            self._refusals.refused(cap)
            return _Refused()
        connection = self._made(preface_timeout, one_client=True)
        self._watched[connection] = Watch(connection, self._limits)
        return connection

    def _private(self) -> Connection:
        """A connection on the private socket: another front's forwarded calls, of many
        clients (their abandoned requests are not held against it: the forwarding front's
        own connections are the clients')."""
        return self._made(None, one_client=False)

    def _made(self, preface_timeout: float | None, one_client: bool) -> Connection:
        if preface_timeout is None:
            preface_timeout = self._preface_timeout
        connection = Http2Connection(
            self._call,
            self._closed,
            preface_timeout,
            linger=self._lingering,
            one_client=one_client,
        )
        self._connections.add(connection)
        return connection

    def serve_rest(self, app: App, settings: Settings) -> None:
        """Serve the streams that are not gRPC with the REST ``app`` (the one HTTP/1.1
        serves), under the HTTP port's limits (``settings``)."""
        self._table.rest = RestOverH2(
            app, http_limits.ConnectionLimits.of(settings), settings.max_request_bytes
        )

    def adopt(self, transport: asyncio.Transport, data: bytes, since: float) -> None:
        """Serve an HTTP/2 connection accepted elsewhere (the HTTP port's h2c) as one of
        the public port's: ``data`` is what was read from it (the preface first), ``since``
        the loop time it was made. Refused (closed) past the cap, or once ``stop`` began."""
        left = self._preface_timeout - (asyncio.get_running_loop().time() - since)
        protocol = _Refused() if self._stopping else self._connection(max(0.0, left))
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if isinstance(protocol, Connection):
            protocol.data_received(data)

    def _closed(self, connection: Connection) -> None:
        self._connections.discard(connection)
        watch = self._watched.pop(connection, None)
        if watch is not None:
            watch.stop()

    def _call(self, connection: Connection, stream: int) -> Call:
        return Call(connection, stream, self._table)

    async def serve(self, host: str, port: int, reuse_port: bool) -> int:
        """Listen on ``host:port`` (0 picks one); return the port."""
        loop = asyncio.get_running_loop()
        try:
            listener = await loop.create_server(
                self._connection, host, port, reuse_port=reuse_port or None, backlog=1024
            )
        except OSError as exc:
            shown = f"[{host}]" if ":" in host else host
            raise RuntimeError(f"cannot listen for gRPC on {shown}:{port}: {exc}") from None
        self._listeners.append(listener)
        sockets = listener.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def serve_unix(self, sock: socket.socket) -> None:
        """Also serve a listening Unix socket (the primary's, for the other fronts)."""
        loop = asyncio.get_running_loop()
        self._listeners.append(await loop.create_unix_server(self._private, sock=sock))

    async def stop(self, grace: float | None) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = True
        for listener in self._listeners:
            listener.close()
        for connection in list(self._connections):
            connection.go_away(functools.partial(_cut_streams, connection))
        deadline = loop.time() + (grace or 0.0)
        while any(c.streams or c.announcing for c in self._connections) and loop.time() < deadline:
            await asyncio.sleep(_POLL_SECONDS)
        for connection in list(self._connections):
            for call in list(connection.streams.values()):
                call.give_up(SHUTDOWN_UNANSWERED)
            connection.end()
        # The sockets that ended well linger until their peers took the last answers
        # and GOAWAY (``linger``), within the same grace; those left then are aborted.
        while self._lingering and loop.time() < deadline:
            await asyncio.sleep(_POLL_SECONDS)
        self._lingering.close()
        for listener in self._listeners:
            await listener.wait_closed()
