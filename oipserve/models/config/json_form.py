"""A protobuf message as the JSON Triton answers for a model configuration.

protobuf's ``json_format.MessageToDict`` writes 64-bit integers as strings (the
proto3 JSON mapping); Triton's ``/v2/models/{m}/config`` writes them as numbers
(``"dims": [16]``), and clients index them as numbers. This walk renders only the
fields that are given (as ``MessageToDict`` does), keeps proto field names, names
enums, and writes every integer as a JSON number; with ``triton_strings``, the 64-bit
fields Triton leaves as strings are strings, as in its answer (``TRITON_STRING_INT64``).
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["TRITON_STRING_INT64", "message_json"]

#: The 64-bit fields of ``ModelConfig`` Triton's ``/config`` answer prints as JSON strings
#: (the proto3 JSON mapping): core's ``ModelConfigToJson`` turns every other one into a
#: number, but not these. ``InitialState.dims`` is one by a slip of Triton's (it looks for
#: ``initial_state`` in ``sequence_batching``, not in each ``state``); a client written
#: against Triton reads a string there, so it is one here too.
TRITON_STRING_INT64 = frozenset(
    {
        "inference.ModelSequenceBatching.InitialState.dims",
        "inference.ModelOptimizationPolicy.Cuda.GraphSpec.Shape.dim",
        "inference.ModelInstanceGroup.SecondaryDevice.device_id",
    }
)


def _scalar(field: FieldDescriptor, value: object, defaults: bool, strings: bool) -> object:
    if isinstance(value, Message):  # (a field of a message type)
        return message_json(value, defaults, strings)
    if strings and field.full_name in TRITON_STRING_INT64:
        return str(value)
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, float) and field.type == FieldDescriptor.TYPE_FLOAT:
        return _shortest_float32(value)
    return value


def _shortest_float32(value: float) -> float:
    """A float32 field's value as its shortest decimal that reads back as it, as
    protobuf's JSON printers write it: ``0.1``, not the widened ``0.10000000149011612``."""
    for digits in range(6, 10):
        short = float(f"{value:.{digits}g}")
        if struct.unpack("f", struct.pack("f", short))[0] == value:
            return short
    return value


def message_json(
    message: Message, defaults: bool = False, triton_strings: bool = False
) -> dict[str, Any]:
    """The given fields of ``message`` as plain JSON-ready values; with ``defaults``, every
    field without presence too, at its default (repeated ones, maps, scalars outside a
    oneof), as Triton's ``/config`` answer prints them (core's ``ModelConfigToJson``:
    ``always_print_primitive_fields``)."""
    out: dict[str, Any] = {}
    for field, value in _fields(message, defaults):
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            out[field.name] = {
                str(k): _scalar(value_field, v, defaults, triton_strings) for k, v in value.items()
            }
        elif field.is_repeated:
            out[field.name] = [_scalar(field, v, defaults, triton_strings) for v in value]
        else:
            out[field.name] = _scalar(field, value, defaults, triton_strings)
    return out


def _fields(message: Message, defaults: bool) -> list[tuple[FieldDescriptor, Any]]:
    if not defaults:
        return list(message.ListFields())
    return [
        (field, getattr(message, field.name))
        for field in message.DESCRIPTOR.fields
        if not field.has_presence or message.HasField(field.name)  # (repeated: no presence)
    ]
