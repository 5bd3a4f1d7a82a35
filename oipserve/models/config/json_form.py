"""A protobuf message as the JSON Triton answers for a model configuration.

protobuf's ``json_format.MessageToDict`` writes 64-bit integers as strings (the
proto3 JSON mapping); Triton's ``/v2/models/{m}/config`` writes them as numbers
(``"dims": [16]``), and clients index them as numbers. This walk renders only the
fields that are given (as ``MessageToDict`` does), keeps proto field names, names
enums, and writes every integer as a JSON number.
"""

from __future__ import annotations

import base64
import math

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["message_json"]


def _scalar(field: FieldDescriptor, value: object) -> object:
    if isinstance(value, Message):  # (a field of a message type)
        return message_json(value)
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def message_json(message: Message) -> dict[str, object]:
    """The given fields of ``message`` as plain JSON-ready values."""
    out: dict[str, object] = {}
    for field, value in message.ListFields():
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            out[field.name] = {str(k): _scalar(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_scalar(field, v) for v in value]
        else:
            out[field.name] = _scalar(field, value)
    return out
