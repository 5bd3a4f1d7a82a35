"""Enum fields holding a number their enum does not name.

``model_config.proto`` is proto3, whose enums are open: protobuf's text and JSON parsers
take any number for one (``"data_type": 99``, ``kind: 7``) and keep it. Such a value
means nothing to Triton or to this server, and the checks that name a value (a datatype's
row, an instance group's kind) cannot; the parse refuses it here first, naming the field.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

__all__ = ["unnamed_enum_value"]


def unnamed_enum_value(message: Any, path: str = "") -> str | None:
    """What the first enum field of ``message`` (nested messages, lists and maps
    included) holding an unnamed number is, as a sentence; None when there is none."""
    for field, value in message.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            found = _in_map(field.message_type.fields_by_name["value"], value, where)
        elif field.is_repeated:
            found = _in_list(field, value, where)
        else:
            found = _in_value(field, value, where)
        if found:
            return found
    return None


def _in_list(field: FieldDescriptor, values: Any, where: str) -> str | None:
    for index, item in enumerate(values):
        found = _in_value(field, item, f"{where}[{index}]")
        if found:
            return found
    return None


def _in_map(entry: FieldDescriptor, values: Any, where: str) -> str | None:
    for key, item in values.items():
        found = _in_value(entry, item, f"{where}[{key!r}]")
        if found:
            return found
    return None


def _in_value(field: FieldDescriptor, value: Any, where: str) -> str | None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return unnamed_enum_value(value, where)
    if field.type == FieldDescriptor.TYPE_ENUM and value not in field.enum_type.values_by_number:
        names = ", ".join(v.name for v in field.enum_type.values)
        return f"{where}: {value} is not a value of {field.enum_type.name} (one of {names})"
    return None
