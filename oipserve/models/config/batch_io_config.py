"""Ragged batching in config.pbtxt: ``allow_ragged_batch``, ``batch_input``, ``batch_output``.

Triton's ragged batching (docs/scheduler.md, "Ragged batching"): requests whose shapes of
an input marked ``allow_ragged_batch`` differ may share a batch; the model gets that input
as one flat dimension (the requests' elements one after another), plus the ``batch_input``
tensors the server makes to describe the batch (element counts, their running sums, item
shapes), and a ``batch_output`` of kind ``BATCH_SCATTER_WITH_INPUT_SHAPE`` is cut back into
one piece per request, shaped like that request's source input.

``batch_io`` reads those fields once, at load, into a ``BatchIO`` (None when a model uses
none of them, so that the ordinary batched path stays as it is) and refuses a malformed
one with Triton's words (``ValidateBatchIO``, model_config_utils.cc) and the model's name,
or with a reason of ours where Triton would fail later, per request.
"""

from __future__ import annotations

from typing import Any

import msgspec

from oipserve.grpc_generated import model_config_pb2 as mc

__all__ = ["BatchIO", "BatchIOError", "BatchInputSpec", "BatchOutputSpec", "batch_io"]

#: The batch input kinds Triton defines (model_config.proto ``BatchInput.Kind``).
BATCH_INPUT_KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)
SCATTER = "BATCH_SCATTER_WITH_INPUT_SHAPE"


class BatchIOError(ValueError):
    """A ``batch_input`` / ``batch_output`` Triton (or oipserve) refuses at load."""


class BatchInputSpec(msgspec.Struct, frozen=True):
    """One ``batch_input``: a tensor the server makes per batch, fed to each target."""

    kind: str
    targets: tuple[str, ...]
    #: "INT32" or "FP32" (Triton allows only these).
    datatype: str
    source: str


class BatchOutputSpec(msgspec.Struct, frozen=True):
    """One ``batch_output``: each target output scattered with the source input's shapes."""

    kind: str
    targets: tuple[str, ...]
    source: str


class BatchIO(msgspec.Struct, frozen=True):
    """What the batches of a model with ragged batching are made of."""

    #: Inputs with ``allow_ragged_batch: true`` (given to the model flat).
    ragged: tuple[str, ...] = ()
    inputs: tuple[BatchInputSpec, ...] = ()
    outputs: tuple[BatchOutputSpec, ...] = ()

    @property
    def generated(self) -> frozenset[str]:
        """The model inputs the server makes (every batch input's targets)."""
        return frozenset(t for spec in self.inputs for t in spec.targets)

    @property
    def scattered(self) -> frozenset[str]:
        """The outputs cut by a source input's shapes."""
        return frozenset(t for spec in self.outputs for t in spec.targets)


def _batch_input(entry: Any, inputs: dict[str, Any], taken: set[str]) -> BatchInputSpec:
    kind = mc.BatchInput.Kind.Name(entry.kind)
    if len(entry.source_input) != 1:
        raise BatchIOError(
            f"batch input kind '{kind}' expects 1 source input, got {len(entry.source_input)}"
        )
    if entry.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
        raise BatchIOError("batch input data type must be TYPE_INT32 or TYPE_FP32")
    source = entry.source_input[0]
    if source not in inputs:
        raise BatchIOError(f"unknown source input name '{source}'")
    if inputs[source].optional:
        raise BatchIOError(
            f"batch input kind '{kind}': source input '{source}' is optional, but every "
            "request of a batch must give it"
        )
    if not entry.target_name:
        raise BatchIOError(f"batch input kind '{kind}' names no target_name (the model input)")
    for target in entry.target_name:
        if target in inputs:
            raise BatchIOError(
                f"batch input target '{target}' is also a configured input: the server makes "
                "it, a request cannot give it"
            )
        if target in taken:
            raise BatchIOError(f"batch input target '{target}' can only be specified once")
        taken.add(target)
    datatype = "INT32" if entry.data_type == mc.TYPE_INT32 else "FP32"
    return BatchInputSpec(kind, tuple(entry.target_name), datatype, source)


def _batch_output(
    entry: Any, inputs: dict[str, Any], outputs: dict[str, Any], taken: set[str]
) -> BatchOutputSpec:
    kind = mc.BatchOutput.Kind.Name(entry.kind)
    if len(entry.source_input) != 1:
        raise BatchIOError(
            f"batch output kind '{kind}' expects 1 source input, got {len(entry.source_input)}"
        )
    source = entry.source_input[0]
    if source not in inputs:
        raise BatchIOError(f"unknown source input name '{source}'")
    for target in entry.target_name:
        if target not in outputs:
            raise BatchIOError(f"unknown target output name '{target}'")
        if target in taken:
            raise BatchIOError(f"target output name '{target}' can only be specified once")
        taken.add(target)
        if outputs[target].data_type == mc.TYPE_STRING:
            raise BatchIOError(
                f"batch output target '{target}' is TYPE_STRING: only fixed-size outputs can "
                "be scattered"
            )
    return BatchOutputSpec(kind, tuple(entry.target_name), source)


def batch_io(config: Any) -> BatchIO | None:
    """The ragged batching of a parsed ``inference.ModelConfig``; None when it has none.

    BatchIOError (to be suffixed " for <model>") when a ``batch_input`` or
    ``batch_output`` is malformed. ``allow_ragged_batch`` without a batch dimension
    (``max_batch_size: 0``) changes nothing: no request joins another.
    """
    batched = config.max_batch_size > 0
    ragged = tuple(i.name for i in config.input if i.allow_ragged_batch) if batched else ()
    if not (ragged or config.batch_input or config.batch_output):
        return None
    if config.HasField("sequence_batching"):
        raise BatchIOError(
            "ragged batching (allow_ragged_batch, batch_input, batch_output) is not supported "
            "with sequence_batching"
        )
    if not batched:
        raise BatchIOError(
            "batch_input and batch_output describe the requests of a batch: they need "
            "max_batch_size > 0"
        )
    inputs = {i.name: i for i in config.input}
    outputs = {o.name: o for o in config.output}
    taken: set[str] = set()
    made = tuple(_batch_input(e, inputs, taken) for e in config.batch_input)
    taken = set()
    scattered = tuple(_batch_output(e, inputs, outputs, taken) for e in config.batch_output)
    return BatchIO(ragged, made, scattered)


def graph_problem(io: BatchIO, graph: dict[str, tuple[str, tuple[int, ...]]]) -> str | None:
    """What in the ONNX graph's inputs (name -> datatype, shape) does not fit ``io``.

    Each batch input target must be a graph input of its data type, and each ragged
    input a graph input of one dimension: ONNX Runtime gets it flat, as Triton's ONNX
    Runtime backend gives it.
    """
    for spec in io.inputs:
        for target in spec.targets:
            if target not in graph:
                return f"batch input target '{target}' is not an input of the ONNX graph"
            if graph[target][0] != spec.datatype:
                return (
                    f"batch input target '{target}' is {spec.datatype} in config.pbtxt but "
                    f"{graph[target][0]} in the ONNX graph"
                )
    for name in io.ragged:
        shape = graph[name][1] if name in graph else ()
        if len(shape) > 1:
            return (
                f"input '{name}' allows ragged batches: the model gets it flat (one "
                f"dimension), but the ONNX graph has shape {list(shape)}"
            )
    return None
