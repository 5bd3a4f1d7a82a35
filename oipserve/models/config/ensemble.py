"""An ensemble's ``ensemble_scheduling``: its steps, and the checks that need only its own
configuration.

Triton's ensembles (``platform: "ensemble"``) name other models as steps; each step maps
the step model's inputs to *ensemble tensors* (``input_map``: model input -> tensor) and
its outputs to ensemble tensors (``output_map``: model output -> tensor). The ensemble's
own inputs are tensors given by the client; its outputs are tensors some step writes.

Checked here, at parse (Triton's messages, ``ensemble_utils.cc`` / ``model_config_utils.cc``
of its core): the platform and backend, no ``instance_group`` / ``optimization`` /
``model_warmup``, every step naming a model and mapping inputs and outputs, a tensor
written by at most one step (and never an ensemble input), every step input coming from an
ensemble input or a step output, every ensemble input read and every ensemble output written,
and no cycle between steps. What needs the composing models (known, loaded, their
datatypes, shapes and batch sizes) is checked at load (``check_against``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

__all__ = [
    "ENSEMBLE_PLATFORM",
    "EnsembleConfig",
    "EnsembleError",
    "EnsembleStep",
    "StepModel",
    "check_against",
    "ensemble_scheduling",
]

ENSEMBLE_PLATFORM = "ensemble"


class EnsembleError(ValueError):
    """An ensemble configuration Triton would refuse; the message is Triton's kind."""


class EnsembleStep(msgspec.Struct, frozen=True):
    """One ``step``: a composing model and its tensor maps."""

    model_name: str
    #: -1: the latest ready version when the step runs.
    model_version: int
    #: Step model input -> ensemble tensor it reads.
    input_map: dict[str, str]
    #: Step model output -> ensemble tensor it writes.
    output_map: dict[str, str]


class EnsembleConfig(msgspec.Struct, frozen=True):
    """The steps, in a dependency order (a step comes after those writing its inputs)."""

    steps: tuple[EnsembleStep, ...]
    #: Most requests in flight at each step at once, across the ensemble's requests
    #: (Triton 2.63's backpressure); 0: no limit.
    max_inflight_requests: int = 0
    #: Per step (in ``steps`` order), the indexes of the steps that read its outputs.
    consumers: tuple[tuple[int, ...], ...] = ()


class StepModel(msgspec.Struct, frozen=True):
    """What a load-time check needs of one composing model (``check_against``)."""

    name: str
    max_batch_size: int
    #: Input / output name -> (datatype, dims as clients send them, batch dim included).
    inputs: dict[str, tuple[str, tuple[int, ...]]]
    outputs: dict[str, tuple[str, tuple[int, ...]]]
    #: Its inputs marked ``optional: true``: a step may leave them unmapped (Triton's).
    optional: frozenset[str] = frozenset()


def ensemble_scheduling(config: Any) -> EnsembleConfig | None:
    """The ensemble part of a parsed ``inference.ModelConfig`` message; None for a model that
    is not an ensemble. EnsembleError in Triton's words for what it would refuse."""
    name = config.name
    is_ensemble = config.platform == ENSEMBLE_PLATFORM
    scheduled = config.HasField("ensemble_scheduling")
    if not is_ensemble:
        if scheduled:
            raise EnsembleError(
                f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
                f"{ENSEMBLE_PLATFORM}"
            )
        return None
    if config.backend:
        raise EnsembleError(
            f"Ensemble model '{name}' must have platform type '{ENSEMBLE_PLATFORM}' and empty "
            "backend type"
        )
    if not scheduled:
        raise EnsembleError(
            f"ensemble scheduling must be set for ensemble {name} whose platform is "
            f"{ENSEMBLE_PLATFORM}"
        )
    for field, what in (
        ("instance_group", "instance group should not"),
        ("model_warmup", "model_warmup can not"),
    ):
        if len(getattr(config, field)):
            raise EnsembleError(f"{what} be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise EnsembleError(f"optimization should not be specified for ensemble '{name}'")
    scheduling = config.ensemble_scheduling
    steps = tuple(_step(step, index, name) for index, step in enumerate(scheduling.step))
    if not steps:
        raise EnsembleError(f"must specify 'step' for ensemble '{name}'")
    inputs = [entry.name for entry in config.input]
    outputs = [entry.name for entry in config.output]
    ordered, consumers = _order(name, steps, inputs, outputs)
    return EnsembleConfig(ordered, scheduling.max_inflight_requests, consumers)


def _step(step: Any, index: int, ensemble: str) -> EnsembleStep:
    for field in ("model_name", "input_map", "output_map"):
        if not getattr(step, field):
            raise EnsembleError(f"must specify '{field}' in step {index} of ensemble '{ensemble}'")
    written: set[str] = set()
    for tensor in step.output_map.values():
        if tensor in written:
            raise EnsembleError(
                f"ensemble tensor '{tensor}' can appear in an output map only once for "
                f"ensemble '{ensemble}' step {index}"
            )
        written.add(tensor)
    return EnsembleStep(
        step.model_name, step.model_version, dict(step.input_map), dict(step.output_map)
    )


def _writers(ensemble: str, steps: tuple[EnsembleStep, ...], inputs: list[str]) -> dict[str, int]:
    """Ensemble tensor -> the step that writes it; a tensor written twice is refused."""
    writer: dict[str, int] = {}
    for index, step in enumerate(steps):
        for tensor in step.output_map.values():
            if tensor in inputs:
                raise EnsembleError(
                    f"in ensemble {ensemble}, ensemble tensor '{tensor}' is an ensemble input "
                    f"and is also written by step {index} (model '{step.model_name}'): a "
                    "tensor is mapped twice"
                )
            if tensor in writer:
                raise EnsembleError(
                    f"in ensemble {ensemble}, ensemble tensor '{tensor}' is written by step "
                    f"{writer[tensor]} (model '{steps[writer[tensor]].model_name}') and by step "
                    f"{index} (model '{step.model_name}'): a tensor is mapped twice"
                )
            writer[tensor] = index
    return writer


def _order(
    ensemble: str, steps: tuple[EnsembleStep, ...], inputs: list[str], outputs: list[str]
) -> tuple[tuple[EnsembleStep, ...], tuple[tuple[int, ...], ...]]:
    """The steps in a dependency order and who reads each one's outputs; EnsembleError for
    an unread input, an unwritten output or tensor, a cycle."""
    writer = _writers(ensemble, steps, inputs)
    read = {tensor for step in steps for tensor in step.input_map.values()}
    for name in inputs:
        if name not in read:
            raise EnsembleError(f"ensemble input '{name}' for ensemble {ensemble}' is not used")
    for name in outputs:
        if name not in writer:
            raise EnsembleError(f"output '{name}' for ensemble '{ensemble}' is not written")
    for index, step in enumerate(steps):
        for model_input, tensor in step.input_map.items():
            if tensor not in writer and tensor not in inputs:
                raise EnsembleError(
                    f"in ensemble {ensemble}, input '{model_input}' of step {index} (model "
                    f"'{step.model_name}') reads ensemble tensor '{tensor}', which is neither an "
                    "ensemble input nor written by any step"
                )
    for tensor in writer:
        if tensor not in read and tensor not in outputs:
            raise EnsembleError(f"ensemble tensor '{tensor}' is unused in ensemble '{ensemble}'")
    order = _topological(ensemble, steps, writer)
    position = {old: new for new, old in enumerate(order)}
    ordered = tuple(steps[i] for i in order)
    consumers = tuple(
        tuple(
            sorted(
                {
                    position[reader]
                    for reader, other in enumerate(steps)
                    if any(writer.get(t) == old for t in other.input_map.values())
                }
            )
        )
        for old in order
    )
    return ordered, consumers


def _topological(
    ensemble: str, steps: tuple[EnsembleStep, ...], writer: dict[str, int]
) -> list[int]:
    """Step indexes, each after the steps it reads from; EnsembleError naming a cycle."""
    needs = [{writer[t] for t in step.input_map.values() if t in writer} for step in steps]
    order: list[int] = []
    done: set[int] = set()
    while len(order) < len(steps):
        ready = [i for i in range(len(steps)) if i not in done and needs[i] <= done]
        if not ready:
            raise EnsembleError(_cycle(ensemble, steps, needs, done))
        order.extend(ready)
        done.update(ready)
    return order


def _cycle(
    ensemble: str, steps: tuple[EnsembleStep, ...], needs: list[set[int]], done: set[int]
) -> str:
    """The message for steps that wait on each other: one cycle, named step by step."""
    start = min(i for i in range(len(steps)) if i not in done)
    path = [start]
    current = start
    while True:
        current = min(needs[current] - done)
        if current in path:
            path = path[path.index(current) :] + [current]
            break
        path.append(current)
    names = " -> ".join(f"step {i} ({steps[i].model_name})" for i in reversed(path))
    return f"circular dependency in ensemble '{ensemble}': {names}"


def check_against(
    ensemble: str,
    max_batch_size: int,
    own_inputs: Iterable[tuple[str, str, tuple[int, ...]]],
    own_outputs: Iterable[tuple[str, str, tuple[int, ...]]],
    config: EnsembleConfig,
    lookup: Callable[[EnsembleStep], StepModel],
) -> None:
    """The checks that need the composing models (``lookup`` gives each step's model, or
    raises EnsembleError when it has none): batch sizes, every mapped input and output
    existing, every input of a step mapped, and one datatype and a compatible shape for
    each ensemble tensor across the ensemble's own inputs and outputs and the steps.

    ``own_inputs`` / ``own_outputs``: the ensemble's (name, datatype, dims with the batch dim).
    """
    seen: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for name, datatype, dims in own_inputs:
        seen[name] = (datatype, dims, ensemble)
    for step in config.steps:
        model = lookup(step)
        if model.max_batch_size != 0 and model.max_batch_size < max_batch_size:
            raise EnsembleError(
                f"ensemble {ensemble} allows maximum batch size {max_batch_size}, but it "
                f"contains model {model.name} which only allows maximum batch size to be "
                f"{model.max_batch_size}"
            )
        _check_maps(ensemble, step, model)
        for model_input, tensor in step.input_map.items():
            _agree(ensemble, seen, tensor, *model.inputs[model_input], model.name)
        for model_output, tensor in step.output_map.items():
            _agree(ensemble, seen, tensor, *model.outputs[model_output], model.name)
    for name, datatype, dims in own_outputs:
        _agree(ensemble, seen, name, datatype, dims, ensemble)


def _check_maps(ensemble: str, step: EnsembleStep, model: StepModel) -> None:
    for model_input, tensor in step.input_map.items():
        if model_input not in model.inputs:
            raise EnsembleError(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapping to non-existing "
                f"input {model_input} in model {model.name}"
            )
    for model_input in model.inputs:
        # NOTE: an optional one may be left out, as Triton allows: the step runs without it
        if model_input not in step.input_map and model_input not in model.optional:
            raise EnsembleError(
                f"in ensemble {ensemble}, input {model_input} in model {model.name} is not "
                "mapped to any ensemble tensors"
            )
    for model_output, tensor in step.output_map.items():
        if model_output not in model.outputs:
            raise EnsembleError(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapped from non-existing "
                f"output {model_output} in model {model.name}"
            )


#: A BYTES ensemble tensor may feed a 4-D numeric input: encoded images the step's worker
#: decodes (docs/images.md), oipserve's image inputs.
_IMAGE_RANK = 4


def _agree(
    ensemble: str,
    seen: dict[str, tuple[str, tuple[int, ...], str]],
    tensor: str,
    datatype: str,
    dims: tuple[int, ...],
    source: str,
) -> None:
    """Record or compare one use of an ensemble tensor (Triton's ValidateTensorConsistency)."""
    known = seen.get(tensor)
    if known is None:
        seen[tensor] = (datatype, dims, source)
        return
    known_type, known_dims, known_source = known
    if known_type == "BYTES" and datatype != "BYTES" and len(dims) == _IMAGE_RANK:
        return  # encoded images into an image input: checked per request
    if known_type != datatype:
        raise EnsembleError(
            f"in ensemble {ensemble}, ensemble tensor {tensor}: inconsistent data type: "
            f"TYPE_{_triton(known_type)} is inferred from model {known_source} while "
            f"TYPE_{_triton(datatype)} is inferred from model {source}"
        )
    if not _dims_agree(known_dims, dims):
        raise EnsembleError(
            f"in ensemble {ensemble}, ensemble tensor {tensor}: inconsistent shape: "
            f"{list(known_dims)} is inferred from model {known_source} while {list(dims)} is "
            f"inferred from model {source}"
        )


def _triton(datatype: str) -> str:
    return {"BYTES": "STRING"}.get(datatype, datatype)


def _dims_agree(left: tuple[int, ...], right: tuple[int, ...]) -> bool:
    """Same rank and equal sizes where both are fixed (-1 matches anything)."""
    if len(left) != len(right):
        return False
    return all(a == b or a == -1 or b == -1 for a, b in zip(left, right, strict=True))
