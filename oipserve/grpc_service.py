"""The OIP gRPC surface: a thin adapter over the DataPlane, like ``rest.py``.

Every RPC parses its message into the data plane's types, calls it, and
renders the answer; validation, placement in shared memory and dispatch to
workers happen once, in ``DataPlane``. ``ServerError``s become gRPC statuses
in one place, ``status_of``.

``ModelInferRequest.raw_input_contents`` is the fast path: the request is not
handed whole to protobuf (which would copy every raw entry into a new
``bytes``); ``split_infer_request`` walks its top-level fields, keeps each raw
entry as a view of the received message and lets protobuf parse only the
rest. The data plane then copies each view once, into shared memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from oipserve.dataplane import DataPlane, InferResult, InputTensor
from oipserve.errors import InvalidInput, ServerError, Unsupported, grpc_status
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.management import Management
from oipserve.settings import Settings
from oipserve.tensors import check_datatype
from oipserve.wire.datatypes import DATATYPES

log = logging.getLogger("oipserve.grpc")

SERVICE = "inference.GRPCInferenceService"

#: Which ``InferTensorContents`` field carries the typed values of each datatype.
CONTENTS_FIELD: dict[str, str] = {
    name: row.grpc_contents for name, row in DATATYPES.items() if row.grpc_contents
}
_ALL_CONTENTS = sorted(set(CONTENTS_FIELD.values()))

#: Tensor parameters that ask for the shared-memory extension, which this server lacks.
_SHM_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")

_RAW_FIELD = 7  # ModelInferRequest.raw_input_contents


# ---- errors ----------------------------------------------------------------


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for any exception a handler lets out: the one mapping place."""
    code, message = grpc_status(exc)
    return grpc.StatusCode[code], message


def _log_failure(method: str, code: grpc.StatusCode, message: str, exc: BaseException) -> None:
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN):
        if isinstance(exc, ServerError):
            log.warning("%s -> %s: %s", method, code.name, message)
        else:
            log.error("unexpected error in %s", method, exc_info=exc)
    else:
        log.debug("%s -> %s: %s", method, code.name, message)


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
            _log_failure(method, code, message, exc)
            await context.abort(code, message)

    return call


# ---- raw_input_contents without a copy -------------------------------------


class InferCall:
    """A parsed ModelInferRequest plus its raw input entries as views of the wire bytes."""

    __slots__ = ("message", "raw")

    def __init__(self, message: pb.ModelInferRequest, raw: list[memoryview]) -> None:
        self.message = message
        self.raw = raw


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def split_infer_request(data: bytes) -> InferCall:
    """Parse a serialized ModelInferRequest, keeping ``raw_input_contents`` as views.

    Only the message's top-level fields are walked (a handful); everything but
    field 7 is re-joined and parsed by protobuf, field 7's entries stay views of
    ``data`` (which the views keep alive).
    """
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    pos = 0
    end = len(view)
    kept_from = 0
    while pos < end:
        start = pos
        key, pos = _varint(view, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint(view, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(view, pos)
            if key >> 3 == _RAW_FIELD:
                if pos + length > end:
                    raise DecodeError("truncated raw_input_contents entry")
                if kept_from < start:
                    rest.append(view[kept_from:start])
                raw.append(view[pos : pos + length])
                kept_from = pos + length
            pos += length
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        if pos > end:
            raise DecodeError("truncated message")
    if not raw:
        return InferCall(pb.ModelInferRequest.FromString(data), raw)
    if kept_from < end:
        rest.append(view[kept_from:end])
    return InferCall(pb.ModelInferRequest.FromString(b"".join(rest)), raw)


# ---- requests and responses --------------------------------------------------


def _check_tensor_parameters(where: str, parameters: Any) -> None:
    for key in _SHM_PARAMETERS:
        if key in parameters:
            raise Unsupported(
                f"{where} uses parameter '{key}', but this server does not support the "
                "shared-memory extension; send the data in the request"
            )


def input_tensors(message: pb.ModelInferRequest, raw: list[memoryview]) -> list[InputTensor]:
    """InputTensors of a request: raw entries by position, or typed ``contents``."""
    tensors: list[InputTensor] = []
    if raw:
        if any(t.HasField("contents") for t in message.inputs):
            raise InvalidInput("contents field must not be specified when using raw_input_contents")
        if len(raw) != len(message.inputs):
            raise InvalidInput(
                f"the request has {len(message.inputs)} input(s) but {len(raw)} "
                "raw_input_contents entries; give exactly one per input, in the same order"
            )
    for index, tensor in enumerate(message.inputs):
        name, datatype = tensor.name, tensor.datatype
        check_datatype(name, datatype)
        _check_tensor_parameters(f"input '{name}'", tensor.parameters)
        shape = list(tensor.shape)
        if raw:
            tensors.append(InputTensor(name, datatype, shape, raw=raw[index]))
            continue
        tensors.append(InputTensor(name, datatype, shape, values=typed_values(tensor)))
    return tensors


def typed_values(tensor: pb.ModelInferRequest.InferInputTensor) -> list[object]:
    """The flat values of an input sent as typed ``contents``."""
    field = CONTENTS_FIELD.get(tensor.datatype)
    contents = tensor.contents
    if field is None:
        raise InvalidInput(
            f"input '{tensor.name}' has datatype {tensor.datatype}, which has no typed "
            "contents field; send it in raw_input_contents"
        )
    values = getattr(contents, field)
    if not values:
        for other in _ALL_CONTENTS:
            if other != field and len(getattr(contents, other)):
                raise InvalidInput(
                    f"input '{tensor.name}' has datatype {tensor.datatype}, so its contents "
                    f"must be in '{field}', not '{other}'"
                )
    return list(values)


_RAW_OUTPUT_TAG = bytes([(6 << 3) | 2])  # ModelInferResponse.raw_output_contents, length-delimited


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class InferReply:
    """A ModelInferResponse whose raw outputs are still views of the worker's segment.

    ``serialize`` writes the wire bytes with one copy of each output (protobuf
    would take two: into a ``bytes`` entry, then into the serialized message)
    and releases the segment. If gRPC never serializes the reply (the call was
    cancelled), the segment is released when the reply is collected.
    """

    __slots__ = ("head", "result", "__weakref__")

    def __init__(self, result: InferResult, request_id: str) -> None:
        self.result = result
        self.head = pb.ModelInferResponse(
            model_name=result.model.name, model_version=result.model.version, id=request_id
        )
        for tensor in result.outputs:
            self.head.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        weakref.finalize(self, result.release)

    def serialize(self) -> bytes:
        try:
            parts: list[bytes | memoryview] = [self.head.SerializeToString()]
            for tensor in self.result.outputs:
                parts += (_RAW_OUTPUT_TAG, _varint_bytes(len(tensor.data)), tensor.data)
            return b"".join(parts)
        finally:
            self.result.release()

    def message(self) -> pb.ModelInferResponse:
        """The whole response as a protobuf message (for streams), releasing the segment."""
        try:
            response = pb.ModelInferResponse()
            response.CopyFrom(self.head)
            response.raw_output_contents.extend(bytes(t.data) for t in self.result.outputs)
            return response
        finally:
            self.result.release()


def _serialize_infer(reply: InferReply | pb.ModelInferResponse) -> bytes:
    if isinstance(reply, InferReply):
        return reply.serialize()
    return reply.SerializeToString()


def _version(version: str) -> str | None:
    return version or None


def _repository_parameter(parameter: pb.ModelRepositoryParameter) -> object:
    """The Python value of a load/unload parameter (``bytes_param`` stays bytes)."""
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice is not None else None


# ---- the service ---------------------------------------------------------------


class InferenceService:
    """Handlers of GRPCInferenceService; anything not listed answers UNIMPLEMENTED."""

    def __init__(self, dataplane: DataPlane, management: Management | None = None) -> None:
        self.dataplane = dataplane
        #: The model repository extension; without it those RPCs answer UNIMPLEMENTED.
        self.management = management
        #: Inferences running now (unary calls and stream requests alike).
        self.active = 0
        #: Arrival times of ModelInfer calls whose request message is not yet fully in
        #: (``_Arrivals`` appends, parsing pops); a drain waits for them too.
        self.arriving: deque[float] = deque()
        #: Set at shutdown: streams end once they have nothing left to answer.
        self.closing = asyncio.Event()

    async def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dataplane.live())

    async def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        ready = self.dataplane.registry.model_ready(request.name, _version(request.version))
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        meta = self.dataplane.server_metadata()
        return json_format.ParseDict(meta, pb.ServerMetadataResponse(), ignore_unknown_fields=True)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = self.dataplane.model_metadata(request.name, _version(request.version))
        return json_format.ParseDict(meta, pb.ModelMetadataResponse(), ignore_unknown_fields=True)

    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        config = self.dataplane.model_config(request.name, _version(request.version))
        # NOTE: fields of Triton's ModelConfig that our proto does not carry are
        #   dropped here; REST's /config shows the full JSON.
        message = json_format.ParseDict(config, pb.ModelConfig(), ignore_unknown_fields=True)
        return pb.ModelConfigResponse(config=message)

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        assert self.management is not None
        response = pb.RepositoryIndexResponse()
        for entry in self.management.index(request.ready):
            response.models.add(
                name=entry["name"],
                version=entry.get("version", ""),
                state=entry.get("state", ""),
                reason=entry.get("reason", ""),
            )
        return response

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        assert self.management is not None
        parameters = {k: _repository_parameter(v) for k, v in request.parameters.items()}
        await self.management.repository_load(request.model_name, None, parameters)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        assert self.management is not None
        await self.management.repository_unload(request.model_name, None)
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(self, call: InferCall) -> InferReply:
        self.active += 1
        try:
            return await self._infer(call)
        finally:
            self.active -= 1

    async def _infer(self, call: InferCall) -> InferReply:
        message = call.message
        model = self.dataplane.resolve(message.model_name, _version(message.model_version))
        inputs = input_tensors(message, call.raw)
        outputs = []
        for output in message.outputs:
            _check_tensor_parameters(f"output '{output.name}'", output.parameters)
            outputs.append(output.name)
        result = await self.dataplane.infer(model, inputs, outputs, [])
        return InferReply(result, message.id)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[InferCall], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests run concurrently; responses come back in request order.

        A failed request is answered in-band (``error_message``) and the stream
        goes on, as Triton does; a client that sent the ``triton_grpc_error:
        true`` header instead gets the failure as the stream's status.
        """
        metadata = context.invocation_metadata() or ()
        strict = any(k == "triton_grpc_error" and v == "true" for k, v in metadata)
        pending: asyncio.Queue[asyncio.Task[InferReply] | None] = asyncio.Queue(64)

        async def read() -> None:
            try:
                async for call in requests:
                    await pending.put(asyncio.ensure_future(self.ModelInfer(call)))
            finally:
                await pending.put(None)

        reader = asyncio.ensure_future(read())
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            while True:
                if self.closing.is_set() and pending.empty():
                    break  # shutting down, and every request so far is answered
                getter = asyncio.ensure_future(pending.get())
                if not self.closing.is_set():
                    await asyncio.wait((getter, closing), return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        continue
                task = await getter
                if task is None:
                    await reader  # surfaces a broken request stream
                    break
                try:
                    response = await task
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    code, message = status_of(exc)
                    _log_failure("ModelStreamInfer", code, message, exc)
                    if strict:
                        await context.abort(code, message)
                    yield pb.ModelStreamInferResponse(error_message=message)
                    continue
                yield pb.ModelStreamInferResponse(infer_response=response.message())
        finally:
            reader.cancel()
            closing.cancel()
            while not pending.empty():
                task = pending.get_nowait()
                if task is not None:
                    task.cancel()


_REPOSITORY_RPCS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
_UNIMPLEMENTED = {
    "ModelStatistics": "the statistics extension is not supported by this server",
    "SystemSharedMemoryStatus": "the system shared memory extension is not supported",
    "SystemSharedMemoryRegister": "the system shared memory extension is not supported",
    "SystemSharedMemoryUnregister": "the system shared memory extension is not supported",
    "CudaSharedMemoryStatus": "the CUDA shared memory extension is not supported",
    "CudaSharedMemoryRegister": "the CUDA shared memory extension is not supported",
    "CudaSharedMemoryUnregister": "the CUDA shared memory extension is not supported",
    "TraceSetting": "the trace extension is not supported by this server",
    "LogSettings": "the logging extension is not supported by this server",
}


def _unimplemented(method: str, message: str) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: {message}")

    return call


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
            _serialize_infer
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


def _arrived(
    service: InferenceService, parse: Callable[[bytes], InferCall]
) -> Callable[[bytes], InferCall]:
    """``parse`` that also marks a ModelInfer call as no longer arriving (now or never running)."""

    def deserialize(data: bytes) -> InferCall:
        if service.arriving:
            service.arriving.popleft()
        return parse(data)

    return deserialize


class _Arrivals(grpc.aio.ServerInterceptor):
    """Counts ModelInfer calls from their headers on, before their message has arrived.

    grpc.aio hands a unary call to the application only once its whole message
    is in; a large tensor still uploading at shutdown would otherwise look like
    no call at all, and ``Server.stop`` would cancel it.
    """

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if details.method == _MODEL_INFER:
            self.service.arriving.append(time.monotonic())
        return await continuation(details)


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
    service = InferenceService(dataplane, management)
    server = grpc.aio.server(
        interceptors=[_Arrivals(service)],
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ],
    )
    handlers = method_handlers(service)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
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
