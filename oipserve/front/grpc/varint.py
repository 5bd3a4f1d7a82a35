"""Protobuf's base-128 varint, written by hand where messages are assembled from parts."""

from __future__ import annotations


def varint_bytes(value: int) -> bytes:
    """``value`` (unsigned) as a protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
