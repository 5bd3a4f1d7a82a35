"""Starting the gRPC surface."""

from __future__ import annotations

from typing import Protocol

from oipserve.dataplane import DataPlane
from oipserve.grpc_front.handlers import method_handlers
from oipserve.grpc_front.server import serve_grpc
from oipserve.grpc_front.service import InferenceService
from oipserve.management import Management
from oipserve.settings import Settings


class RunningGrpc(Protocol):
    """What shutdown needs of the gRPC surface, wherever it runs."""

    async def stop(self, timeout: float) -> None: ...


async def start_grpc(
    settings: Settings, dataplane: DataPlane, management: Management | None = None
) -> tuple[RunningGrpc, int]:
    """Serve the service on ``host:grpc_port``; return what stops it and the port."""
    service = InferenceService(dataplane, management)
    return await serve_grpc(settings, service, method_handlers(service), settings.grpc_port)
