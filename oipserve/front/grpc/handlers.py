"""The method tables of GRPCInferenceService: how each RPC is parsed, answered and written.

``unary_methods`` is the table without a transport: for every unary RPC, the
request parser (a message that does not parse is the client's error,
INVALID_ARGUMENT), the handler of ``InferenceService`` that answers it and the
response writer. ModelInfer uses this package's codec (``codec``) instead of
protobuf's, and RPCs of extensions this server lacks raise ``Unsupported``
(UNIMPLEMENTED, with a reason). The front's own HTTP/2 (``oipserve.front.grpc.h2``) serves it,
in every HTTP front, with ``stream_infer`` for ModelStreamInfer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from oipserve.errors import Unsupported
from oipserve.front.grpc.codec import (
    parse_infer_request,
    parsing,
    serialize_infer,
    wire_bytes,
)
from oipserve.front.grpc.rpcs import HEALTH_CHECK, RPCS, STREAM_RPC, Method
from oipserve.front.grpc.service import InferenceService
from oipserve.front.grpc.streaming import StreamRequestFailed
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.grpc_generated import health_pb2 as health
from oipserve.request.inference import Parked

_REPOSITORY_RPCS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
_UNIMPLEMENTED = {
    "TraceSetting": "the trace extension is not supported by this server",
    "LogSettings": "the logging extension is not supported by this server",
}


def unary_methods(service: InferenceService) -> dict[str, Method]:
    """Every unary RPC of the service descriptor, by name, and gRPC's health check."""
    methods: dict[str, Method] = {}
    for name, (request_type, response_type) in RPCS.items():
        if name == STREAM_RPC:
            continue
        if name in _UNIMPLEMENTED:
            call = _refuse(name, _UNIMPLEMENTED[name])
        elif name in _REPOSITORY_RPCS and service.management is None:
            call = _refuse(name, "the model repository extension is not enabled")
        else:
            call = getattr(service, name)
        if request_type is pb.ModelInferRequest:
            methods[name] = Method(parse_infer_request, call, serialize_infer)
        else:
            methods[name] = Method(parsing(request_type), call, response_type.SerializeToString)
    response = health.HealthCheckResponse
    methods[HEALTH_CHECK] = Method(
        parsing(health.HealthCheckRequest), service.Check, response.SerializeToString
    )
    return methods


def stream_infer(
    service: InferenceService,
) -> Callable[[bytes | memoryview, Parked | None], Awaitable[bytes | memoryview]]:
    """One request message of ModelStreamInfer, answered as a serialized ModelInferResponse:
    a large one gathered in a thread into memory of its own, as a unary reply is
    (``codec.wire_bytes``; the stream unmaps it once it is sent).

    The message is parsed here, in the request's own task: one that does not parse fails
    that request alone, answered in-band as any failed request of a stream is. ``parked``
    is told while it waits for a sequence slot (``Inference.parked``).
    """

    async def infer(message: bytes | memoryview, parked: Parked | None) -> bytes | memoryview:
        call = parse_infer_request(message)
        call.parked = parked
        try:
            return await wire_bytes(await service.ModelInfer(call), serialize_infer)
        except Exception as exc:
            raise StreamRequestFailed(exc, call.message.id) from exc

    return infer


def _refuse(method: str, reason: str) -> Callable[[Any], Awaitable[Any]]:
    async def call(request: Any) -> Any:
        raise Unsupported(f"{method}: {reason}")

    return call
