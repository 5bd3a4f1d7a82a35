"""The Falcon resources of the OIP routes: server, model and infer.

The infer responder reads top to bottom: receive the body (``body``), parse
the JSON header once with a typed decoder, turn each input into the data
plane's ``InputTensor`` (binary chunks as spans of the body's lease, JSON
values as they are), call the data plane, render the result (``render``).
Validation that does not depend on the wire format (shapes, datatypes against
the model, placement in shared memory) is the data plane's.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Final

import falcon.asgi
import msgspec

from oipserve.config.settings import Settings
from oipserve.dataplane.plane import DataPlane
from oipserve.errors import InternalError, InvalidInput, request_tag
from oipserve.front.http.extensions import NO_EXTENSIONS, ON_DISCONNECT
from oipserve.front.rest import binary
from oipserve.front.rest.body import Body, read_body
from oipserve.front.rest.encode import ENCODER
from oipserve.front.rest.media import HEADER_LENGTH
from oipserve.front.rest.render import outputs_to_print, print_in_steps, render_infer
from oipserve.models.registry import ModelVersion
from oipserve.request import sequence_params
from oipserve.request.checks import output_twice, unparsed_shape
from oipserve.request.client_regions import (
    RegionUse,
    region_parameters,
    region_request,
    wants_region,
)
from oipserve.request.inference import Inference, InputTensor
from oipserve.request.parameters import check_request_parameters, schedule_parameters, unsigned
from oipserve.request.sequence_params import SequenceTag
from oipserve.request.tensors import Deferred, check_datatype, decode_data
from oipserve.telemetry.stats_report import model_statistics
from oipserve.wire.datatypes import LENGTH_PREFIX
from oipserve.wire.json_request import RequestInput, RequestOutput
from oipserve.wire.shm import Lease


class ServerResource:
    """``/v2`` (server metadata) and the health routes."""

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


class StatisticsResource:
    """``/v2/models[/{model}[/versions/{version}]]/stats``: the statistics extension."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    async def on_get(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        model: str | None = None,
        version: str | None = None,
    ) -> None:
        dataplane = self.dataplane
        await dataplane.stats.refresh()
        report = model_statistics(dataplane.stats, dataplane.registry, model, version)
        resp.data = ENCODER.encode(report)


class ModelResource:
    """``/v2/models/{model}[/versions/{version}]``: metadata, ready, config, infer."""

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
        owned: list[Lease | RegionUse] = [body.lease] if body.lease is not None else []
        into_regions: dict[str, RegionUse] = {}
        target: ModelVersion | None = None
        try:
            header_length = binary.parse_header_length(header_text, len(body.data))
            target = self.dataplane.resolve(model, version)
            priority = timeout_us = 0
            sequence: SequenceTag | None = None  # a sequence model's (docs/sequences.md)
            text_outputs: list[str] = []  # the outputs rendered as JSON
            classes: dict[str, int] = {}  # outputs wanted as their top-k classes: k
            request_id: str | None = None
            names: list[str] = []
            flags: list[bool] | None = None  # each requested output's binary_data
            if header_length == 0:
                inputs = [self._raw_input(target, body)]
                all_binary = True
            else:
                parsed = None
                # (a body in a lease is a view of it)
                if (
                    header_length is None
                    and body.lease is not None
                    and isinstance(body.data, memoryview)
                ):
                    parsed = await self.dataplane.parse_json(
                        target, body.lease, body.start, body.data
                    )
                if parsed is not None:
                    request, texts = parsed
                else:
                    request = binary.decode_header(body.data, header_length)
                    texts = None
                inputs = self._inputs(request.inputs, body, header_length, owned, texts, request.id)
                all_binary = _flag(request.parameters, "binary_data_output", False, "the request")
                if request.outputs:  # (an empty list names none: every output, as gRPC's)
                    names = [o.name for o in request.outputs]
                    flags = [
                        self._output_flag(o, all_binary, into_regions, request.id, inputs)
                        for o in request.outputs
                    ]
                    text_outputs = [
                        name
                        for name, flag in zip(names, flags, strict=True)
                        if not flag and name not in into_regions
                    ]
                    classes = {o.name: count for o in request.outputs if (count := _class_count(o))}
                elif not all_binary:
                    text_outputs = target.output_names  # (shared: never changed)
                request_id = request.id
                parameters = request.parameters
                priority, timeout_us = schedule_parameters(parameters)
                # (a sequence model, or an ensemble with one)
                if sequence_params.takes_sequence(target):
                    sequence = sequence_params.from_json(parameters)
                if parameters:
                    check_request_parameters(parameters)
                    if sequence is None:  # checked all the same, as Triton's HTTP front does
                        sequence_params.from_json(parameters)
        except BaseException as exc:
            for held in [*owned, *into_regions.values()]:
                held.release()
            if target is not None:
                self.dataplane.refused(target, exc)
            raise
        watch = req.scope.get("extensions", NO_EXTENSIONS).get(ON_DISCONNECT)
        inference = Inference(
            target, inputs, names, owned, priority=priority, timeout_us=timeout_us, watch=watch,
            into_regions=into_regions, text_outputs=text_outputs, classification=classes,
            request_id=request_id or "",
        )  # fmt: skip
        inference.sequence = sequence
        result = await self.dataplane.infer(inference)
        printing = outputs_to_print(result, flags, all_binary)
        if printing:
            await print_in_steps(result, printing)
        render_infer(req, resp, result, request_id, flags, all_binary)

    def _output_flag(
        self,
        output: RequestOutput,
        all_binary: bool,
        into_regions: dict[str, RegionUse],
        request_id: str | None,
        inputs: list[InputTensor],
    ) -> bool:
        """Whether an output goes binary; one in a client's region is held in ``into_regions``."""
        where = f"output '{output.name}'"
        wanted = region_parameters(where, output.parameters)
        if wanted is None:
            return _flag(output.parameters, "binary_data", all_binary, where)
        if output.parameters and output.parameters.get("binary_data") is True:
            raise InvalidInput(f"{where} cannot be both in shared memory and binary_data")
        if output.name in into_regions:
            raise output_twice(inputs, output.name, request_id)
        into_regions[output.name] = self.dataplane.regions.use(wanted, where)
        return False

    def _raw_input(self, target: ModelVersion, body: Body) -> InputTensor:
        """The whole body as the model's one input (``Inference-Header-Content-Length: 0``)."""
        if len(target.inputs) != 1:
            raise InvalidInput(
                f"{request_tag(None)}Raw request must only have 1 input (found 1) to be "
                "deduced but got "
                f"{len(target.inputs)} inputs in '{target.name}' model configuration: "
                "a raw binary request (Inference-Header-Content-Length: 0) needs a model with "
                "exactly one input; it has " + ", ".join(f"'{spec.name}'" for spec in target.inputs)
            )
        spec = target.inputs[0]
        lease, start, nbytes = _lease_of(body), body.start, len(body.data)
        shape = binary.raw_input_shape(
            spec.name, spec.datatype, spec.shape, target.max_batch_size > 0, nbytes
        )
        if spec.datatype == "BYTES":
            # NOTE: the body is the one element; its length goes in the room read_body
            #   left before it (Triton prepends it too), so the bytes are not copied.
            if start < LENGTH_PREFIX.size:
                raise InternalError("a raw request body has no room for a BYTES length")
            start -= LENGTH_PREFIX.size
            LENGTH_PREFIX.pack_into(lease.buf, start, nbytes)
            nbytes += LENGTH_PREFIX.size
        return InputTensor(spec.name, spec.datatype, shape, located=(lease, start, nbytes))

    def _inputs(
        self,
        inputs: list[RequestInput],
        body: Body,
        header_length: int | None,
        owned: list[Lease | RegionUse] | None = None,
        texts: list[tuple[int, int] | None] | None = None,
        request_id: str | None = None,
    ) -> list[InputTensor]:
        """The request's inputs: binary chunks as spans of the body's lease, JSON as values,
        regions of clients' shared memory (each held in ``owned``).

        ``texts`` say where the inputs' ``data`` texts lie in the body (offset, length)
        when a worker parsed it (``json_offload``); the ``data`` of ``inputs`` is then
        a stand-in. A negative size in an input's shape is refused as Triton's HTTP front
        refuses it, as it reads the input (``unparsed_shape``; ``request_id``: the
        request's ``id``)."""
        if header_length is None:
            spans: list[tuple[int, int] | None] = [None] * len(inputs)
        else:
            spans = binary.chunk_spans(inputs, header_length, len(body.data))
        tensors: list[InputTensor] = []
        for index in range(len(inputs)):  # PERF: (mypyc) indexed: no iterators
            tensor, span = inputs[index], spans[index]
            unparsed = unparsed_shape(tensors, tensor.name, tensor.shape, request_id)
            if unparsed is not None:
                raise unparsed
            check_datatype(tensor.name, tensor.datatype)
            params = tensor.parameters
            if params is not None and wants_region(params):
                where = f"input '{tensor.name}'"
                wanted = region_request(where, params)
                if tensor.data is not msgspec.UNSET or binary.binary_size(tensor) is not None:
                    raise InvalidInput(
                        f"{where} names a shared memory region, so it must not carry data "
                        "('data' or binary_data_size)"
                    )
                use = self.dataplane.regions.use(wanted, where)
                if owned is not None:
                    owned.append(use)
                tensors.append(InputTensor(tensor.name, tensor.datatype, tensor.shape, region=use))
                continue
            if span is not None:
                located = (_lease_of(body), body.start + span[0], span[1])
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
            # NOTE: decoded by the data plane once the shape is checked; a JSON element
            #   takes at least 2 characters ("1,"), so the text bounds the element count.
            #   PERF: small data costs less to decode now than to defer.
            text: msgspec.Raw | memoryview = tensor.data
            text_at = None  # where the text lies in a pooled segment, for a worker
            text_span = texts[index] if texts is not None else None
            if text_span is not None:
                held = _lease_of(body)
                start, size = body.start + text_span[0], text_span[1]
                text = held.buf[start : start + size]
                text_at = (held, start, size)
            values: object
            if len(text) < EAGER_DATA:
                values = decode_data(tensor.name, tensor.datatype, text)
            else:
                load = partial(decode_data, tensor.name, tensor.datatype, text)
                values = Deferred(load, (len(text) + 1) // 2, text_at)
            tensors.append(InputTensor(tensor.name, tensor.datatype, tensor.shape, values=values))
        return tensors


def _lease_of(body: Body) -> Lease:
    """The lease of a body with binary chunks or with texts a worker found: ``read_body``
    receives every such body into one (a header length, or ``json_offload.PARSE_MIN``)."""
    if body.lease is None:
        raise InternalError("a binary or worker-parsed request body is not in a lease")
    return body.lease


#: JSON ``data`` shorter than this is decoded at once: deferring it costs more than
#: the decoding could waste (its size bounds that, and the body limit bounds the body).
EAGER_DATA: Final = 4096


def _flag(params: Mapping[str, object] | None, key: str, default: bool, where: str) -> bool:
    """A boolean request parameter such as ``binary_data``; 400 if it is not a JSON bool."""
    if not params or key not in params:
        return default
    value = params[key]
    if type(value) is not bool:
        raise InvalidInput(f"parameter '{key}' of {where} must be true or false, got {value!r}")
    return value


def _class_count(output: RequestOutput) -> int:
    """An output's ``classification`` parameter: how many classes; 0 when not asked for."""
    where = f"parameter 'classification' of output '{output.name}'"
    return unsigned(output.parameters, "classification", where) or 0
