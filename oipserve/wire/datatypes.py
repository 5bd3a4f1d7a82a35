"""The OIP datatype table and the BYTES element codec.

One table maps protocol datatype names to numpy dtypes and ONNX Runtime type
strings. Both the front and the workers import it, so it stays free of heavy
imports (numpy only).
"""

from __future__ import annotations

import struct

import numpy as np

# NOTE: BF16 has no numpy dtype; it travels as raw uint16 words (the upper half
#   of an IEEE float32) and is handed to ONNX Runtime as tensor(bfloat16).
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.uint16),
    "BYTES": np.dtype(object),
}

#: Bytes per element; BYTES is variable-sized and absent.
ELEMENT_SIZES: dict[str, int] = {
    name: dt.itemsize for name, dt in NUMPY_DTYPES.items() if name != "BYTES"
}

ONNX_TO_OIP: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}

INTEGER_TYPES = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
)
FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64", "BF16"})

_LENGTH = struct.Struct("<I")


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def byte_size(datatype: str, shape: tuple[int, ...] | list[int]) -> int:
    """Size of a fixed-width tensor; not defined for BYTES."""
    return ELEMENT_SIZES[datatype] * element_count(shape)


def encode_bytes_elements(elements: list[bytes]) -> bytes:
    """Serialise BYTES elements as the protocol's 4-byte little-endian length + bytes."""
    parts: list[bytes] = []
    for element in elements:
        parts.append(_LENGTH.pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def split_bytes_elements(buf: memoryview) -> list[memoryview]:
    """The elements of BYTES data in binary form (uint32 LE length, then the bytes), as views.

    The one walker of that form, in the front and in the workers. The prefixes must
    tile ``buf`` exactly; a ValueError says where they do not. The views keep ``buf``'s
    exporter alive: a shared-memory segment cannot be closed while they exist.
    """
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    total = len(view)
    parts: list[memoryview] = []
    pos = 0
    while pos < total:
        if pos + 4 > total:
            raise ValueError(
                f"the length prefix of element {len(parts)} is cut off "
                f"({total - pos} of 4 bytes at offset {pos})"
            )
        (length,) = _LENGTH.unpack_from(view, pos)
        start = pos + 4
        pos = start + length
        if pos > total:
            raise ValueError(
                f"element {len(parts)} declares {length} bytes but only {total - start} remain"
            )
        parts.append(view[start:pos])
    return parts


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 words (round to nearest even), as uint16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_to_float32(words: np.ndarray) -> np.ndarray:
    return (words.astype(np.uint32) << 16).view(np.float32)
