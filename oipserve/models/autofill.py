"""A model's configuration completed from its ONNX graph, as Triton's ONNX Runtime backend
does it (``ModelState::AutoCompleteConfig``), unless ``--disable-auto-complete-config``.

Triton's rules (onnxruntime_backend ``src/onnxruntime.cc``), all of them here:

- A configuration that lists inputs (``input`` or ``batch_input``) and outputs is left as
  given. Otherwise, once the graph is known (the session loaded):
- the graph *can batch* when every input and every output has a rank of 1 or more and a
  variable (-1, symbolic) first dimension;
- a graph that can batch, with ``max_batch_size`` 0 (unset and an explicit 0 are one value
  in proto3: Triton cannot tell them apart either), gets the backend's
  ``default-max-batch-size`` (4; ``--backend-config``, a negative one reads as 0);
- a graph that can batch, with ``max_batch_size`` > 1 (given or so filled) and neither
  ``dynamic_batching`` nor ``sequence_batching``, gets an empty ``dynamic_batching`` (whose
  ``preferred_batch_size`` is then ``[max_batch_size]``, as everywhere);
- a graph that cannot batch, with ``max_batch_size`` > 0: the load fails, in Triton's words;
- inputs, when none are listed, and outputs, when none are listed, come from the graph:
  name, datatype, dims (without the first when ``max_batch_size`` > 0); a tensor left with
  no dims gets ``dims: [1]``, and ``reshape: { shape: [] }`` when ``max_batch_size`` > 0.

Then the configuration is checked as a given one is, and against the graph
(``metadata.merge_metadata``): a partial configuration whose dims include the batch
dimension that auto-complete turned on is refused, with what to do instead.

Where this server differs, and why: the inputs and outputs the server itself fills
(sequence controls and states, ragged and padded batching's generated inputs) are not
listed; Triton lists them, and its load then fails counting the inputs. An unbatched
scalar input (``dims: [1]`` as Triton shows it) is fed to the model as a scalar, as
Triton's backend feeds it; an unbatched output the model makes a scalar is answered with
its dims, ``[1]``, as Triton's backend answers it (``request.inference._client_shape``).

With auto-complete off, a model without a configuration is not loaded (the manager, in
core's words), and one that lists no inputs fails Triton's input count
(``metadata.merge_metadata``), as in Triton; one that lists inputs but no outputs is
refused (``_no_outputs``), where Triton loads it and fails each request.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from google.protobuf import json_format

from oipserve.grpc_generated import model_config_pb2 as mc
from oipserve.models.config.parse import (
    ModelConfig,
    ModelConfigError,
    TensorConfig,
    config_from_message,
)
from oipserve.models.metadata import MetadataConflict, TensorSpec, merge_metadata
from oipserve.wire.datatypes import DATATYPES
from oipserve.wire.messages import Loaded, TensorMeta

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "AutoComplete", "complete", "completed_metadata"]

log = logging.getLogger("oipserve.models")

#: Triton's ``default-max-batch-size`` backend setting when none is given (core's
#: ``backend_config_defaults``).
DEFAULT_MAX_BATCH_SIZE = 4


class AutoComplete(msgspec.Struct, frozen=True):
    """The operator's choice (``--disable-auto-complete-config``, ``--backend-config``)."""

    enabled: bool = True
    #: ``max_batch_size`` of a graph that can batch when its configuration gives none.
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE


def _can_batch(loaded: Loaded) -> bool:
    return all(meta.shape and meta.shape[0] == -1 for meta in [*loaded.inputs, *loaded.outputs])


def _filled_by_server(config: ModelConfig | None) -> tuple[frozenset[str], frozenset[str]]:
    """The graph's inputs and outputs the server feeds or keeps itself (never listed)."""
    if config is None:
        return frozenset(), frozenset()
    inputs: set[str] = set()
    outputs: set[str] = set()
    if config.sequence_batching is not None:
        inputs |= config.sequence_batching.input_names
        outputs |= config.sequence_batching.output_names
    if config.batch_io is not None:
        inputs |= config.batch_io.generated
    if config.pad_batch is not None:
        inputs |= set(config.pad_batch.generated)
    return frozenset(inputs), frozenset(outputs)


def _entry(meta: TensorMeta, batched: bool, fed: bool) -> tuple[dict[str, Any], TensorConfig]:
    """One graph tensor as Triton's auto-complete lists it (the JSON entry), and as the
    server reads it: an unbatched input without dims, shown as ``dims: [1]``, is fed as a
    scalar (``fed``: an input); such an output is answered as ``[1]`` when the model makes
    a scalar of it, as the shape the model gives it otherwise (ONNX Runtime gives an output
    of unknown rank no dims either)."""
    dims = list(meta.shape[1:] if batched else meta.shape)
    entry: dict[str, Any] = {"name": meta.name, "data_type": DATATYPES[meta.datatype].triton}
    reshape: tuple[int, ...] | None = None
    if not dims:
        dims = [1]
        if batched:
            entry["reshape"] = {"shape": []}
        if batched or fed:
            reshape = ()
    entry["dims"] = dims
    return entry, TensorConfig(meta.name, meta.datatype, tuple(dims), reshape)


def _listed(
    metas: list[TensorMeta], skipped: frozenset[str], batched: bool, fed: bool
) -> tuple[list[dict[str, Any]], tuple[TensorConfig, ...]]:
    pairs = [_entry(meta, batched, fed) for meta in metas if meta.name not in skipped]
    return [entry for entry, _ in pairs], tuple(tensor for _, tensor in pairs)


def _max_batch_size(name: str, given: int, can_batch: bool, policy: AutoComplete) -> int:
    if can_batch and given == 0:
        return max(policy.default_max_batch_size, 0)
    if not can_batch and given != 0:
        raise ModelConfigError(
            f"autofill failed for model '{name}': model does not support batching while "
            "non-zero max_batch_size is specified"
        )
    return given


def complete(
    config: ModelConfig | None, loaded: Loaded, name: str, policy: AutoComplete
) -> ModelConfig | None:
    """``config`` completed from the graph ``loaded`` describes (module docstring); as given
    when auto-complete is off or it lists inputs and outputs. ModelConfigError when the
    completed configuration is refused."""
    document: dict[str, Any] = dict(config.document) if config is not None else {}
    given_inputs = len(document.get("input", [])) + len(document.get("batch_input", []))
    given_outputs = len(document.get("output", []))
    if not policy.enabled or (given_inputs and given_outputs):
        return config
    can_batch = _can_batch(loaded)
    given = config.max_batch_size if config is not None else 0
    largest = _max_batch_size(name, given, can_batch, policy)
    document.setdefault("name", name)
    document["max_batch_size"] = largest
    scheduled = "dynamic_batching" in document or "sequence_batching" in document
    batcher = can_batch and largest > 1 and not scheduled
    if batcher:
        document["dynamic_batching"] = {}
    skip_in, skip_out = _filled_by_server(config)
    inputs = outputs = None
    if not given_inputs:
        document["input"], inputs = _listed(loaded.inputs, skip_in, largest > 0, True)
    if not given_outputs:
        document["output"], outputs = _listed(loaded.outputs, skip_out, largest > 0, False)
    message = json_format.ParseDict(document, mc.ModelConfig())
    try:
        completed = config_from_message(message)
    except ModelConfigError as exc:
        raise ModelConfigError(f"the auto-completed configuration: {exc}") from None
    _log(name, given, largest, inputs, outputs, batcher)
    return _carried(completed, config, inputs, outputs)


def _carried(
    completed: ModelConfig,
    config: ModelConfig | None,
    inputs: tuple[TensorConfig, ...] | None,
    outputs: tuple[TensorConfig, ...] | None,
) -> ModelConfig:
    """``completed`` with what reading the given configuration added (output labels, a
    sequence's initial states) and the listed tensors as the server reads them."""
    given_inputs = config.inputs if config is not None else ()
    given_outputs = config.outputs if config is not None else ()
    completed = msgspec.structs.replace(
        completed,
        inputs=given_inputs if inputs is None else inputs,
        outputs=given_outputs if outputs is None else outputs,
    )
    sequence = completed.sequence_batching
    if sequence is not None and config is not None and config.sequence_batching is not None:
        states = config.sequence_batching.states
        sequence = msgspec.structs.replace(sequence, states=states)
        completed = msgspec.structs.replace(completed, sequence_batching=sequence)
    return completed


def _log(
    name: str,
    given: int,
    largest: int,
    inputs: tuple[TensorConfig, ...] | None,
    outputs: tuple[TensorConfig, ...] | None,
    batcher: bool,
) -> None:
    if largest != given:
        log.warning(
            "autofilled max_batch_size to %d for model '%s' since batching is supported but "
            "no max_batch_size is specified in model configuration. Must specify "
            "max_batch_size to utilize autofill with a larger max batch size",
            largest,
            name,
        )
    filled = [
        what
        for what, done in (
            (f"max_batch_size {largest}", largest != given),
            ("dynamic_batching", batcher),
            ("inputs", inputs is not None),
            ("outputs", outputs is not None),
        )
        if done
    ]
    log.info(
        "model '%s': configuration auto-completed from the ONNX graph: %s",
        name,
        ", ".join(filled),
    )


def _batch_dim_given(config: ModelConfig | None, largest: int, loaded: Loaded) -> bool:
    """Whether auto-complete turned batching on (``largest``: the completed
    max_batch_size) for a configuration that lists a tensor with as many dims as the graph
    has: its dims included the batch dimension."""
    if config is None or largest == config.max_batch_size:
        return False
    ranks = {meta.name: len(meta.shape) for meta in [*loaded.inputs, *loaded.outputs]}
    given = [*config.inputs, *config.outputs]
    return any(t.reshape is None and len(t.dims) == ranks.get(t.name) for t in given)


def completed_metadata(
    config: ModelConfig | None, loaded: Loaded, name: str, policy: AutoComplete
) -> tuple[ModelConfig | None, tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The completed configuration (``complete``) and the tensor metadata it gives with the
    graph; MetadataConflict says when auto-complete turned batching on under dims that
    include the batch dimension."""
    completed = complete(config, loaded, name, policy)
    try:
        inputs, outputs = merge_metadata(completed, loaded, name)
    except MetadataConflict as exc:
        largest = completed.max_batch_size if completed is not None else 0
        if not _batch_dim_given(config, largest, loaded):
            raise
        raise MetadataConflict(
            f"{exc}; auto-complete set max_batch_size to {largest} (every "
            "input and output of the graph has a variable first dimension), so the dims "
            "config.pbtxt gives must leave the batch dimension out. To serve the model "
            "without batching, list every input and output in config.pbtxt (nothing is then "
            "auto-completed), or start the server with "
            "--backend-config=onnxruntime,default-max-batch-size=0"
        ) from None
    if not policy.enabled and completed is not None and not completed.outputs:
        raise MetadataConflict(_no_outputs(name, loaded))
    return completed, inputs, outputs


def _no_outputs(name: str, loaded: Loaded) -> str:
    """Why a configuration that lists no outputs is refused when auto-complete is off:
    Triton loads it, but its ONNX Runtime backend runs the outputs the configuration lists
    (``ModelOutputs``), none, and ONNX Runtime fails every request so; a request that names
    an output core refuses, as it is not in the configuration."""
    graph = [meta.name for meta in loaded.outputs]
    return (
        f"unable to load model '{name}': config.pbtxt lists no outputs and auto-complete is "
        "off (--disable-auto-complete-config or --strict-model-config=true), so no output "
        "could be answered (Triton loads such a model and fails each of its requests: "
        "'onnx runtime error 2: At least one output should be requested.'); list the "
        f"outputs clients need (the ONNX graph's: {graph}), or start the server without "
        "the flag"
    )
