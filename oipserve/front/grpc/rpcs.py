"""The service's RPCs, and a running gRPC server's draining stop.

``GrpcServer.stop`` drains the calls first (the transport counts a ModelInfer call as
arriving from its headers on, and ``arrived`` takes it off once its message is
parsed), then stops the server (``front.grpc.listener.H2Server``), which refuses new calls
and closes connections as their last call ends. See docs/grpc.md, "Shutdown".
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol

from oipserve.grpc_generated import grpc_service_pb2 as pb

#: The fully qualified service name, as clients address it.
SERVICE = "inference.GRPCInferenceService"
#: Every RPC of the service descriptor: name -> (request type, response type).
RPCS: dict[str, tuple[Any, Any]] = {
    method.name: (getattr(pb, method.input_type.name), getattr(pb, method.output_type.name))
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
}
#: The one streaming RPC.
STREAM_RPC = "ModelStreamInfer"
#: The unary inference RPC (also what a stream's request is forwarded as).
INFER_RPC = "ModelInfer"

#: How long a drain waits for a request message still uploading at shutdown.
_UPLOAD_GRACE = 2.0
_POLL_SECONDS = 0.02
#: A drain ends after this many polls in a row without a running inference.
_QUIET_POLLS = 5


class Method(NamedTuple):
    """One unary RPC: parse the request bytes, answer, write the response bytes."""

    deserialize: Callable[[bytes], Any]
    call: Callable[[Any], Awaitable[Any]]
    serialize: Callable[[Any], bytes]


class Calls(Protocol):
    """What a drain reads of the service answering the calls."""

    #: Inferences running now (unary calls and stream requests alike).
    active: int
    #: Arrival times of ModelInfer calls whose request message is not yet fully in (the
    #: transport appends at a call's headers, parsing pops: ``arrived``, a call that ends
    #: unparsed takes its own off: ``forget``); a drain waits for them too.
    arriving: deque[float]
    #: Set at shutdown: streams end once they have nothing left to answer.
    closing: asyncio.Event


def arrived(arriving: deque[float], parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``parse`` that also marks a ModelInfer call as no longer arriving (now or never running)."""

    def deserialize(data: bytes) -> Any:
        if arriving:
            arriving.popleft()
        return parse(data)

    return deserialize


def forget(arriving: deque[float], at: float) -> None:
    """Take off ``arriving`` the entry (``at``) of a ModelInfer call that ended before its
    message was parsed (refused, reset, expired): nothing else ever would."""
    try:
        arriving.remove(at)
    except ValueError:
        pass  # already forgotten by a drain (``_UPLOAD_GRACE``)


class Stoppable(Protocol):
    """A gRPC server's own stop (``front.grpc.listener.H2Server``)."""

    async def stop(self, grace: float | None) -> None: ...


class GrpcServer:
    """A running gRPC server and its calls, stopped in the order shutdown needs."""

    def __init__(self, server: Stoppable, calls: Calls) -> None:
        self.server = server
        self.calls = calls

    async def stop(self, timeout: float) -> None:
        """Let running inferences finish (up to ``timeout`` in all), then close.

        Draining first, while the server still serves (ServerReady already says
        false), lets calls still uploading their message be answered: the server's
        own stop refuses new calls at once. Idle streams end by themselves once
        ``closing`` is set. A call that is never parsed (rejected as too large, or
        abandoned by its client) is forgotten after ``_UPLOAD_GRACE`` seconds, so it
        cannot hold the drain.
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
