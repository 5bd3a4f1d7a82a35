"""The method tables of GRPCInferenceService: how each RPC is parsed, answered and written.

``unary_methods`` is the table without a transport: for every unary RPC, the
request parser, the handler of ``InferenceService`` that answers it and the
response writer. ModelInfer uses this package's codec (``codec``) instead of
protobuf's, and RPCs of extensions this server lacks raise ``Unsupported``
(UNIMPLEMENTED, with a reason). Two transports serve the table:

- ``method_handlers``: grpc.aio in this process (``--grpc-processes 0``), every
  failure leaving as a status from ``status.status_of``;
- ``oipserve.grpc_relay.front_side``: calls forwarded by gRPC processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import grpc
import grpc.aio

from oipserve.errors import Unsupported
from oipserve.grpc_front.codec import (
    WRITE_IN_THREAD,
    InferCall,
    InferReply,
    serialize_infer,
    split_infer_request,
    written_in_thread,
)
from oipserve.grpc_front.server import RPCS, STREAM_RPC, arrived, unary
from oipserve.grpc_front.service import InferenceService
from oipserve.grpc_front.streaming import ordered_responses
from oipserve.grpc_generated import grpc_service_pb2 as pb

_REPOSITORY_RPCS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
_UNIMPLEMENTED = {
    "TraceSetting": "the trace extension is not supported by this server",
    "LogSettings": "the logging extension is not supported by this server",
}


class Method(NamedTuple):
    """One unary RPC: parse the request bytes, answer, write the response bytes."""

    deserialize: Callable[[bytes], Any]
    call: Callable[[Any], Awaitable[Any]]
    serialize: Callable[[Any], bytes]


def unary_methods(service: InferenceService) -> dict[str, Method]:
    """Every unary RPC of the service descriptor, by name."""
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
            methods[name] = Method(split_infer_request, call, serialize_infer)
        else:
            methods[name] = Method(request_type.FromString, call, response_type.SerializeToString)
    return methods


def method_handlers(service: InferenceService) -> dict[str, grpc.RpcMethodHandler]:
    """The table as grpc.aio method handlers, ModelStreamInfer included."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for name, method in unary_methods(service).items():
        deserialize, call = method.deserialize, method.call
        if name == "ModelInfer":
            deserialize, call = arrived(service.arriving, deserialize), _joined(call)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            unary(name, call),
            request_deserializer=deserialize,
            response_serializer=method.serialize,
        )

    joined = _joined(service.ModelInfer)

    async def infer(call: InferCall) -> bytes:
        return serialize_infer(await joined(call))

    async def stream(
        requests: AsyncIterator[InferCall], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for response in ordered_responses(requests, infer, service.closing, context):
            yield response

    handlers[STREAM_RPC] = grpc.stream_stream_rpc_method_handler(
        stream, request_deserializer=split_infer_request
    )
    return handlers


def _joined(
    infer: Callable[[InferCall], Awaitable[InferReply]],
) -> Callable[[InferCall], Awaitable[InferReply | bytes]]:
    """ModelInfer whose large replies are joined in a thread (grpc.aio wants one bytes
    object, and serializes on the loop).

    NOTE: ``bytes.join`` keeps the GIL, so this moves the copy off the loop's stack
    but not out of its way; gRPC processes copy without the GIL (``grpc_relay``).
    """

    async def call(request: InferCall) -> InferReply | bytes:
        reply = await infer(request)
        if reply.nbytes >= WRITE_IN_THREAD:
            return await written_in_thread(reply, InferReply.join)
        return reply

    return call


def _refuse(method: str, reason: str) -> Callable[[Any], Awaitable[Any]]:
    async def call(request: Any) -> Any:
        raise Unsupported(f"{method}: {reason}")

    return call
