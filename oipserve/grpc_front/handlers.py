"""The method-handler table grpc.aio serves: one handler per RPC of the service descriptor.

Built from the generated messages rather than the generated servicer base
class, so that ModelInfer can use this package's codec (``codec``) instead of
protobuf's, every unary failure leaves as a status from ``status.status_of``,
and RPCs of extensions this server lacks answer UNIMPLEMENTED with a reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from oipserve.grpc_front.codec import InferCall, serialize_infer, split_infer_request
from oipserve.grpc_front.service import InferenceService
from oipserve.grpc_front.status import log_failure, status_of
from oipserve.grpc_generated import grpc_service_pb2 as pb

#: The fully qualified service name, as clients address it.
SERVICE = "inference.GRPCInferenceService"

_REPOSITORY_RPCS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
_UNIMPLEMENTED = {
    "TraceSetting": "the trace extension is not supported by this server",
    "LogSettings": "the logging extension is not supported by this server",
}


def method_handlers(service: InferenceService) -> dict[str, grpc.RpcMethodHandler]:
    """One handler per RPC of the service descriptor, built from the generated messages."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        name = method.name
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        deserialize = request_type.FromString
        if request_type is pb.ModelInferRequest:
            deserialize = _arrived(service, split_infer_request)
        serialize = (
            serialize_infer
            if response_type is pb.ModelInferResponse
            else response_type.SerializeToString
        )
        if name == "ModelStreamInfer":
            handlers[name] = grpc.stream_stream_rpc_method_handler(
                service.ModelStreamInfer,  # an async generator: grpc.aio iterates it
                request_deserializer=deserialize,
                response_serializer=serialize,
            )
            continue
        if name in _UNIMPLEMENTED:
            behaviour = _unimplemented(name, _UNIMPLEMENTED[name])
        elif name in _REPOSITORY_RPCS and service.management is None:
            behaviour = _unimplemented(name, "the model repository extension is not enabled")
        else:
            behaviour = _unary(name, getattr(service, name))
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=deserialize, response_serializer=serialize
        )
    return handlers


def _unary(
    method: str, handler: Callable[[Any], Awaitable[Any]]
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """Wrap a handler so every failure leaves as a status from ``status_of``."""

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code, message = status_of(exc)
            log_failure(method, code, message, exc)
            await context.abort(code, message)

    return call


def _unimplemented(method: str, message: str) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: {message}")

    return call


def _arrived(
    service: InferenceService, parse: Callable[[bytes], InferCall]
) -> Callable[[bytes], InferCall]:
    """``parse`` that also marks a ModelInfer call as no longer arriving (now or never running)."""

    def deserialize(data: bytes) -> InferCall:
        if service.arriving:
            service.arriving.popleft()
        return parse(data)

    return deserialize
