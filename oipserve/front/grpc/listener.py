"""The gRPC listener: connections accepted, calls made, and a stop that lets calls end.

``H2Server.serve`` binds the port (``serve_unix`` a private socket too);
``front.grpc.rpcs.GrpcServer`` drains the service's calls first, then calls
``stop``, which stops accepting, sends every connection a GOAWAY in two phases (RFC
9113, 6.8: clients open new calls elsewhere, and calls sent before they heard it are
still served), waits up to ``grace`` for those phases and the calls still running, and
closes what is left.
"""

from __future__ import annotations

import asyncio
import socket

from oipserve.front.grpc.call import Call
from oipserve.front.grpc.call_table import CallTable
from oipserve.front.grpc.h2.connection import PREFACE_TIMEOUT, Connection

_POLL_SECONDS = 0.02


class H2Server:
    """gRPC over this package's HTTP/2, on one listening socket."""

    def __init__(self, table: CallTable, preface_timeout: float = PREFACE_TIMEOUT) -> None:
        self._table = table
        #: Seconds a client has to open (preface and SETTINGS) before it is closed.
        self._preface_timeout = preface_timeout
        self._connections: set[Connection] = set()
        self._listeners: list[asyncio.Server] = []

    def _connection(self) -> Connection:
        connection = Connection(self._call, self._connections.discard, self._preface_timeout)
        self._connections.add(connection)
        return connection

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
        self._listeners.append(await loop.create_unix_server(self._connection, sock=sock))

    async def stop(self, grace: float | None) -> None:
        loop = asyncio.get_running_loop()
        for listener in self._listeners:
            listener.close()
        for connection in list(self._connections):
            connection.go_away()
        deadline = loop.time() + (grace or 0.0)
        while any(c.streams or c.announcing for c in self._connections) and loop.time() < deadline:
            await asyncio.sleep(_POLL_SECONDS)
        for connection in list(self._connections):
            for call in list(connection.streams.values()):
                call.reset()
            connection.close()
        for listener in self._listeners:
            await listener.wait_closed()
