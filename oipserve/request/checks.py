"""A request checked against its model before any of its data is decoded or placed.

``check_request`` is step 2 of the inference path (``oipserve.dataplane.plane``): the
request's inputs and requested outputs against the model's metadata in Triton's order
(``check_inputs``: duplicates, the outputs, the input count, names and batch dimensions,
the batch size, datatypes and shapes); only then each input's byte size and host data
(``placement.payload``), so what a request costs is decided before it is paid.
``output_targets`` does the same for outputs a client wants in its shared memory.

An output region may overlap an input region (one region used in place): the worker then
computes every output before it writes any (``workers.outputs``). Two outputs whose rooms
overlap are refused: one would be written over the other, and the client would read
whichever came last (docs/shared-memory.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from oipserve.errors import InvalidInput, RequestRefusal, request_tag
from oipserve.models.metadata import TensorSpec, reshaped
from oipserve.models.registry import ModelVersion
from oipserve.request.images import image_target
from oipserve.request.inference import InputTensor
from oipserve.request.placement import Placement, image_payload_of, payload
from oipserve.wire.datatypes import ELEMENT_SIZES, element_count
from oipserve.wire.messages import OutputTarget

if TYPE_CHECKING:
    from oipserve.request.client_regions import RegionUse

__all__ = [
    "check_inputs",
    "check_request",
    "dims_text",
    "output_targets",
    "output_twice",
    "rows_of",
    "unparsed_shape",
]

#: Triton's bound on an input's element count and byte size (int64_t).
INT64_MAX: Final = 2**63 - 1
#: Element counts up to this fit in int64 bytes for every datatype (8 bytes at most).
OVERFLOW_BOUND: Final = INT64_MAX // max(ELEMENT_SIZES.values())


def check_request(
    model: ModelVersion, inputs: list[InputTensor], output_names: list[str]
) -> list[Placement]:
    """Validate against the model (``check_inputs``); returns (input, shape for the model,
    nbytes, host data or None) each. Optional inputs a request leaves out get no entry:
    ONNX Runtime then uses the graph's initializer for them."""
    specs = check_inputs(model, inputs, output_names)
    # NOTE: every input is checked before any input's data is decoded (payload,
    #   image_payload_of): what a request costs is decided before it is paid.
    placements: list[Placement] = []
    for index in range(len(inputs)):  # PERF: (mypyc) an indexed loop, not zip
        tensor, model_shape = inputs[index], specs[index].model_shape
        shape = tensor.shape
        if tensor.image is not None:
            nbytes, data = image_payload_of(tensor, model.name)
        else:
            if model_shape is not None:
                shape = reshaped(shape, specs[index].shape, model_shape)
            nbytes, data = payload(tensor, model.name)
        placements.append((tensor, shape, nbytes, data))
    return placements


def check_inputs(
    model: ModelVersion, inputs: list[InputTensor], output_names: list[str], images: bool = True
) -> list[TensorSpec]:
    """The request's inputs and requested outputs checked against ``model`` in Triton's
    order, so that a request with several faults is refused for the one Triton names: its
    HTTP and gRPC fronts add each input, then each output, to the request (1, 2), then
    core's ``InferenceRequest::Normalize`` checks the rest (3 to 7; docs/protocol.md has
    the table). The specs of the inputs, in the request's order. Every model's checks and
    an ensemble's (``dataplane.ensemble``: ``images`` False, its inputs are never encoded
    images). The refusals Triton's core gives with the request's id are RequestRefusal:
    the caller puts the id first (``RequestRefusal.of_request``).
    """
    # 1. each input once, its element count and bytes within int64 (Triton's fronts)
    seen: set[str] = set()
    for tensor in inputs:
        _check_added(tensor, seen)
    # 2. each output once (Triton's fronts); 3. each one the model's (Normalize)
    check_output_names(model, output_names)
    # 4. as many inputs as the model takes (ValidateRequestInputs)
    _check_count(model, inputs, seen)
    # 5. each input the model's, and, for a model that batches, of one batch size
    specs: list[TensorSpec] = []
    batch: int | None = None
    for tensor in inputs:
        specs.append(input_spec(model, tensor))
        batch = batch_so_far(model, tensor, batch)
    if len(inputs) < len(model.input_map):
        _check_required(model, inputs, seen)
    # 6. the batch size within max_batch_size (a negative one too: Triton's is unsigned)
    if batch is not None and not 0 <= batch <= model.max_batch_size:
        raise RequestRefusal(
            f"inference request batch-size must be <= {model.max_batch_size} for "
            f"'{model.name}': input '{inputs[0].name}' has batch size {batch}"
        )
    # 7. each input's datatype and shape (an image input: its own checks)
    for index in range(len(inputs)):
        tensor, spec = inputs[index], specs[index]
        tensor.image = image_target(model, spec, tensor) if images else None
        if tensor.image is None:
            check_datatype(model, tensor, spec)
            _check_shape(model, tensor, spec)
    return specs


def output_twice(inputs: list[InputTensor], name: str, request_id: str | None) -> InvalidInput:
    """The refusal of a request asking for output ``name`` twice into shared memory, which
    a front finds as it reads the outputs (it holds each one's region): the inputs' own
    first check (``_check_added``) comes first, as Triton's fronts add every input before
    any output; then Triton's words for the output (its ``AddRequestedOutput``)."""
    first = _first_added_fault(inputs, request_id)
    if first is not None:
        return first
    return InvalidInput(
        f"{request_tag(request_id)}output '{name}' already exists in request: it is requested twice"
    )


def unparsed_shape(
    before: list[InputTensor], name: str, shape: Sequence[int], request_id: str | None
) -> InvalidInput | None:
    """REST: the refusal of input ``name`` when its ``shape`` has a negative size, -1
    included, or None. Triton's HTTP front reads each size as an unsigned integer as it
    adds the input, so it refuses such a shape in its own words (a 500 there, a 400
    here) before core sees the request, after the inputs ``before`` it were added: their
    own first check (``_check_added``) comes first. gRPC keeps core's words
    (``_check_shape``)."""
    for index in range(len(shape)):  # PERF: (mypyc) indexed: no iterator, one comparison a size
        if shape[index] < 0:
            return _unparsed(before, name, shape, request_id)
    return None


def _unparsed(
    before: list[InputTensor], name: str, shape: Sequence[int], request_id: str | None
) -> InvalidInput:
    first = _first_added_fault(before, request_id)
    if first is not None:
        return first
    return InvalidInput(
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
        f"unsigned-integer: input '{name}' has a negative size in its shape {list(shape)} "
        "(each size of a request's shape is 0 or more; -1, any size, is for a model's dims)"
    )


def _first_added_fault(inputs: list[InputTensor], request_id: str | None) -> InvalidInput | None:
    """The refusal of the first of ``inputs`` that its own first check (``_check_added``)
    refuses, as Triton's fronts refuse it when they add it to the request; None if none."""
    seen: set[str] = set()
    try:
        for tensor in inputs:
            _check_added(tensor, seen)
    except RequestRefusal as exc:
        return exc.of_request(request_id or "")
    except InvalidInput as exc:
        return exc
    return None


def _check_added(tensor: InputTensor, seen: set[str]) -> None:
    """InvalidInput for an input the request gives twice (``seen``: the names before it)
    or whose element count or byte size passes int64, as Triton's fronts refuse them when
    they add it to the request (L0_http test_buffer_size_overflow)."""
    if tensor.name in seen:
        raise RequestRefusal(
            f"input '{tensor.name}' already exists in request: it is given more than once"
        )
    seen.add(tensor.name)
    count = 1
    for dim in tensor.shape:
        if dim < 0:
            return
        count *= dim
    # PERF: one comparison on a normal request; the exact checks only past the bound no
    #   datatype can reach.
    if count > OVERFLOW_BOUND:
        _check_overflow(tensor, count)


def input_spec(model: ModelVersion, tensor: InputTensor) -> TensorSpec:
    """The model's spec of input ``tensor``: InvalidInput for an input the model does not
    have."""
    spec = model.input_map.get(tensor.name)
    if spec is None:
        raise InvalidInput(
            f"unexpected inference input '{tensor.name}' for model '{model.name}' "
            f"(its inputs: {', '.join(model.input_map)})"
        )
    return spec


def check_datatype(model: ModelVersion, tensor: InputTensor, spec: TensorSpec) -> None:
    if tensor.datatype != spec.datatype:
        raise RequestRefusal(
            f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
            f"'{model.name}' expects '{spec.datatype}'"
        )


def dims_text(dims: Sequence[int]) -> str:
    """Dimensions as Triton writes them in its refusals: ``[-1,16]``."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def missing_inputs(
    model: ModelVersion, given: Sequence[str], missing: Sequence[str]
) -> RequestRefusal:
    """The refusal of a request that leaves out ``missing`` required inputs, in Triton's
    words (its clients and QA tests match them: qa/L0_input_validation)."""
    total = len(model.input_map)
    required = _required_count(model)
    wanted = (
        f"expected {total} inputs"
        if required == total
        else f"expected number of inputs between {required} and {total}"
    )
    return RequestRefusal(
        f"{wanted} but got {len(given)} inputs for model '{model.name}'. Got input(s) "
        f"{_names_text(given)}, but missing required input(s) {_names_text(missing)}. "
        "Please provide all required input(s)."
    )


def _required_count(model: ModelVersion) -> int:
    return sum(1 for spec in model.input_map.values() if not spec.optional)


def _check_count(model: ModelVersion, inputs: list[InputTensor], seen: set[str]) -> None:
    """InvalidInput, as Triton's ValidateRequestInputs, when the request gives more inputs
    than the model has, or fewer than it requires (``seen``: the request's names)."""
    given, total = len(inputs), len(model.input_map)
    # PERF: the required inputs counted only when some input is left out
    if given > total or (given < total and given < _required_count(model)):
        _check_required(model, inputs, seen)
        raise missing_inputs(model, [tensor.name for tensor in inputs], [])
    if given == 0 and model.max_batch_size > 0:
        # NOTE: a model whose inputs are all optional runs with none, as Triton runs it;
        #   but Triton gives such a request batch size 0, which means nothing to a batch.
        raise InvalidInput(
            f"a request to model '{model.name}' must give at least one of its inputs: the "
            "model batches, and a request's batch size is its inputs' first dimension"
        )


def _check_required(model: ModelVersion, inputs: list[InputTensor], seen: set[str]) -> None:
    """InvalidInput when a required input is not among ``seen`` (the request's)."""
    missing = [n for n, s in model.input_map.items() if n not in seen and not s.optional]
    if missing:
        raise missing_inputs(model, [tensor.name for tensor in inputs], missing)


def _names_text(names: Sequence[str]) -> str:
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def batch_so_far(model: ModelVersion, tensor: InputTensor, batch: int | None) -> int | None:
    """The request's batch size (None: not known yet) with input ``tensor`` checked: its
    first dimension must be the inputs' before it, for a model that batches (Triton's
    words). ONNX Runtime broadcast one input over the other's rows and answered 200, and
    an ensemble ran each step on its own batch (found by fuzzing)."""
    if model.max_batch_size <= 0:
        return batch
    if not tensor.shape:
        raise RequestRefusal(
            f"input '{tensor.name}' has no shape but model requires batch dimension for "
            f"'{model.name}'"
        )
    if batch is not None and tensor.shape[0] != batch:
        raise RequestRefusal(
            f"input '{tensor.name}' batch size does not match other inputs for '{model.name}'"
        )
    return tensor.shape[0]


def rows_of(model: ModelVersion, shape: Sequence[int]) -> int:
    """A request's batch size from one of its inputs' shape (they agree: ``batch_so_far``):
    its first dimension for a model that batches, else 1."""
    return shape[0] if model.max_batch_size > 0 and shape else 1


def check_output_names(model: ModelVersion, output_names: list[str]) -> None:
    """The requested outputs: each once (in the request's order, as Triton's fronts add
    them), then each one of the model's (the first in name order, as Triton's core walks
    them): InvalidInput otherwise."""
    wanted: set[str] = set()
    unknown = False
    for name in output_names:
        if name in wanted:
            raise RequestRefusal(
                f"output '{name}' already exists in request: it is requested twice"
            )
        wanted.add(name)
        unknown = unknown or name not in model.output_map
    if unknown:
        name = min(name for name in wanted if name not in model.output_map)
        raise InvalidInput(
            f"unexpected inference output '{name}' for model '{model.name}' "
            f"(its outputs: {', '.join(model.output_map)})"
        )


def output_targets(
    model: ModelVersion, inputs: list[InputTensor], into: dict[str, RegionUse]
) -> list[OutputTarget]:
    """Where the worker writes each output a client wants in its region.

    When the output's shape follows from the model's metadata (every dim fixed but the
    batch dim, which the request gives), a region too small for it is refused now,
    before the model runs, and the worker is told the shape (ONNX Runtime then writes
    into the region directly); otherwise the worker checks the size after the run.
    """
    _check_apart(into)
    batch = inputs[0].shape[0] if model.max_batch_size > 0 and inputs[0].shape else None
    targets = []
    for name, use in into.items():
        spec = model.output_map[name]
        dims = list(spec.shape)
        if model.max_batch_size > 0 and dims and dims[0] == -1:
            dims[0] = batch if batch is not None else -1
        shape: list[int] | None = None  # (None: the worker checks the size after the run)
        if all(d >= 0 for d in dims) and spec.datatype != "BYTES":
            nbytes = ELEMENT_SIZES[spec.datatype] * element_count(dims)
            if nbytes > use.nbytes:
                raise InvalidInput(use.too_small(f"output '{name}'", nbytes))
            shape = dims
            if spec.model_shape is not None:
                shape = reshaped(dims, spec.shape, spec.model_shape)
        targets.append(OutputTarget(name, use.region.ref, use.offset, use.nbytes, shape))
    return targets


def _check_apart(into: dict[str, RegionUse]) -> None:
    """400 when two outputs' rooms overlap in one client object (compared by identity, so
    two region names over one object count as one object); touching ranges are apart."""
    placed: list[tuple[str, tuple[int, int], int, int]] = []
    for name, use in into.items():
        ref = use.region.ref
        key, start, end = (ref.dev, ref.ino), use.offset, use.offset + use.nbytes
        for other, other_key, first, last in placed:
            if key == other_key and start < last and first < end:
                raise InvalidInput(
                    f"outputs '{other}' and '{name}' overlap in shared memory object "
                    f"'{ref.name}' (bytes {first}-{last - 1} and {start}-{end - 1} of the "
                    "object): one would be written over the other; give each output its "
                    "own bytes"
                )
        if end > start:
            placed.append((name, key, start, end))


def _check_shape(model: ModelVersion, tensor: InputTensor, spec: TensorSpec) -> None:
    """The input's shape against the model's (-1: any size), as Triton walks it: the first
    dimension that differs makes it another shape; a -1 before it, a shape not given; a
    size below -1 where the model takes any size, an invalid dimension (core's byte size
    of the shape, reshaped: ``_invalid_dimension``)."""
    shape, expected = tensor.shape, spec.shape
    fits = len(shape) == len(expected)
    negative = False
    if fits:
        for index in range(len(shape)):  # PERF: (mypyc) an indexed loop, not zip
            got, want = shape[index], expected[index]
            if got == -1:
                raise RequestRefusal(
                    f"All input dimensions should be specified for input '{tensor.name}' for "
                    f"model '{model.name}', got {dims_text(shape)}: -1 stands for any size in "
                    "a model's dims, not in a request's"
                )
            if want != -1 and got != want:
                fits = False
                break
            negative = negative or got < 0
    if not fits:
        raise RequestRefusal(
            f"unexpected shape for input '{tensor.name}' for model '{model.name}'. Expected "
            f"{dims_text(expected)}, got {dims_text(shape)} (-1 may be any size)"
        )
    if negative:
        raise _invalid_dimension(tensor, spec)


def _invalid_dimension(tensor: InputTensor, spec: TensorSpec) -> InvalidInput:
    """Triton's words for a size below -1 that the model's shape let through (core's
    GetByteSize, or for BYTES GetElementCount, of the shape as the model sees it: after
    ``reshape``; no request id), then ours. Triton's HTTP front never gets that far: it
    cannot parse a negative size ('Unable to parse 'shape'', a 500)."""
    shape = dims = list(tensor.shape)
    if spec.model_shape is not None:
        try:
            dims = reshaped(shape, spec.shape, spec.model_shape)
        except ValueError:  # (a negative size does not divide as a reshape's would)
            dims = shape
    where = "in shape " if tensor.datatype == "BYTES" else ""
    return InvalidInput(
        f"tensor '{tensor.name}' contains an invalid dimension {where}{dims_text(dims)}: "
        f"input '{tensor.name}' has a negative dimension in {shape}"
    )


def _check_overflow(tensor: InputTensor, count: int) -> None:
    """400 in Triton's words (its QA tests match them) when ``count`` elements, or their
    bytes, pass int64: no tensor that large can exist, whatever the data sent."""
    shape = tensor.shape
    if count > INT64_MAX:
        dims = ",".join(str(d) for d in shape)
        raise InvalidInput(
            f"invalid shape for input '{tensor.name}': shape [{dims}] causes total element "
            f"count to exceed maximum size of {INT64_MAX}: its dimensions multiply to {count} "
            "elements"
        )
    size = ELEMENT_SIZES.get(tensor.datatype, 1)  # (BYTES: sized by its data, as Triton)
    if count * size > INT64_MAX:
        raise InvalidInput(
            f"byte size overflow for input '{tensor.name}': element count ({count}) * data "
            f"type size ({size}) exceeds maximum allowed size ({INT64_MAX}): shape "
            f"{list(shape)} of {tensor.datatype} would take {count * size} bytes"
        )
