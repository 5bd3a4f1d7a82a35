"""Padded batching's opt-in: the ``pad_batch`` parameter of config.pbtxt, read at load.

Triton batches only requests whose shapes agree; a model with a variable dimension (token
sequences) then runs batches of 1 under real traffic. A model that takes padding (an ONNX
graph with a ``[-1, -1]`` input and an attention mask) may opt in to have requests that
differ only in declared dimensions padded into one batch. The opt-in is a model
parameter, which Triton accepts and ignores, so the same config.pbtxt loads on both::

    parameters { key: "pad_batch" value: { string_value:
      "input input_ids dim 1 pad 0; input attention_mask dim 1 pad 0;"
      " output last_hidden dim 1; waste 2" } }

Clauses, separated by ``;`` (words by spaces; docs/scheduler.md, "Padded batching"):

- ``input NAME dim D pad V [mask TARGET [TYPE]] [lengths TARGET [TYPE]]``: input NAME is
  padded along dimension D (counted with the batch dimension as 0; config.pbtxt must say
  -1 there) with the value V. ``mask`` makes a model input TARGET (not a configured input:
  the server makes it) of shape [batch, padded length], 1 where a request has data and 0
  in the padding; ``lengths`` makes TARGET of shape [batch] with each row's true length.
  TYPE: INT64 (default), INT32, FP32 or BOOL.
- ``output NAME dim D [follows INPUT]``: output NAME is cut back along dimension D to each
  request's true length of INPUT's padded dimension (default: the first padded input).
  Outputs not named are returned as the model made them (with the batch's padding).
- ``waste X``: a batch holds at most X times the elements its requests really have, over
  the padded inputs (default 2, at least 1), so that one long request does not inflate
  many short ones: a request that would pass it starts the next batch.

``pad_batch`` parses the parameter into a ``PadBatch`` (None when absent) and refuses a
malformed one with the reason (``PadBatchError``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from oipserve.grpc_generated import model_config_pb2 as mc

__all__ = ["CutOutput", "PadBatch", "PadBatchError", "PaddedInput", "pad_batch"]

PARAMETER = "pad_batch"
#: The waste bound when the parameter gives none: a batch at most twice its real elements.
DEFAULT_WASTE = 2.0
_TARGET_TYPES = ("INT64", "INT32", "FP32", "BOOL")


class PadBatchError(ValueError):
    """A ``pad_batch`` parameter that cannot be served."""


class PaddedInput(msgspec.Struct, frozen=True):
    """An input padded along ``dim`` (0 is the batch dimension) with ``pad``."""

    name: str
    dim: int
    datatype: str
    pad: float
    #: The model input the server fills with the mask ([batch, length]; 1 = data), and its type.
    mask: str | None = None
    mask_type: str = "INT64"
    #: The model input the server fills with each row's true length ([batch]), and its type.
    lengths: str | None = None
    lengths_type: str = "INT64"


class CutOutput(msgspec.Struct, frozen=True):
    """An output cut back along ``dim`` to each request's length of input ``follows``."""

    name: str
    dim: int
    follows: str


class PadBatch(msgspec.Struct, frozen=True):
    """A model's padded batching."""

    inputs: tuple[PaddedInput, ...]
    outputs: tuple[CutOutput, ...] = ()
    waste: float = DEFAULT_WASTE

    @property
    def generated(self) -> dict[str, str]:
        """The model inputs the server makes (masks, lengths) -> their datatypes."""
        made = {}
        for spec in self.inputs:
            if spec.mask is not None:
                made[spec.mask] = spec.mask_type
            if spec.lengths is not None:
                made[spec.lengths] = spec.lengths_type
        return made


def _dim(word: str, dims: tuple[int, ...], what: str) -> int:
    try:
        dim = int(word)
    except ValueError:
        raise PadBatchError(f"{what}: dim '{word}' is not a number") from None
    if not 1 <= dim <= len(dims):
        raise PadBatchError(
            f"{what}: dim {dim} is not one of its dimensions past the batch dimension "
            f"(1 to {len(dims)})"
        )
    if dims[dim - 1] != -1:
        raise PadBatchError(
            f"{what}: dim {dim} has the fixed size {dims[dim - 1]} in config.pbtxt; only a "
            "variable one (-1) can be padded"
        )
    return dim


def _pad_value(word: str, datatype: str, what: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise PadBatchError(f"{what}: pad value '{word}' is not a number") from None
    if datatype not in ("FP16", "FP32", "FP64", "BF16") and value != int(value):
        raise PadBatchError(f"{what}: pad value {word} is not a whole number, as {datatype} needs")
    return value


def _target(words: list[str], at: int, what: str) -> tuple[str, str, int]:
    """The TARGET [TYPE] after ``mask`` / ``lengths`` at ``at``; the index after them."""
    if at >= len(words):
        raise PadBatchError(f"{what}: '{words[at - 1]}' needs the name of a model input")
    name = words[at]
    kind = "INT64"
    if at + 1 < len(words) and words[at + 1].upper() in _TARGET_TYPES:
        kind = words[at + 1].upper()
        at += 1
    return name, kind, at + 1


def _input(words: list[str], inputs: dict[str, Any]) -> PaddedInput:
    name = words[1] if len(words) > 1 else ""
    what = f"pad_batch input '{name}'"
    if name not in inputs:
        raise PadBatchError(f"{what} is not a configured input")
    entry = inputs[name]
    datatype = mc.DataType.Name(entry.data_type).removeprefix("TYPE_")
    if datatype in ("STRING", "BF16"):
        raise PadBatchError(f"{what} is TYPE_{datatype}, which cannot be padded")
    if len(words) < 6 or words[2] != "dim" or words[4] != "pad":
        raise PadBatchError(f"{what}: expected 'input NAME dim D pad V [mask M] [lengths L]'")
    spec = PaddedInput(
        name,
        _dim(words[3], tuple(entry.dims), what),
        datatype,
        _pad_value(words[5], datatype, what),
    )
    at = 6
    while at < len(words):
        word = words[at]
        if word not in ("mask", "lengths"):
            raise PadBatchError(f"{what}: unknown word '{word}' (mask or lengths expected)")
        target, kind, at = _target(words, at + 1, what)
        if target in inputs:
            raise PadBatchError(
                f"{what}: {word} target '{target}' is a configured input; the server makes it, "
                "so config.pbtxt must not list it"
            )
        if word == "mask":
            spec = msgspec.structs.replace(spec, mask=target, mask_type=kind)
        else:
            spec = msgspec.structs.replace(spec, lengths=target, lengths_type=kind)
    return spec


def _output(words: list[str], outputs: dict[str, Any], padded: list[PaddedInput]) -> CutOutput:
    name = words[1] if len(words) > 1 else ""
    what = f"pad_batch output '{name}'"
    if name not in outputs:
        raise PadBatchError(f"{what} is not a configured output")
    if len(words) not in (4, 6) or words[2] != "dim" or (len(words) == 6 and words[4] != "follows"):
        raise PadBatchError(f"{what}: expected 'output NAME dim D [follows INPUT]'")
    dim = _dim(words[3], tuple(outputs[name].dims), what)
    if not padded:
        raise PadBatchError(f"{what}: no padded input is declared before it to follow")
    follows = words[5] if len(words) == 6 else padded[0].name
    if follows not in {p.name for p in padded}:
        raise PadBatchError(f"{what}: follows '{follows}', which is not a padded input")
    return CutOutput(name, dim, follows)


def _waste(words: list[str]) -> float:
    try:
        waste = float(words[1]) if len(words) == 2 else 0.0
    except ValueError:
        waste = 0.0
    if not waste >= 1.0 or waste == float("inf"):
        raise PadBatchError(
            f"pad_batch 'waste' needs one number of at least 1, got '{' '.join(words[1:])}'"
        )
    return waste


def _parse(text: str, config: Any) -> PadBatch:
    inputs = {i.name: i for i in config.input}
    outputs = {o.name: o for o in config.output}
    padded: list[PaddedInput] = []
    cut: list[CutOutput] = []
    waste = DEFAULT_WASTE
    for clause in text.split(";"):
        words = clause.split()
        if not words:
            continue
        if words[0] == "input":
            padded.append(_input(words, inputs))
        elif words[0] == "output":
            cut.append(_output(words, outputs, padded))
        elif words[0] == "waste":
            waste = _waste(words)
        else:
            raise PadBatchError(
                f"pad_batch: unknown clause '{words[0]}' (input, output or waste expected)"
            )
    if not padded:
        raise PadBatchError("pad_batch declares no padded input ('input NAME dim D pad V')")
    names = [p.name for p in padded] + [c.name for c in cut]
    made = [t for p in padded for t in (p.mask, p.lengths) if t is not None]
    for name in {*names, *made}:
        if names.count(name) + made.count(name) > 1:
            raise PadBatchError(f"pad_batch names '{name}' more than once")
    return PadBatch(tuple(padded), tuple(cut), waste)


def pad_batch(config: Any) -> PadBatch | None:
    """The ``pad_batch`` parameter of a parsed ``inference.ModelConfig``; None without one.

    PadBatchError when it is malformed, or when the model cannot batch (no batch
    dimension, no ``dynamic_batching``) or uses Triton's ragged batching as well.
    """
    parameter = config.parameters.get(PARAMETER)
    if parameter is None:
        return None
    if config.max_batch_size <= 0 or not config.HasField("dynamic_batching"):
        raise PadBatchError(
            "pad_batch pads requests into one batch: it needs max_batch_size > 0 and "
            "dynamic_batching"
        )
    if config.batch_input or config.batch_output or any(i.allow_ragged_batch for i in config.input):
        raise PadBatchError("pad_batch cannot be combined with ragged batching")
    return _parse(parameter.string_value, config)


def graph_problem(spec: PadBatch, graph: dict[str, tuple[str, tuple[int, ...]]]) -> str | None:
    """What in the ONNX graph's inputs (name -> datatype, shape) does not fit ``spec``:
    each mask and lengths target must be a graph input of its type."""
    for target, datatype in spec.generated.items():
        if target not in graph:
            return f"pad_batch target '{target}' is not an input of the ONNX graph"
        if graph[target][0] != datatype:
            return (
                f"pad_batch target '{target}' is {datatype} in pad_batch but "
                f"{graph[target][0]} in the ONNX graph"
            )
    return None
