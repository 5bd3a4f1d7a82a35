"""Starting the gRPC surface: the front's own HTTP/2 (``front.grpc``), in this process.

With ``--allow-http`` (the default) its HTTP/2 also serves OIP REST on the streams that
are not gRPC (``front.http.h2_asgi``), on the gRPC port and on the HTTP port's h2c
connections alike: Knative's single ``h2c`` port then serves both (issue #39).
"""

from __future__ import annotations

import socket

from oipserve.config.settings import Settings
from oipserve.dataplane.plane import DataPlane
from oipserve.front.grpc.keepalive import ConnectionLimits
from oipserve.front.grpc.listener import H2Server
from oipserve.front.grpc.rpcs import GrpcServer
from oipserve.front.grpc.service import InferenceService
from oipserve.front.grpc.tables import in_front_table
from oipserve.front.header_rules import App
from oipserve.management import Management


async def start_grpc(
    settings: Settings,
    dataplane: DataPlane,
    management: Management | None = None,
    private: socket.socket | None = None,
    rest: App | None = None,
) -> tuple[GrpcServer, int, H2Server]:
    """Serve the service on ``host:grpc_port``; return what stops it, the port, and the
    listener (which also adopts the HTTP port's HTTP/2 connections: ``H2Server.adopt``).

    With ``private`` (``--http-workers``) the port is bound with ``SO_REUSEPORT``, shared
    with the other fronts, and the service is also served on that Unix socket: the other
    fronts forward to it the calls they do not answer themselves
    (``oipserve.scaleout.grpc_forward``). With ``rest`` (the HTTP port's REST app, given
    with ``--allow-http``) the streams that are not gRPC are served by it.
    """
    service = InferenceService(dataplane, management)
    # NOTE: a gRPC connection's preface has the HTTP port's time for a request head.
    own = H2Server(
        in_front_table(settings, service, dataplane),
        settings.header_timeout,
        ConnectionLimits.of(settings),
    )
    if rest is not None:
        own.serve_rest(rest, settings)
    port = await own.serve(settings.host, settings.grpc_port, reuse_port=private is not None)
    if private is not None:
        await own.serve_unix(private)
    return GrpcServer(own), port, own
