"""Values protobuf's parsers accept that no configuration means: found by walking the
parsed message (nested messages, lists and maps included), each named by its field.

- Enum numbers no value names. ``model_config.proto`` is proto3, whose enums are open:
  the text and JSON parsers take any number (``"data_type": 99``, ``kind: 7``) and keep it;
  the checks that name a value (a datatype's row, a group's kind) cannot.
- Durations past what the server can count. Every ``*_microseconds`` field is a uint64;
  the scheduler and the fronts' messages carry it as int64 nanoseconds, so one above
  ``MAX_MICROSECONDS`` (~106 days) overflowed where it was first sent (a front's start
  failed, a load's answer was a 500 and the other front lost).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

__all__ = ["MAX_MICROSECONDS", "meaningless_value"]

#: Most microseconds a duration field may hold: as nanoseconds, an int64.
MAX_MICROSECONDS = (2**63 - 1) // 1000


def meaningless_value(message: Any) -> str | None:
    """The first field holding an unnamed enum number or a too long duration, as a sentence
    naming it; None when there is none. One walk over the message."""
    return _first(message, "")


def _judge(field: FieldDescriptor, value: Any, where: str) -> str | None:
    """What is wrong with one scalar value of ``field`` at ``where``, or None."""
    if field.type == FieldDescriptor.TYPE_ENUM and value not in field.enum_type.values_by_number:
        names = ", ".join(v.name for v in field.enum_type.values)
        return f"{where}: {value} is not a value of {field.enum_type.name} (one of {names})"
    if field.name.endswith("_microseconds") and value > MAX_MICROSECONDS:
        return f"{where}: {value} is more than {MAX_MICROSECONDS} microseconds (the limit)"
    return None


def _first(message: Any, path: str) -> str | None:
    for field, value in message.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            items = [(f"{where}[{key!r}]", item) for key, item in value.items()]
            found = _in_items(entry, items)
        elif field.is_repeated:
            items = [(f"{where}[{index}]", item) for index, item in enumerate(value)]
            found = _in_items(field, items)
        else:
            found = _in_items(field, [(where, value)])
        if found:
            return found
    return None


def _in_items(field: FieldDescriptor, items: list[tuple[str, Any]]) -> str | None:
    for where, value in items:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            found = _first(value, where)
        else:
            found = _judge(field, value, where)
        if found:
            return found
    return None
