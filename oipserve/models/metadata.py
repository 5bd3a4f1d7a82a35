"""A model's tensor metadata: the ONNX graph's, refined by config.pbtxt.

Clients see the config's ``dims`` (Triton's rule); the model may see another shape,
its ``reshape``. Both get the batch dimension (-1) in front when max_batch_size > 0.
``reshaped`` turns one shape into the other for a request (inputs) or a reply
(outputs).
"""

from __future__ import annotations

import math

import msgspec

from oipserve.models.config import padding_config
from oipserve.models.config.batch_io_config import graph_problem
from oipserve.models.config.parse import ModelConfig, TensorConfig
from oipserve.models.config.sequence import graph_problem as sequence_graph_problem
from oipserve.wire.messages import Loaded, TensorMeta

__all__ = ["MetadataConflict", "TensorSpec", "merge_metadata", "reshaped"]


class MetadataConflict(ValueError):
    """config.pbtxt and the ONNX graph disagree: the model cannot be served as configured."""


class TensorSpec(msgspec.Struct, frozen=True):
    """One input or output as clients see it (``shape``, -1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    #: The shape the model sees when config.pbtxt gives a ``reshape``; else None.
    model_shape: tuple[int, ...] | None = None
    #: An input a request may leave out (config.pbtxt ``optional``).
    optional: bool = False
    #: An output's class labels (config.pbtxt ``label_filename``), for classification.
    labels: tuple[str, ...] = ()


def reshaped(shape: list[int], pattern: tuple[int, ...], target: tuple[int, ...]) -> list[int]:
    """``shape`` (which fits ``pattern``) laid out as ``target``.

    The -1s of ``target`` take, in order, the sizes ``shape`` has where ``pattern``
    has -1 (the batch dimension first); config loading checked that both have as
    many -1s and that their fixed sizes have the same product. ValueError if
    ``shape`` does not fit ``pattern``.
    """
    if len(shape) != len(pattern):
        raise ValueError(f"shape {shape} does not have the rank of {list(pattern)}")
    free = iter([got for got, want in zip(shape, pattern, strict=True) if want == -1])
    out = [next(free) if dim == -1 else dim for dim in target]
    if math.prod(out) != math.prod(shape):
        raise ValueError(f"shape {shape} does not hold the elements of {out}")
    return out


def _spec(meta: TensorMeta) -> TensorSpec:
    return TensorSpec(meta.name, meta.datatype, tuple(meta.shape))


def _refine(
    kind: str,
    graph: list[TensorSpec],
    declared: tuple[TensorConfig, ...],
    batched: bool,
    defaults: dict[str, TensorSpec] | None = None,
    filled: frozenset[str] = frozenset(),
    flat: frozenset[str] = frozenset(),
    model: str = "",
) -> tuple[TensorSpec, ...]:
    by_name = {t.name: t for t in graph}
    if kind == "input":
        # NOTE: none declared too (auto-complete off, or a graph without inputs): Triton
        #   counts 0 against the graph's.
        _check_count(model, by_name, declared, filled)
    if not declared:
        return tuple(t for t in graph if t.name not in filled)
    batch = (-1,) if batched else ()
    refined = []
    for entry in declared:
        dims = (*batch, *entry.dims)
        model_shape = None if entry.reshape is None else (*batch, *entry.reshape)
        actual = by_name.get(entry.name)
        default = (defaults or {}).get(entry.name)
        optional = False
        if actual is None and entry.optional and default is not None:
            # NOTE: ONNX Runtime lists a graph input that has an initializer (a default
            #   value) apart from the required ones; a request may feed or omit it.
            actual, optional = default, True
        elif actual is None:
            allowed = ", ".join(sorted({*by_name, *(defaults or {})}))
            ours = (
                f"config.pbtxt declares input '{entry.name}' optional, but the ONNX graph has "
                "no input with a default value (an initializer) of that name"
                if entry.optional
                else f"config.pbtxt declares {kind} '{entry.name}' but the ONNX graph has "
                f"{sorted(by_name)}"
            )
            raise MetadataConflict(
                f"unexpected inference {kind} '{entry.name}', allowed {kind}s are: {allowed}; "
                + ours
            )
        elif entry.optional:
            raise MetadataConflict(
                f"config.pbtxt declares input '{entry.name}' optional, but the ONNX graph "
                "requires it: only a graph input with an initializer (a default value) can "
                "be left out"
            )
        if entry.data_type != actual.datatype:
            raise MetadataConflict(
                f"config.pbtxt says {kind} '{entry.name}' is {entry.data_type} but the "
                f"ONNX graph says {actual.datatype}"
            )
        # NOTE: ragged inputs and scattered outputs: the model sees them flat
        #   (batch_io_config.graph_problem checks the graph's side).
        if entry.name in flat:
            seen_by_model = dims
        else:
            seen_by_model = _merge_dims(
                kind, entry.name, model_shape or dims, actual.shape, (model, batched)
            )
        shape = dims if model_shape is not None else seen_by_model
        refined.append(
            TensorSpec(entry.name, entry.data_type, shape, model_shape, optional, entry.labels)
        )
    if kind == "input":
        # NOTE: the inputs a sequence batcher fills (controls, states) are the server's.
        missing = sorted(set(by_name) - {t.name for t in refined} - filled)
        if missing:
            raise MetadataConflict(f"config.pbtxt leaves out graph inputs {missing}")
    return tuple(refined)


def _check_count(
    model: str,
    graph: dict[str, TensorSpec],
    declared: tuple[TensorConfig, ...],
    filled: frozenset[str],
) -> None:
    """Triton's ONNX Runtime backend counts a configuration's inputs that are not optional
    (and the ones its batchers fill) against the graph's required inputs before it looks
    at any (``ValidateInputs``): a count that differs is refused in its words, then ours."""
    expected = sum(not e.optional for e in declared) + len(filled & graph.keys())
    if expected == len(graph):
        return
    unknown = [e.name for e in declared if e.name not in graph and not e.optional]
    missing = sorted(set(graph) - {e.name for e in declared} - filled)
    ours = [
        f"config.pbtxt declares input '{e.name}' optional, but the ONNX graph requires it: "
        "only a graph input with an initializer (a default value) can be left out"
        for e in declared
        if e.name in graph and e.optional
    ]
    if unknown:
        ours.append(f"config.pbtxt declares inputs {unknown} the ONNX graph does not have")
    if missing:
        ours.append(f"config.pbtxt leaves out graph inputs {missing}")
    raise MetadataConflict(
        f"unable to load model '{model}', configuration expects {expected} inputs, model "
        f"provides {len(graph)}; {', and '.join(ours) or 'the graph has others'} (the "
        f"graph's: {sorted(graph)})"
    )


def _shape_text(shape: tuple[int, ...]) -> str:
    """A shape as Triton's ``ShapeToString`` writes it: ``[-1,16]``."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def _dims_conflict(
    kind: str, name: str, dims: tuple[int, ...], graph: tuple[int, ...], whose: tuple[str, bool]
) -> MetadataConflict:
    """Triton's words for a shape its backend refuses (``CompareDimsSupported``), then ours;
    ``whose``: the model's name and whether it batches (``dims`` has the batch dim then)."""
    model, batched = whose
    if batched:
        specified = (
            f"{len(dims)} dimensions (an initial batch dimension because max_batch_size > 0 "
            f"followed by the explicit tensor shape, making complete shape {_shape_text(dims)})"
        )
    else:
        specified = f"{len(dims)} dimensions (shape {_shape_text(dims)})"
    return MetadataConflict(
        f"model '{model}', tensor '{name}': the model expects {len(graph)} dimensions (shape "
        f"{_shape_text(graph)}) but the model configuration specifies {specified}; "
        f"config.pbtxt gives {kind} '{name}' shape {list(dims)} but the ONNX graph has "
        f"{list(graph)}{_dims_hint(kind, dims, graph)}"
    )


def _dims_hint(kind: str, dims: tuple[int, ...], graph: tuple[int, ...]) -> str:
    """What Triton wants of dims of the graph's rank that it refuses."""
    if len(dims) != len(graph):
        return ""
    pairs = list(zip(dims, graph, strict=True))
    if any(dim == -1 and graph_dim != -1 for dim, graph_dim in pairs):
        return " (where the graph's dim is fixed, dims must give its size, not -1)"
    if kind == "output" and any(graph_dim == -1 for _, graph_dim in pairs):
        return " (an output's dims must be the graph's exactly: -1 where it is variable)"
    return ""


def _scalar_conflict(kind: str, name: str, dims: tuple[int, ...], model: str) -> MetadataConflict:
    """Triton's words for dims other than 1s over a graph tensor without dims, then ours."""
    return MetadataConflict(
        f"unable to load model '{model}', scalar tensor '{name}', should only provide 1 in the "
        "model configuration when the model doesn't support batching. Model configuration "
        f"provided: {_shape_text(dims)}.; config.pbtxt gives {kind} '{name}' dims {list(dims)} "
        "but the ONNX graph gives it no dims (a scalar, or of unknown rank): its dims may "
        "only be 1s"
    )


def _batch_conflict(kind: str, name: str, graph: tuple[int, ...], model: str) -> MetadataConflict:
    """Triton's words for batching over a fixed first dimension, then ours."""
    return MetadataConflict(
        f"model '{model}', tensor '{name}': for the model to support batching the shape should "
        "have at least 1 dimension and the first dimension must be -1; but shape expected by "
        f"the model is {_shape_text(graph)}; config.pbtxt gives max_batch_size > 0 but the "
        f"ONNX graph's {kind} '{name}' has a fixed first dimension ({list(graph)}): the model "
        "cannot batch, so leave max_batch_size out (or 0) and give its dims whole"
    )


def _merge_dims(
    kind: str,
    name: str,
    dims: tuple[int, ...],
    graph: tuple[int, ...],
    whose: tuple[str, bool] = ("", False),
) -> tuple[int, ...]:
    """The config's dims, checked against the graph's shape as Triton's ONNX Runtime backend
    checks them (``CompareDimsSupported``): with batching the graph's first dim is variable;
    the ranks are the same; an input's fixed graph dims are given as they are (a variable
    one takes any size), an output's every dim is the graph's exactly (-1 where it is
    variable). A graph tensor without dims (a scalar, or of unknown rank) takes dims of 1s."""
    model, batched = whose
    if not graph:
        given = dims[1:] if batched else dims
        if any(dim != 1 for dim in given):
            raise _scalar_conflict(kind, name, given, model)
        return dims
    if batched and graph[0] != -1:
        raise _batch_conflict(kind, name, graph, model)
    exact = kind == "output"
    fits = len(graph) == len(dims) and all(
        dim == graph_dim
        for dim, graph_dim in zip(dims, graph, strict=False)
        if exact or graph_dim != -1
    )
    if not fits:
        raise _dims_conflict(kind, name, dims, graph, whose)
    return dims


def merge_metadata(
    config: ModelConfig | None, loaded: Loaded, model: str = ""
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Tensor metadata from the graph, refined by config.pbtxt; MetadataConflict if they clash.

    With ``max_batch_size > 0`` a config's dims exclude the batch dimension
    (Triton's convention), which becomes -1. The graph is checked against ``reshape``
    when there is one, else against ``dims``, by Triton's rules (``_merge_dims``).
    """
    graph_inputs = [_spec(m) for m in loaded.inputs]
    graph_outputs = [_spec(m) for m in loaded.outputs]
    if config is None:
        return tuple(graph_inputs), tuple(graph_outputs)
    batched = config.max_batch_size > 0
    sequence = config.sequence_batching
    if sequence is not None:
        problem = sequence_graph_problem(
            sequence,
            {m.name: m.datatype for m in loaded.inputs},
            {m.name: m.datatype for m in loaded.outputs},
        )
        if problem is not None:
            raise MetadataConflict(problem)
    ragged = config.batch_io
    if ragged is not None:
        graph = {m.name: (m.datatype, tuple(m.shape)) for m in loaded.inputs}
        problem = graph_problem(ragged, graph)
        if problem is not None:
            raise MetadataConflict(problem)
    made = ragged.generated if ragged is not None else frozenset()
    if config.pad_batch is not None:
        graph = {m.name: (m.datatype, tuple(m.shape)) for m in loaded.inputs}
        problem = padding_config.graph_problem(config.pad_batch, graph)
        if problem is not None:
            raise MetadataConflict(problem)
        made = made | frozenset(config.pad_batch.generated)
    flat_in = frozenset(ragged.ragged) if ragged is not None else frozenset()
    flat_out = ragged.scattered if ragged is not None else frozenset()
    return (
        _refine(
            "input",
            graph_inputs,
            config.inputs,
            batched,
            {m.name: _spec(m) for m in loaded.optional_inputs},
            (sequence.input_names if sequence is not None else frozenset()) | made,
            flat_in,
            model,
        ),
        _refine(
            "output",
            graph_outputs,
            config.outputs,
            batched,
            filled=sequence.output_names if sequence is not None else frozenset(),
            flat=flat_out,
            model=model,
        ),
    )
