"""Starting the gRPC surface: in the front process, or in ``--grpc-processes`` of its own."""

from __future__ import annotations

import socket
from typing import Protocol

from oipserve.dataplane import DataPlane
from oipserve.grpc_front.handlers import unary_methods
from oipserve.grpc_front.server import GrpcServer
from oipserve.grpc_front.service import InferenceService
from oipserve.grpc_h2.server import H2Server
from oipserve.grpc_h2.tables import in_front_table
from oipserve.grpc_relay.processes import GrpcProcesses
from oipserve.management import Management
from oipserve.settings import Settings


class RunningGrpc(Protocol):
    """What shutdown needs of the gRPC surface, wherever it runs."""

    async def stop(self, timeout: float) -> None: ...


async def start_grpc(
    settings: Settings,
    dataplane: DataPlane,
    management: Management | None = None,
    private: socket.socket | None = None,
) -> tuple[RunningGrpc, int]:
    """Serve the service on ``host:grpc_port``; return what stops it and the port.

    ``--grpc-processes 0``: the front's own HTTP/2 (``grpc_h2``) in this process, also on
    ``private`` when given (``--http-workers``: the other fronts share the port and
    forward what they do not answer to that socket). N: N processes serve the port
    (with the same HTTP/2) and forward the calls here, where the same method table
    answers them.
    """
    service = InferenceService(dataplane, management)
    if settings.grpc_processes == 0:
        own = H2Server(in_front_table(settings, service, dataplane))
        port = await own.serve(settings.host, settings.grpc_port, reuse_port=private is not None)
        if private is not None:
            await own.serve_unix(private)
        return GrpcServer(own, service), port
    processes = GrpcProcesses(
        settings, unary_methods(service), settings.grpc_processes, dataplane.inputs
    )
    return processes, await processes.start()
