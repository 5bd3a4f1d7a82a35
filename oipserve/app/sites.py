"""The front's listening ports, one *site* each (aiohttp's runner/site split).

The runner (``oipserve.app.server.Server``) owns what lives as long as the process: the
worker pool, the registry, the model manager, the data plane. Each port is a site with its
own steps, which the runner calls in the order its docstring gives:

- ``bind``: take the port at once, before any model loads, so that a port already taken
  fails the start in a second instead of after every load;
- ``start``: serve, once the models are loaded;
- ``drain``: take no new connections or calls; returns at once, safe to call twice and
  before ``start`` (a signal may come at any point);
- ``stopped``: wait until what the site took in has been answered (``--shutdown-timeout``);
- ``close``: close its sockets (safe after anything above, and twice).

``UvicornSite`` is the HTTP port or the metrics port, ``GrpcSite`` the gRPC port, and
``OtherFronts`` the other HTTP fronts of ``--http-workers``: processes of their own that bind
the same ports themselves, so it has only ``start``, ``drain`` and ``stopped``.
"""

from __future__ import annotations

import asyncio
import socket

from oipserve.app.grpc_start import start_grpc
from oipserve.config.settings import Settings
from oipserve.dataplane.plane import DataPlane
from oipserve.front.grpc.listener import H2Server
from oipserve.front.grpc.rpcs import GrpcServer
from oipserve.front.header_rules import App
from oipserve.front.http.h2c import refuse_h2c
from oipserve.front.http.server import UvicornServer
from oipserve.management import Management
from oipserve.runtime.listeners import tcp_listener, unix_listener
from oipserve.scaleout.primary import Replicas

__all__ = ["GrpcSite", "OtherFronts", "StartupError", "UvicornSite", "bind_socket"]

#: Backlog of the private Unix sockets the other fronts forward to.
PRIVATE_BACKLOG = 1024


class StartupError(Exception):
    """Start-up cannot go on; the message says why, for the user (exit code 3)."""


def bind_socket(host: str, port: int, flag: str, reuse_port: bool = False) -> socket.socket:
    """A listening socket on ``host:port``; a port taken is a StartupError naming ``flag``."""
    try:
        return tcp_listener(host, port, reuse_port)
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {host}:{port} ({flag} {port}): {exc.strerror}"
        ) from None


class UvicornSite:
    """An HTTP port served by uvicorn (``UvicornServer``): the REST port or the metrics port.

    uvicorn's own shutdown, once ``drain`` sets ``should_exit``: answer the connections
    already in the listen backlog (``UvicornServer.shutdown``), close the listener and the
    idle keep-alive connections, let the requests in flight finish (up to
    ``--shutdown-timeout``), then ``serve`` returns and ``stopped`` with it.
    """

    def __init__(self, host: str, port: int, flag: str, reuse_port: bool = False) -> None:
        self._host = host
        self._port = port
        self._flag = flag
        self._reuse_port = reuse_port
        self._sockets: list[socket.socket] = []
        self._server: UvicornServer | None = None
        self._serving: asyncio.Task[None] | None = None

    def bind(self) -> None:
        self._sockets.append(bind_socket(self._host, self._port, self._flag, self._reuse_port))

    @property
    def host(self) -> str:
        """The address bound (``--host`` as the kernel reports it)."""
        return str(self._sockets[0].getsockname()[0])

    @property
    def port(self) -> int:
        """The port bound: ``--http-port 0`` / ``--metrics-port 0`` become a free one."""
        return int(self._sockets[0].getsockname()[1])

    def also_listen(self, sock: socket.socket) -> None:
        """Serve ``sock`` too, from ``start`` on (the primary's socket that the other fronts
        forward requests to); closed with the site."""
        self._sockets.append(sock)

    def start(self, server: UvicornServer) -> None:
        """Serve every socket of the site with ``server``, in a task of its own."""
        self._server = server
        self._serving = asyncio.get_running_loop().create_task(
            server.serve(sockets=list(self._sockets))
        )

    @property
    def started(self) -> bool:
        """uvicorn has started serving (the ready line waits for this)."""
        return self._server is not None and self._server.started

    def drain(self) -> None:
        if self._server is not None:
            self._server.should_exit = True

    async def stopped(self) -> None:
        """Until uvicorn's ``serve`` returns (after ``drain``, or by itself)."""
        if self._serving is not None:
            await self._serving

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


class GrpcSite:
    """The gRPC port: held while the models load, then served by the front's own HTTP/2.

    The gRPC listener binds its own socket, so ``bind`` holds a fixed port with a socket
    of ours that ``start`` closes just before the listener binds it (``--grpc-port 0`` has
    nothing to hold). ``drain`` begins the gRPC stop in a task (``GrpcServer.stop``: new
    calls refused, running ones given ``--shutdown-timeout``); ``stopped`` waits for it.

    The HTTP port's HTTP/2 connections (h2c with prior knowledge) are served by the same
    listener (``h2c``): REST and gRPC on one port, for Knative's single port (issue #39).
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._held: socket.socket | None = None
        self._private: socket.socket | None = None
        self._server: GrpcServer | None = None
        self._h2: H2Server | None = None
        self._stopping: asyncio.Task[None] | None = None
        #: The port served, once started (``--grpc-port 0`` picks a free one).
        self.port: int | None = None

    def bind(self) -> None:
        if self._settings.grpc_port:
            self._held = bind_socket(self._settings.host, self._settings.grpc_port, "--grpc-port")

    async def start(
        self,
        dataplane: DataPlane,
        management: Management,
        private_address: str | None,
        rest: App | None = None,
    ) -> None:
        """Serve gRPC on the port; with ``private_address`` (``--http-workers``) also on
        that Unix socket, where the other fronts forward the calls they do not answer;
        with ``rest`` (the HTTP port's app) also OIP REST on the streams that are not gRPC."""
        if self._held is not None:
            self._held.close()
        private = None
        if private_address is not None:
            private = self._private = unix_listener(private_address, PRIVATE_BACKLOG)
        self._server, self.port, self._h2 = await start_grpc(
            self._settings, dataplane, management, private, rest
        )

    def h2c(self, transport: asyncio.Transport, data: bytes, since: float) -> None:
        """An HTTP/2 connection (prior knowledge) that came to the HTTP port: served as
        one of this port's (``H2Server.adopt``), or closed if gRPC never started."""
        if self._h2 is None:
            refuse_h2c(transport, data, since)
        else:
            self._h2.adopt(transport, data, since)

    def drain(self) -> None:
        if self._stopping is None and self._server is not None:
            self._stopping = asyncio.get_running_loop().create_task(
                self._server.stop(self._settings.shutdown_timeout)
            )

    async def stopped(self) -> None:
        """Drain (if no signal did) and wait until the calls in flight are done."""
        self.drain()
        if self._stopping is not None:
            await self._stopping

    def close(self) -> None:
        for sock in (self._held, self._private):
            if sock is not None:
                sock.close()


class OtherFronts:
    """``--http-workers N``: the N-1 other HTTP fronts, serving the HTTP port (and the gRPC
    port) beside this process. ``drain`` has each stop accepting and answer what it
    received (``Replicas.stop``, in a task); ``stopped`` waits until all have exited."""

    def __init__(self, replicas: Replicas, shutdown_timeout: float) -> None:
        self._replicas = replicas
        self._shutdown_timeout = shutdown_timeout
        self._stopping: asyncio.Task[None] | None = None

    async def start(self, port: int) -> None:
        """Start every other front on ``port``; RuntimeError when one cannot start."""
        await self._replicas.start(port)

    def drain(self) -> None:
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(
                self._replicas.stop(self._shutdown_timeout)
            )

    async def stopped(self) -> None:
        self.drain()
        if self._stopping is not None:
            await self._stopping
