"""What a request and its answer are, between the protocol fronts and the data plane.

REST and gRPC parse their wire format into ``InputTensor``s and hand them to the data
plane as one ``Inference``; the data plane answers with an ``InferResult`` whose
outputs are views of a worker's shared memory until it is released.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from oipserve.errors import InferenceFailed, InternalError, Unsupported
from oipserve.models.metadata import reshaped
from oipserve.wire.datatypes import element_count
from oipserve.wire.images import ImageSpec
from oipserve.wire.messages import TensorDesc
from oipserve.wire.shm import Lease

if TYPE_CHECKING:
    from oipserve.models.registry import ModelVersion
    from oipserve.request.client_regions import RegionUse
    from oipserve.request.sequence_params import SequenceTag

#: Registers a callback to run when the client goes away (REST: the connection closed);
#: what the callback returns is ignored (``Future.cancel``'s bool, for one).
Watch = Callable[[Callable[[], object]], None]
#: Told when a request starts waiting for a place that only another request frees (a
#: sequence's slot: the sequence batcher's backlog), ``(True, nbytes)``, and when it stops,
#: ``(False, nbytes)``, before it is answered; ``nbytes`` are its inputs' bytes. A
#: ModelStreamInfer stream does not count such a request against what it may hold
#: unanswered, so that it reads on to the request that frees the place.
Parked = Callable[[bool, int], None]

_EMPTY: Final = memoryview(b"")

__all__ = [
    "Inference",
    "InferResult",
    "InputTensor",
    "Located",
    "OutputTensor",
    "Parked",
    "client_outputs",
    "region_parameters_of",
    "scalar_rows",
    "scalar_split_refusal",
]


class Located(Protocol):
    """What a located input's bytes lie in: a pooled segment's ``Lease``, or an ensemble
    step's output (``dataplane.ensemble_tensors.Held``). Placement reads these two."""

    @property
    def name(self) -> str: ...

    @property
    def buf(self) -> memoryview: ...


class InputTensor:
    """One request input, as a protocol adapter parsed it.

    Exactly one of ``values`` (JSON / typed values), ``raw`` (bytes in this
    process's memory), ``located`` (bytes already in a pooled segment:
    lease, offset, size) and ``region`` (a client's registered shared memory)
    holds the data.
    """

    __slots__ = ("name", "datatype", "shape", "values", "raw", "located", "region", "image")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: list[int],
        *,
        values: object = None,
        raw: memoryview | bytes | None = None,
        located: tuple[Located, int, int] | None = None,
        region: RegionUse | None = None,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.values = values
        self.raw = raw
        self.located = located
        self.region = region
        #: Set by the data plane when the input is encoded images (see oipserve.request.images).
        self.image: ImageSpec | None = None


class Inference:
    """One inference request as a protocol adapter hands it to ``DataPlane.infer``.

    ``owned`` holds what the inputs' data lives in (leases of segments, uses of
    clients' regions): the data plane releases it once the worker is done reading.
    ``priority`` and ``timeout_us`` are the request's schedule-policy parameters (0:
    the model's defaults), and ``watch`` registers what to do if the client goes
    away: they matter for models with dynamic batching, whose requests may wait.
    ``into_regions`` holds the outputs to write into clients' shared-memory regions,
    released once the call returns. ``text_outputs`` names the outputs the client
    gets as JSON (a worker prints the large ones); ``classification`` maps outputs
    the client wants as their top-k classes to k (``oipserve.request.classification``).
    """

    __slots__ = (
        "model",
        "inputs",
        "output_names",
        "owned",
        "priority",
        "timeout_us",
        "watch",
        "into_regions",
        "text_outputs",
        "classification",
        "sequence",
        "deadline",
        "request_id",
        "parked",
    )

    def __init__(
        self,
        model: ModelVersion,
        inputs: list[InputTensor],
        output_names: list[str],
        owned: list[Lease | RegionUse],
        *,
        priority: int = 0,
        timeout_us: int = 0,
        watch: Watch | None = None,
        into_regions: dict[str, RegionUse] | None = None,
        text_outputs: list[str] | None = None,
        classification: dict[str, int] | None = None,
        request_id: str = "",
    ) -> None:
        self.model = model
        self.inputs = inputs
        self.output_names = output_names
        self.owned = owned
        self.priority = priority
        self.timeout_us = timeout_us
        self.watch = watch
        self.into_regions: dict[str, RegionUse] = into_regions or {}
        self.text_outputs = text_outputs
        self.classification: dict[str, int] = classification or {}
        #: A sequence model's request: its sequence (set by the front, None otherwise).
        self.sequence: SequenceTag | None = None
        #: When (loop time) the client stops waiting, if it said (a gRPC call's
        #: ``grpc-timeout``): the request's deadline is the earliest of this,
        #: ``timeout_us`` and ``--infer-timeout`` (``Intake.deadline``).
        self.deadline: float | None = None
        #: The request's ``id`` ("" without one): Triton's refusals name it
        #: (``errors.request_tag``); an ensemble's steps carry their request's.
        self.request_id = request_id
        #: Told while the request waits for a sequence slot (a stream's requests: ``Parked``).
        self.parked: Parked | None = None


class OutputTensor:
    __slots__ = ("name", "datatype", "shape", "data", "text", "parts", "region", "region_bytes")

    def __init__(
        self, name: str, datatype: str, shape: list[int], data: memoryview, text: bool = False
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        #: The tensor's bytes (BYTES: length-prefixed) in the worker's output segment;
        #: empty when the tensor went into a client's region.
        self.data = data
        #: True when ``data`` holds the JSON text of the values (flat) instead: the
        #: worker printed a large output the client asked to get as JSON.
        self.text = text
        #: The JSON text in parts, when the front printed it a step at a time
        #: (``rest.render.print_in_steps``); ``data`` is then not read.
        self.parts: list[bytes] | None = None
        #: The client's region the tensor was written into, and how many bytes it took.
        self.region: RegionUse | None = None
        self.region_bytes = 0

    def put_in_region(self, use: RegionUse, nbytes: int) -> None:
        self.region = use
        self.region_bytes = nbytes
        self.data = _EMPTY

    @property
    def count(self) -> int:
        return element_count(self.shape)


def region_parameters_of(tensor: OutputTensor) -> dict[str, str | int]:
    """The parameters a response gives an output written into a client's region."""
    use = tensor.region
    if use is None:
        raise InternalError(f"output '{tensor.name}' was not written into a client's region")
    params: dict[str, str | int] = {
        "shared_memory_region": use.region.name,
        "shared_memory_byte_size": tensor.region_bytes,
    }
    if use.relative:
        params["shared_memory_offset"] = use.relative
    return params


def scalar_rows(name: str, dims: tuple[int, ...], rows: int) -> list[int]:
    """The shape of a batching model's output that the model made a scalar (its config
    ``dims``: 1s) for a request of ``rows`` rows, as Triton's ONNX Runtime backend answers
    it: the dims with the first made the request's batch size, which the one value can
    only be for a batch of 1; past that Unsupported, in the words of its output responder
    (``BackendOutputResponder::ProcessTensor``; 501 / UNIMPLEMENTED there and here)."""
    if rows > 1:
        raise scalar_split_refusal(name, rows)
    return [rows, *dims[1:]]


def scalar_split_refusal(name: str, rows: int) -> Unsupported:
    """Why output ``name``, one value for the whole run, cannot be answered to a request
    whose rows end at ``rows`` of the batch (``scalar_rows``)."""
    return Unsupported(
        f"failed to split the output tensor '{name}' in responses: expected batch size of "
        f"at least {rows} in model output, got 1: the model makes output '{name}' a scalar, "
        "one value for the whole batch, so only a batch of 1 can be answered (its "
        "config.pbtxt gives max_batch_size > 0)"
    )


class InferResult:
    """Outputs that live in a worker's shared memory until ``release``."""

    __slots__ = ("model", "outputs", "_release")

    def __init__(
        self, model: ModelVersion, outputs: list[OutputTensor], release: Callable[[], None]
    ) -> None:
        self.model = model
        self.outputs = outputs
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        """Give the output segment back to the worker; call once nothing reads it."""
        release, self._release = self._release, None
        if release is not None:
            release()


def client_outputs(
    model: ModelVersion, pieces: list[tuple[TensorDesc, memoryview]], rows: int = 1
) -> list[OutputTensor]:
    """The outputs a worker described, as clients see them (config.pbtxt ``dims``);
    ``rows``: the request's batch size (one request's outputs)."""
    return [
        OutputTensor(
            desc.name,
            desc.datatype,
            _client_shape(model, desc.name, desc.shape, rows),
            data,
            desc.text,
        )
        for desc, data in pieces
    ]


def _client_shape(model: ModelVersion, name: str, shape: list[int], rows: int) -> list[int]:
    """An output's shape as clients see it: config.pbtxt ``dims`` when it has a reshape, or
    when the model made a scalar of an output whose dims are 1s (``[1]`` as auto-complete
    lists it): Triton's ONNX Runtime backend answers a scalar with them (its
    ``scalar_outputs_``), the first one the request's batch size for a model that batches
    (``scalar_rows``)."""
    spec = model.output_map.get(name)
    if spec is None:
        return shape
    if spec.model_shape is None:
        if shape or not spec.shape:
            return shape
        if model.max_batch_size > 0:
            dims = spec.shape[1:]
            if dims and all(dim == 1 for dim in dims):
                return scalar_rows(name, dims, rows)
        elif all(dim == 1 for dim in spec.shape):
            return list(spec.shape)
        return shape
    try:
        return reshaped(shape, spec.model_shape, spec.shape)
    except ValueError:
        raise InferenceFailed(
            f"model '{model.name}' produced output '{name}' with shape {shape}, which does not "
            f"fit its config.pbtxt reshape {list(spec.model_shape)}"
        ) from None
