"""The running gRPC server: binding, starting, and a shutdown that lets inferences finish.

grpc.aio's own ``stop(grace)`` cancels calls whose message has not fully
arrived; ``GrpcServer.stop`` drains first (with ``_Service`` counting calls
from their headers on), then stops. See docs/grpc.md, "Shutdown".
"""

from __future__ import annotations

import asyncio
import time

import grpc
import grpc.aio

from oipserve.dataplane import DataPlane
from oipserve.grpc_front.handlers import SERVICE, method_handlers
from oipserve.grpc_front.restricted import Restricted
from oipserve.grpc_front.service import InferenceService
from oipserve.management import Management
from oipserve.settings import Settings

_MODEL_INFER = f"/{SERVICE}/ModelInfer"
#: How long a drain waits for a request message still uploading at shutdown.
_UPLOAD_GRACE = 2.0
_POLL_SECONDS = 0.02
#: A drain ends after this many polls in a row without a running inference.
_QUIET_POLLS = 5


async def start_grpc(
    settings: Settings, dataplane: DataPlane, management: Management | None = None
) -> tuple[GrpcServer, int]:
    """Bind ``host:grpc_port`` (0 picks a free port), start serving, return (server, port)."""
    limit = settings.grpc_max_message_bytes
    # NOTE: grpc's core checks the receive limit while it inflates a compressed
    #   message (it stops at the limit: "Decompressed message larger than max"),
    #   so this bounds what a small gzip message can cost, like an HTTP body.
    receive_limit = min(limit, settings.max_request_bytes)
    service = InferenceService(dataplane, management)
    server = grpc.aio.server(
        interceptors=_restricted(settings),
        options=[
            ("grpc.max_receive_message_length", receive_limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((_Service(service),))
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    address = f"{host}:{settings.grpc_port}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot listen for gRPC on {address}: {exc}") from None
    if port == 0:
        raise RuntimeError(f"cannot listen for gRPC on {address}")
    await server.start()
    return GrpcServer(server, service), port


def _restricted(settings: Settings) -> list[grpc.aio.ServerInterceptor]:
    """The restriction check, first (a refused call is never counted as arriving);
    none at all when nothing is restricted, so unrestricted servers pay nothing."""
    if not settings.grpc_restricted_protocol:
        return []
    return [Restricted(SERVICE, settings.grpc_restricted_protocol)]


class GrpcServer:
    """The running grpc.aio server and its service, stopped in the order shutdown needs."""

    def __init__(self, server: grpc.aio.Server, service: InferenceService) -> None:
        self.server = server
        self.service = service

    async def stop(self, timeout: float) -> None:
        """Let running inferences finish (up to ``timeout`` in all), then close.

        ``grpc.aio.Server.stop(grace)`` alone is not enough: calls that reached
        the transport but were not yet handed to the application when it runs
        are cancelled (CANCELLED), not finished. Draining first, while the
        server still serves (ServerReady already says false), lets those be
        answered; idle streams end by themselves once ``closing`` is set. A call
        that is never parsed (rejected as too large, or abandoned by its client)
        is forgotten after ``_UPLOAD_GRACE`` seconds, so it cannot hold the drain.
        """
        loop = asyncio.get_running_loop()
        self.service.closing.set()
        deadline = loop.time() + timeout
        quiet = 0
        while quiet < _QUIET_POLLS and loop.time() < deadline:
            await asyncio.sleep(_POLL_SECONDS)
            arriving = self.service.arriving
            while arriving and time.monotonic() - arriving[0] > _UPLOAD_GRACE:
                arriving.popleft()  # never parsed: rejected (too large) or abandoned
            quiet = 0 if self.service.active or arriving else quiet + 1
        await self.server.stop(max(0.0, deadline - loop.time()))


class _Service(grpc.GenericRpcHandler):
    """The service's method table; a ModelInfer call is counted as arriving when looked up.

    grpc.aio looks a call's handler up from its headers, before its message has
    arrived, and hands a unary call to the application only once the whole message
    is in: a large tensor still uploading at shutdown would otherwise look like no
    call at all, and ``Server.stop`` would cancel it. (Restriction checks run before
    the lookup, so a refused call is never counted.)

    PERF: counting here rather than in an interceptor saves grpc.aio's interceptor
    chain (two coroutines and a ``functools.partial``) on every call.
    """

    def __init__(self, service: InferenceService) -> None:
        self._arriving = service.arriving
        self._handlers = {
            f"/{SERVICE}/{name}": handler for name, handler in method_handlers(service).items()
        }

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method == _MODEL_INFER:
            self._arriving.append(time.monotonic())
        return self._handlers.get(method)
