"""The sequence parameters of a request: ``sequence_id``, ``sequence_start``, ``sequence_end``.

Taken only by a model with ``sequence_batching``, or an ensemble with such a step (the
fronts ask ``takes_sequence``): other models ignore them, as Triton's do,
but both fronts check them on any model's request, as Triton's parse them.
The types and messages are Triton's: REST takes an unsigned integer or a string id and
JSON booleans ("Unable to parse 'sequence_id'"); gRPC an ``int64_param`` or
``string_param`` id and ``bool_param`` flags. A string id longer than 128 characters is
UNSUPPORTED, as in Triton. An id of 0 or "" means "no sequence": the sequence batcher then
refuses the request (``dataplane.sequenced``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from oipserve.errors import InvalidInput, Unsupported
from oipserve.models.ensemble import EnsembleVersion
from oipserve.models.registry import ModelVersion

__all__ = [
    "SEQUENCE_ID_MAX_CHARS",
    "SequenceTag",
    "from_grpc",
    "from_json",
    "takes_sequence",
]

#: Longest string ``sequence_id`` (Triton's limit, in characters).
SEQUENCE_ID_MAX_CHARS: Final = 128
_UINT64_MAX: Final = 2**64 - 1


class SequenceTag:
    """Which sequence a request belongs to, and whether it starts or ends it."""

    __slots__ = ("sequence_id", "start", "end")

    def __init__(self, sequence_id: int | str, start: bool, end: bool) -> None:
        self.sequence_id = sequence_id
        self.start = start
        self.end = end


def _checked_id(value: int | str) -> int | str:
    if isinstance(value, str) and len(value) > SEQUENCE_ID_MAX_CHARS:
        raise Unsupported(
            f"string correlation ID cannot be longer than {SEQUENCE_ID_MAX_CHARS} characters"
        )
    return value


def from_json(params: Mapping[str, object] | None) -> SequenceTag:
    """The sequence parameters of a REST request's ``parameters`` (Triton's messages)."""
    if not params:
        return SequenceTag(0, False, False)
    value = params.get("sequence_id", 0)
    if type(value) is int:
        if not 0 <= value <= _UINT64_MAX:
            raise InvalidInput("Unable to parse 'sequence_id'")
    elif not isinstance(value, str):
        raise InvalidInput("Unable to parse 'sequence_id'")
    flags = []
    for key in ("sequence_start", "sequence_end"):
        flag = params.get(key, False)
        if type(flag) is not bool:
            raise InvalidInput(f"Unable to parse '{key}'")
        flags.append(flag)
    return SequenceTag(_checked_id(value), flags[0], flags[1])


def from_grpc(parameters: Any) -> SequenceTag:
    """The sequence parameters of a ModelInferRequest's ``parameters`` map."""
    sequence_id: int | str = 0
    if "sequence_id" in parameters:
        param = parameters["sequence_id"]
        kind = param.WhichOneof("parameter_choice")
        if kind == "int64_param":
            # NOTE: Triton keeps the bits of a negative int64 as a uint64 id.
            sequence_id = param.int64_param & _UINT64_MAX
        elif kind == "string_param":
            sequence_id = _checked_id(param.string_param)
        else:
            raise InvalidInput(
                "invalid value type for 'sequence_id' parameter, expected int64_param or "
                "string_param."
            )
    flags = []
    for key in ("sequence_start", "sequence_end"):
        flag = False
        if key in parameters:
            param = parameters[key]
            if param.WhichOneof("parameter_choice") != "bool_param":
                raise InvalidInput(
                    f"invalid value type for '{key}' parameter, expected bool_param."
                )
            flag = param.bool_param
        flags.append(flag)
    return SequenceTag(sequence_id, flags[0], flags[1])


def takes_sequence(model: ModelVersion) -> bool:
    """Whether the fronts read a request's ``sequence_id`` / ``_start`` / ``_end`` for
    ``model``: a sequence model, or an ensemble with one as a step, or as a step of an
    ensemble that is its step (docs/sequences.md)."""
    config = model.config
    if config is None:
        return False
    if config.sequence_batching is not None:
        return True
    return isinstance(model, EnsembleVersion) and model.has_sequence_step()
