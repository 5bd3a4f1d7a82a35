"""A running grpc.aio server: binding, the method lookup, call wrappers, a draining stop.

Nothing here knows what answers the calls: ``in_front.start_grpc`` serves the
front's own handler table (``handlers``), ``oipserve.grpc_process`` a table that
forwards every call to the front. grpc.aio's own ``stop(grace)`` cancels calls
whose message has not fully arrived; ``GrpcServer.stop`` drains first (with
``_Lookup`` counting calls from their headers on), then stops. See docs/grpc.md,
"Shutdown".
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
import grpc.aio

from oipserve.grpc_front.restricted import Restricted
from oipserve.grpc_front.status import log_failure, status_of
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.settings import Settings

#: The fully qualified service name, as clients address it.
SERVICE = "inference.GRPCInferenceService"
#: Every RPC of the service descriptor: name -> (request type, response type).
RPCS: dict[str, tuple[Any, Any]] = {
    method.name: (getattr(pb, method.input_type.name), getattr(pb, method.output_type.name))
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
}
#: The one streaming RPC.
STREAM_RPC = "ModelStreamInfer"

_MODEL_INFER = f"/{SERVICE}/ModelInfer"
#: How long a drain waits for a request message still uploading at shutdown.
_UPLOAD_GRACE = 2.0
_POLL_SECONDS = 0.02
#: A drain ends after this many polls in a row without a running inference.
_QUIET_POLLS = 5


class Calls(Protocol):
    """What a drain reads of the service answering the calls."""

    #: Inferences running now (unary calls and stream requests alike).
    active: int
    #: Arrival times of ModelInfer calls whose request message is not yet fully in
    #: (``_Lookup`` appends, parsing pops, see ``arrived``); a drain waits for them too.
    arriving: deque[float]
    #: Set at shutdown: streams end once they have nothing left to answer.
    closing: asyncio.Event


async def serve_grpc(
    settings: Settings,
    calls: Calls,
    handlers: dict[str, grpc.RpcMethodHandler],
    port: int,
    reuse_port: bool = False,
) -> tuple[GrpcServer, int]:
    """Bind ``host:port`` (0 picks a free port), start serving, return (server, port).

    ``reuse_port``: several processes serve the port (``--grpc-processes`` above 1);
    otherwise a port already taken is an error.
    """
    limit = settings.grpc_max_message_bytes
    # NOTE: grpc's core checks the receive limit while it inflates a compressed
    #   message (it stops at the limit: "Decompressed message larger than max"),
    #   so this bounds what a small gzip message can cost, like an HTTP body.
    receive_limit = min(limit, settings.max_request_bytes)
    server = grpc.aio.server(
        interceptors=_restricted(settings),
        options=[
            ("grpc.max_receive_message_length", receive_limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", int(reuse_port)),
        ],
    )
    server.add_generic_rpc_handlers((_Lookup(calls.arriving, handlers),))
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    address = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot listen for gRPC on {address}: {exc}") from None
    if bound == 0:
        raise RuntimeError(f"cannot listen for gRPC on {address}")
    await server.start()
    return GrpcServer(server, calls), bound


def _restricted(settings: Settings) -> list[grpc.aio.ServerInterceptor]:
    """The restriction check, first (a refused call is never counted as arriving);
    none at all when nothing is restricted, so unrestricted servers pay nothing."""
    if not settings.grpc_restricted_protocol:
        return []
    return [Restricted(SERVICE, settings.grpc_restricted_protocol)]


def unary(
    method: str, handler: Callable[[Any], Awaitable[Any]], log_failures: bool = True
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """Wrap a handler so every failure leaves as a status from ``status_of``."""

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code, message = status_of(exc)
            if log_failures:
                log_failure(method, code, message, exc)
            await context.abort(code, message)

    return call


def arrived(arriving: deque[float], parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``parse`` that also marks a ModelInfer call as no longer arriving (now or never running)."""

    def deserialize(data: bytes) -> Any:
        if arriving:
            arriving.popleft()
        return parse(data)

    return deserialize


class Stoppable(Protocol):
    """A gRPC server's own stop: grpc.aio's, or ``grpc_h2.server.H2Server``'s."""

    async def stop(self, grace: float | None) -> None: ...


class GrpcServer:
    """A running gRPC server and its calls, stopped in the order shutdown needs."""

    def __init__(self, server: Stoppable, calls: Calls) -> None:
        self.server = server
        self.calls = calls

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
        self.calls.closing.set()
        deadline = loop.time() + timeout
        quiet = 0
        while quiet < _QUIET_POLLS and loop.time() < deadline:
            await asyncio.sleep(_POLL_SECONDS)
            arriving = self.calls.arriving
            while arriving and time.monotonic() - arriving[0] > _UPLOAD_GRACE:
                arriving.popleft()  # never parsed: rejected (too large) or abandoned
            quiet = 0 if self.calls.active or arriving else quiet + 1
        await self.server.stop(max(0.0, deadline - loop.time()))


class _Lookup(grpc.GenericRpcHandler):
    """The service's method table; a ModelInfer call is counted as arriving when looked up.

    grpc.aio looks a call's handler up from its headers, before its message has
    arrived, and hands a unary call to the application only once the whole message
    is in: a large tensor still uploading at shutdown would otherwise look like no
    call at all, and ``Server.stop`` would cancel it. (Restriction checks run before
    the lookup, so a refused call is never counted.)

    PERF: counting here rather than in an interceptor saves grpc.aio's interceptor
    chain (two coroutines and a ``functools.partial``) on every call.
    """

    def __init__(self, arriving: deque[float], handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._arriving = arriving
        self._handlers = {f"/{SERVICE}/{name}": handler for name, handler in handlers.items()}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method == _MODEL_INFER:
            self._arriving.append(time.monotonic())
        return self._handlers.get(method)
