"""Starting the gRPC surface: in the front process, or in ``--grpc-processes`` of its own."""

from __future__ import annotations

from typing import Protocol

from oipserve.dataplane import DataPlane
from oipserve.grpc_front.handlers import method_handlers, unary_methods
from oipserve.grpc_front.server import serve_grpc
from oipserve.grpc_front.service import InferenceService
from oipserve.grpc_relay.processes import GrpcProcesses
from oipserve.management import Management
from oipserve.settings import Settings


class RunningGrpc(Protocol):
    """What shutdown needs of the gRPC surface, wherever it runs."""

    async def stop(self, timeout: float) -> None: ...


async def start_grpc(
    settings: Settings, dataplane: DataPlane, management: Management | None = None
) -> tuple[RunningGrpc, int]:
    """Serve the service on ``host:grpc_port``; return what stops it and the port.

    ``--grpc-processes 0``: grpc.aio in this process. N: N processes take the calls
    and forward them here, where the same method table answers them.
    """
    service = InferenceService(dataplane, management)
    if settings.grpc_processes == 0:
        return await serve_grpc(settings, service, method_handlers(service), settings.grpc_port)
    processes = GrpcProcesses(
        settings, unary_methods(service), settings.grpc_processes, dataplane.inputs
    )
    return processes, await processes.start()
