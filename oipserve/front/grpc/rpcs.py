"""The service's RPCs, and a running gRPC server's stop.

``GrpcServer.stop`` stops the server (``front.grpc.listener.H2Server``): it stops
accepting, sends every connection its two GOAWAYs, lets the calls already opened finish
(a message still uploading included, a stream's too: each stream ends once it has
answered the messages begun before its connection's second GOAWAY,
``call_receive.shutting_down``) and closes each connection as its last call ends. See
docs/grpc.md, "Shutdown".
"""

from __future__ import annotations

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
#: gRPC's standard health check (proto/health.proto), which Kubernetes' ``grpc`` probes
#: and load balancers call; named with its service, as every RPC outside ``SERVICE`` is.
HEALTH_CHECK = "grpc.health.v1.Health/Check"
#: The one streaming RPC.
STREAM_RPC = "ModelStreamInfer"
#: The unary inference RPC (also what a stream's request is forwarded as).
INFER_RPC = "ModelInfer"


def rpc_path(name: str) -> str:
    """The HTTP/2 path of the RPC ``name``: a name of ``SERVICE``'s, or one qualified with
    its own service (``HEALTH_CHECK``)."""
    return f"/{name}" if "/" in name else f"/{SERVICE}/{name}"


class Method(NamedTuple):
    """One unary RPC: parse the request bytes, answer, write the response bytes."""

    deserialize: Callable[[bytes], Any]
    call: Callable[[Any], Awaitable[Any]]
    serialize: Callable[[Any], bytes]


class Stoppable(Protocol):
    """A gRPC server's own stop (``front.grpc.listener.H2Server``)."""

    async def stop(self, grace: float | None) -> None: ...


class GrpcServer:
    """A running gRPC server, stopped as shutdown needs."""

    def __init__(self, server: Stoppable) -> None:
        self.server = server

    async def stop(self, timeout: float) -> None:
        """Refuse new calls, let the running ones finish (up to ``timeout`` in all), close.

        Until 2026-11-30 a drain came first, while the server still accepted: it ended
        only once no call ran for five polls in a row, so clients that kept calling were
        served (thousands of calls opened after SIGTERM) until ``--shutdown-timeout``,
        found by fuzzing. The server's own stop already lets every call opened before
        its second GOAWAY finish, a message still uploading included. (A stream's
        messages begun later were told apart by an event set here, at the stop's start,
        until 2026-11-30: the connection's second GOAWAY cuts them now.)
        """
        await self.server.stop(timeout)
