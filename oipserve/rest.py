"""The OIP REST surface: Falcon resources that parse, call the data plane, render.

The infer route reads the raw body itself (never through Falcon's media
handlers) and decodes it once with a typed msgspec decoder. Bodies that carry
binary tensors are received straight into a pooled shared-memory segment, and
large binary outputs are sent as views of the worker's output segment.
"""

from __future__ import annotations

import logging
import weakref
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import falcon
import falcon.asgi
import msgspec
import numpy as np

from oipserve import binary
from oipserve.dataplane import DataPlane, InferResult, InputTensor
from oipserve.errors import (
    InvalidInput,
    PayloadTooLarge,
    ServerError,
    Unavailable,
    Unsupported,
    http_status,
)
from oipserve.http_protocol import RECEIVE_INTO, ClientDisconnected
from oipserve.models import ModelVersion
from oipserve.protocol import ENCODER, RequestInput, decode_request, encode_response
from oipserve.settings import Settings
from oipserve.tensors import check_datatype, json_values
from oipserve.wire.shm import ALIGNMENT, BufferPool, Lease

log = logging.getLogger("oipserve.rest")

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
HEADER_LENGTH = "Inference-Header-Content-Length"
#: Below this many binary bytes a response is joined into one buffer: one socket
#: write costs more than copying a few kilobytes.
JOIN_LIMIT = 64 * 1024
#: JSON bodies of this many bytes or more are received like binary ones: straight
#: into a pooled segment (``_App`` leaves their first body event to us).
DIRECT_BODY_MIN = 64 * 1024


class Body:
    """A request body: in a shared-memory lease (binary requests) or in plain bytes."""

    __slots__ = ("data", "lease", "start")

    def __init__(self, data: memoryview | bytes, lease: Lease | None = None, start: int = 0):
        self.data = data
        self.lease = lease
        #: Offset of ``data[0]`` inside the lease's segment.
        self.start = start


async def read_all(req: falcon.asgi.Request, limit: int) -> bytes:
    """The whole body as bytes; 413 as soon as it grows past ``limit``."""
    parts = []
    size = 0
    async for chunk in req.stream:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body is larger than the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _decompress(data: bytes, encoding: str, limit: int) -> bytes:
    if encoding == "gzip":
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    else:  # deflate: zlib-wrapped as RFC 9110 says; raw deflate as browsers sometimes send
        decompressor = zlib.decompressobj(
            zlib.MAX_WBITS if data[:1] == b"\x78" else -zlib.MAX_WBITS
        )
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"the {encoding} request body cannot be decompressed: {exc}") from None
    if len(out) > limit or decompressor.unconsumed_tail:
        raise PayloadTooLarge(f"the decompressed body is larger than the limit of {limit} bytes")
    if not decompressor.eof:
        raise InvalidInput(f"the {encoding} request body is truncated")
    return out


async def read_body(
    req: falcon.asgi.Request, limit: int, pool: BufferPool, header_length: str | None
) -> Body:
    """Receive the body; binary and large bodies land in a shared-memory lease, one copy."""
    # NOTE: a Content-Length above ``limit`` was answered 413 by ``_App`` already;
    #   ``limit`` here bounds bodies of unknown length and decompressed ones.
    length = req.content_length
    encoding = (req.get_header("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("identity", "gzip", "deflate"):
        raise Unsupported(f"unsupported Content-Encoding '{encoding}' (use gzip or deflate)")
    if header_length is None:
        if length is not None and length >= DIRECT_BODY_MIN and encoding == "identity":
            # PERF: a large JSON body lands in pooled memory whose pages are mapped
            #   already, without uvicorn's copies and the join (~5 ms at 5 MB).
            return await _receive_leased(req, pool, length, 0)
        data = await read_all(req, limit)
        return Body(_decompress(data, encoding, limit) if encoding != "identity" else data)
    # NOTE: place the body so the first binary chunk starts on a 64-byte boundary;
    #   numpy and ONNX Runtime then read it in place instead of copying.
    text = header_length.strip()
    pad = (-int(text)) % ALIGNMENT if text.isascii() and text.isdigit() else 0
    if length is None or encoding != "identity":
        data = await read_all(req, limit)
        if encoding != "identity":
            data = _decompress(data, encoding, limit)
        lease = pool.acquire(pad + len(data))
        lease.buf[pad : pad + len(data)] = data
        return Body(lease.buf[pad : pad + len(data)], lease, pad)
    return await _receive_leased(req, pool, length, pad)


async def _receive_leased(
    req: falcon.asgi.Request, pool: BufferPool, length: int, pad: int
) -> Body:
    """Receive a body of ``length`` bytes into a new lease, ``pad`` bytes in."""
    lease = pool.acquire(pad + length)
    end = pad + length
    receive_into = req.scope.get("extensions", {}).get(RECEIVE_INTO)
    try:
        if receive_into is not None:
            # PERF: the server copies body bytes straight from its parser into the
            #   segment (see http_protocol.py), skipping three copies in uvicorn.
            received = await receive_into(lease.buf[pad:end])
        else:
            received = await _stream_into(req, lease.buf, pad, end)
        if received != length:
            raise InvalidInput(
                f"the request body ended after {received} of {length} bytes (Content-Length)"
            )
    except ClientDisconnected:
        lease.release()
        raise InvalidInput("the client went away before its request body was complete") from None
    except BaseException:
        lease.release()
        raise
    return Body(lease.buf[pad:end], lease, pad)


async def _stream_into(req: falcon.asgi.Request, target: memoryview, pos: int, end: int) -> int:
    """Copy the body into ``target[pos:end]`` chunk by chunk, as any ASGI server delivers it."""
    start = pos
    async for chunk in req.stream:
        size = len(chunk)
        if pos + size > end:
            raise InvalidInput("the request body is longer than its Content-Length")
        target[pos : pos + size] = chunk
        pos += size
    return pos - start


def _flag(params: dict[str, object] | None, key: str, default: bool, where: str) -> bool:
    if not params or key not in params:
        return default
    value = params[key]
    if type(value) is not bool:
        raise InvalidInput(f"parameter '{key}' of {where} must be true or false, got {value!r}")
    return value


def choose_encoding(accept: str | None) -> str:
    """Pick gzip, deflate or identity from Accept-Encoding by q-value (first wins ties)."""
    if not accept:
        return "identity"
    best, best_q = "identity", 0.0
    for item in accept.split(","):
        name, _, params = item.strip().partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate", "identity"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        if q > best_q:
            best, best_q = name, q
    return best


def _compress(parts: list[bytes | memoryview], encoding: str) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    out = [compressor.compress(part) for part in parts]
    out.append(compressor.flush())
    return b"".join(out)


async def _stream_views(parts: list[bytes | memoryview]) -> AsyncIterator[bytes | memoryview]:
    while parts:
        # Hand over each part and drop our reference, so a sent view can be collected.
        yield parts.pop(0)


class _Releaser:
    """Releases an InferResult once every view handed to the transport is gone."""

    __slots__ = ("result", "remaining")

    def __init__(self, result: InferResult, count: int) -> None:
        self.result = result
        self.remaining = count

    def __call__(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.result.release()


class ServerResource:
    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data = ENCODER.encode(self.dataplane.server_metadata())

    async def on_get_live(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data = b'{"live":true}'

    async def on_get_ready(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if self.dataplane.ready():
            resp.data = b'{"ready":true}'
        else:
            resp.status = 503
            resp.data = b'{"ready":false}'


class ModelResource:
    def __init__(self, dataplane: DataPlane, settings: Settings) -> None:
        self.dataplane = dataplane
        self.limit = settings.max_request_bytes

    async def on_get(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        model: str,
        version: str | None = None,
    ) -> None:
        resp.data = ENCODER.encode(self.dataplane.model_metadata(model, version))

    async def on_get_ready(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        model: str,
        version: str | None = None,
    ) -> None:
        ready = self.dataplane.registry.model_ready(model, version)
        resp.status = 200 if ready else 503
        resp.data = ENCODER.encode({"name": model, "ready": ready})

    async def on_get_config(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        model: str,
        version: str | None = None,
    ) -> None:
        resp.data = ENCODER.encode(self.dataplane.model_config(model, version))

    async def on_post_infer(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        model: str,
        version: str | None = None,
    ) -> None:
        header_text = req.get_header(HEADER_LENGTH)
        body = await read_body(req, self.limit, self.dataplane.inputs, header_text)
        owned = [body.lease] if body.lease is not None else []
        try:
            header_length = binary.parse_header_length(header_text, len(body.data))
            target = self.dataplane.resolve(model, version)
            if header_length == 0:
                inputs = [self._raw_input(target, body)]
                request_id, names, flags = None, [], None
                all_binary = True
            else:
                header = body.data if header_length is None else body.data[:header_length]
                try:
                    request = decode_request(header)
                except ValueError as exc:
                    raise InvalidInput(str(exc)) from None
                inputs = self._inputs(request.inputs, body, header_length)
                all_binary = _flag(request.parameters, "binary_data_output", False, "the request")
                names, flags = [], None
                if request.outputs is not None:
                    names = [o.name for o in request.outputs]
                    flags = [
                        _flag(o.parameters, "binary_data", all_binary, f"output '{o.name}'")
                        for o in request.outputs
                    ]
                request_id = request.id
        except BaseException:
            for lease in owned:
                lease.release()
            raise
        result = await self.dataplane.infer(target, inputs, names, owned)
        self._render(req, resp, result, request_id, flags, all_binary)

    def _raw_input(self, target: ModelVersion, body: Body) -> InputTensor:
        if len(target.inputs) != 1:
            raise InvalidInput(
                f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with "
                f"exactly one input; model '{target.name}' has {len(target.inputs)}: "
                + ", ".join(f"'{spec.name}'" for spec in target.inputs)
            )
        spec = target.inputs[0]
        nbytes = len(body.data)
        shape = binary.raw_input_shape(
            spec.name, spec.datatype, spec.shape, target.max_batch_size > 0, nbytes
        )
        assert body.lease is not None
        return InputTensor(
            spec.name, spec.datatype, shape, located=(body.lease, body.start, nbytes)
        )

    def _inputs(
        self, inputs: list[RequestInput], body: Body, header_length: int | None
    ) -> list[InputTensor]:
        if header_length is None:
            spans: list[tuple[int, int] | None] = [None] * len(inputs)
        else:
            spans = binary.chunk_spans(inputs, header_length, len(body.data))
        tensors = []
        for tensor, span in zip(inputs, spans, strict=True):
            check_datatype(tensor.name, tensor.datatype)
            if span is not None:
                assert body.lease is not None
                located = (body.lease, body.start + span[0], span[1])
                tensors.append(
                    InputTensor(tensor.name, tensor.datatype, tensor.shape, located=located)
                )
                continue
            if binary.binary_size(tensor) is not None:
                raise InvalidInput(
                    f"input '{tensor.name}' gives binary_data_size but the request has no "
                    f"{HEADER_LENGTH} header"
                )
            if tensor.data is msgspec.UNSET:
                raise InvalidInput(f"input '{tensor.name}' has no 'data'")
            if tensor.data is None:
                raise InvalidInput(f"'data' of input '{tensor.name}' must be an array, not null")
            tensors.append(
                InputTensor(tensor.name, tensor.datatype, tensor.shape, values=tensor.data)
            )
        return tensors

    def _render(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        result: InferResult,
        request_id: str | None,
        flags: list[bool] | None,
        all_binary: bool,
    ) -> None:
        try:
            outputs: list[dict[str, object]] = []
            chunks: list[memoryview] = []
            for index, tensor in enumerate(result.outputs):
                as_binary = flags[index] if flags is not None else all_binary
                entry: dict[str, object] = {
                    "name": tensor.name,
                    "datatype": tensor.datatype,
                    "shape": tensor.shape,
                }
                if as_binary:
                    entry["parameters"] = {"binary_data_size": len(tensor.data)}
                    if len(tensor.data):
                        chunks.append(tensor.data)
                else:
                    entry["data"] = json_values(tensor.datatype, tensor.data, tensor.count)
                outputs.append(entry)
            response: dict[str, object] = {
                "model_name": result.model.name,
                "model_version": result.model.version,
            }
            if request_id is not None:
                response["id"] = request_id
            response["outputs"] = outputs
            header = encode_response(response)
        except BaseException:
            result.release()
            raise
        encoding = choose_encoding(req.get_header("Accept-Encoding"))
        if not chunks:
            result.release()
            resp.content_type = JSON
            resp.data = header if encoding == "identity" else _compress([header], encoding)
        else:
            resp.content_type = OCTET_STREAM
            resp.set_header(HEADER_LENGTH, str(len(header)))
            total = len(header) + sum(len(c) for c in chunks)
            if encoding != "identity" or total <= JOIN_LIMIT:
                try:
                    parts: list[bytes | memoryview] = [header, *chunks]
                    resp.data = (
                        _compress(parts, encoding) if encoding != "identity" else b"".join(parts)
                    )
                finally:
                    result.release()
            else:
                # PERF: large outputs go to the socket as views of the worker's segment.
                #   The transport may keep a view until the bytes are written, so the
                #   segment is released only when the last view is collected.
                releaser = _Releaser(result, len(chunks))
                views: list[bytes | memoryview] = [header]
                for chunk in chunks:
                    # A numpy array can carry a finalizer (a memoryview cannot); the
                    #   transport holds the memoryview, which holds the array.
                    owner = np.frombuffer(chunk, dtype=np.uint8)
                    weakref.finalize(owner, releaser)
                    views.append(memoryview(owner))
                del owner
                resp.content_length = total
                resp.stream = _stream_views(views)
        if encoding != "identity":
            resp.set_header("Content-Encoding", encoding)


async def _handle_server_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: ServerError, params: dict[str, object]
) -> None:
    if ex.status >= 500:
        log.warning("%s %s -> %d: %s", req.method, req.path, ex.status, ex.message)
    else:
        log.debug("%s %s -> %d: %s", req.method, req.path, ex.status, ex.message)
    resp.status = ex.status
    resp.content_type = JSON
    resp.data = ENCODER.encode({"error": ex.message})
    if isinstance(ex, Unavailable) and ex.retry_after is not None:
        resp.set_header("Retry-After", str(ex.retry_after))
    if isinstance(ex, Unsupported) and "Content-Encoding" in ex.message:
        resp.set_header("Accept-Encoding", "gzip, deflate")
    resp.stream = None


async def _handle_unexpected(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: Exception, params: dict[str, object]
) -> None:
    if isinstance(ex, falcon.HTTPError):
        raise ex
    log.exception("unexpected error on %s %s", req.method, req.path)
    resp.status, message = http_status(ex)
    resp.content_type = JSON
    resp.data = ENCODER.encode({"error": message})


def _serialize_http_error(
    req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError
) -> None:
    message = exc.title if not exc.description else f"{exc.title}: {exc.description}"
    resp.content_type = JSON
    resp.data = ENCODER.encode({"error": message})


Receive = Callable[[], Awaitable[dict]]


class _App(falcon.asgi.App):
    """Falcon's app, with the size limit checked first and binary bodies left unread.

    Falcon awaits the first body event before it routes a request, so a
    responder could answer 413 only once the client has sent body bytes (a
    client that waits for ``100 Continue`` would stall): the limit is checked
    here, from Content-Length. For binary and large requests the first body
    event is also where the server would copy the body's first chunk out of its
    buffer; Falcon is given an empty first event instead, so that ``read_body``
    can receive the whole body straight into shared memory (``RECEIVE_INTO``).
    Readers of ``req.stream`` (other routes, compressed bodies) are unaffected:
    the rest of the body simply comes with the next event.
    """

    def __init__(self, limit: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._limit = limit

    async def __call__(self, scope: dict, receive: Receive, send: object) -> None:  # type: ignore[override]
        if scope["type"] == "http":
            direct = False
            for key, value in scope["headers"]:
                if key == b"content-length":
                    if value.isdigit():
                        size = int(value)
                        if size > self._limit:
                            await _refuse_too_large(send, size, self._limit)  # type: ignore[arg-type]
                            return
                        direct |= size >= DIRECT_BODY_MIN
                elif key == b"inference-header-content-length":
                    direct = True
            if direct and RECEIVE_INTO in scope.get("extensions", ()):
                receive = _without_first_body(receive)
        await super().__call__(scope, receive, send)  # type: ignore[arg-type]


_NO_BODY_YET = {"type": "http.request", "body": b"", "more_body": True}


def _without_first_body(receive: Receive) -> Receive:
    """``receive`` whose first event is empty, leaving the body in the server's hands."""
    first = True

    async def deferred() -> dict:
        nonlocal first
        if first:
            first = False
            return dict(_NO_BODY_YET)
        return await receive()

    return deferred


async def _refuse_too_large(
    send: Callable[[dict], Awaitable[None]], length: int, limit: int
) -> None:
    body = ENCODER.encode(
        {"error": f"the request body has {length} bytes, more than the limit of {limit} bytes"}
    )
    # NOTE: the body is left unread; uvicorn discards it as it arrives, so the
    #   connection stays usable and a client that sends it all still reads the 413.
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", JSON.encode()), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


def create_app(settings: Settings, dataplane: DataPlane) -> falcon.asgi.App:
    app = _App(settings.max_request_bytes, media_type=JSON)
    app.req_options.strip_url_path_trailing_slash = True
    app.resp_options.default_media_type = JSON
    app.add_error_handler(Exception, _handle_unexpected)
    app.add_error_handler(ServerError, _handle_server_error)
    app.set_error_serializer(_serialize_http_error)

    server = ServerResource(dataplane)
    app.add_route("/v2", server)
    app.add_route("/v2/health/live", server, suffix="live")
    app.add_route("/v2/health/ready", server, suffix="ready")

    models = ModelResource(dataplane, settings)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.add_route(base, models)
        app.add_route(base + "/ready", models, suffix="ready")
        app.add_route(base + "/config", models, suffix="config")
        app.add_route(base + "/infer", models, suffix="infer")
    return app
