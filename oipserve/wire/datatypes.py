"""The OIP datatype table and the BYTES element codec.

``DATATYPES`` is the one place that says what a datatype is: its numpy storage,
its ONNX type, its name in Triton's ``config.pbtxt``, the gRPC
``InferTensorContents`` field that carries its typed values, what JSON values
it takes, and whether decoded images can be cast to it. Every other lookup in
the front and the workers (``NUMPY_DTYPES``, ``BY_ONNX``, ``BY_TRITON``, …) is
derived from it below, never written out again.
"""

from __future__ import annotations

import struct
from typing import Final, Literal, NamedTuple

import numpy as np

JsonKind = Literal["bool", "int", "float", "bytes"]


class Datatype(NamedTuple):
    #: The protocol's name ("FP32").
    name: str
    #: How the elements are stored. BF16 has no numpy dtype: it travels as raw uint16
    #: words (the upper half of an IEEE float32). BYTES is variable-sized (object).
    numpy: np.dtype
    #: ONNX Runtime's type string of a tensor of this datatype.
    onnx: str
    #: The ``data_type`` enum name in Triton's model configuration.
    triton: str
    #: The ``InferTensorContents`` field of gRPC typed values; None: raw contents only.
    grpc_contents: str | None
    #: What a JSON ``data`` element is for this datatype.
    json: JsonKind
    #: The element type's name in messages and image specs ("float32", "bfloat16").
    element: str
    #: Decoded images can be cast to it (the list OVMS accepts).
    image: bool


def _row(
    name: str,
    numpy: type,
    onnx: str,
    triton: str,
    grpc: str | None,
    json: JsonKind,
    image: bool,
    element: str | None = None,
) -> Datatype:
    dtype = np.dtype(numpy)
    return Datatype(name, dtype, onnx, triton, grpc, json, element or dtype.name, image)


# fmt: off
DATATYPES: Final[dict[str, Datatype]] = {row.name: row for row in (
    #    OIP      numpy       ONNX                 config.pbtxt   gRPC contents      JSON   images
    _row("BOOL",   np.bool_,   "tensor(bool)",     "TYPE_BOOL",   "bool_contents",   "bool", False),
    _row("UINT8",  np.uint8,   "tensor(uint8)",    "TYPE_UINT8",  "uint_contents",   "int", True),
    _row("UINT16", np.uint16,  "tensor(uint16)",   "TYPE_UINT16", "uint_contents",   "int", True),
    _row("UINT32", np.uint32,  "tensor(uint32)",   "TYPE_UINT32", "uint_contents",   "int", False),
    _row("UINT64", np.uint64,  "tensor(uint64)",   "TYPE_UINT64", "uint64_contents", "int", False),
    _row("INT8",   np.int8,    "tensor(int8)",     "TYPE_INT8",   "int_contents",    "int", True),
    _row("INT16",  np.int16,   "tensor(int16)",    "TYPE_INT16",  "int_contents",    "int", True),
    _row("INT32",  np.int32,   "tensor(int32)",    "TYPE_INT32",  "int_contents",    "int", True),
    _row("INT64",  np.int64,   "tensor(int64)",    "TYPE_INT64",  "int64_contents",  "int", False),
    _row("FP16",   np.float16, "tensor(float16)",  "TYPE_FP16",   None,              "float", True),
    _row("FP32",   np.float32, "tensor(float)",    "TYPE_FP32",   "fp32_contents",   "float", True),
    _row("FP64",   np.float64, "tensor(double)",   "TYPE_FP64",   "fp64_contents",   "float", True),
    _row("BF16",   np.uint16,  "tensor(bfloat16)", "TYPE_BF16",   None,              "float", False,
         element="bfloat16"),
    _row("BYTES",  object,     "tensor(string)",   "TYPE_STRING", "bytes_contents",  "bytes", False,
         element="bytes"),
)}
# fmt: on

# ---- views of the table, for lookups on the hot path ------------------------

NUMPY_DTYPES: Final[dict[str, np.dtype]] = {name: row.numpy for name, row in DATATYPES.items()}
#: Bytes per element; BYTES is variable-sized and absent.
ELEMENT_SIZES: Final[dict[str, int]] = {
    name: row.numpy.itemsize for name, row in DATATYPES.items() if row.json != "bytes"
}
BY_ONNX: Final[dict[str, Datatype]] = {row.onnx: row for row in DATATYPES.values()}
BY_TRITON: Final[dict[str, Datatype]] = {row.triton: row for row in DATATYPES.values()}
INTEGER_TYPES: Final = frozenset(name for name, row in DATATYPES.items() if row.json == "int")
FLOAT_TYPES: Final = frozenset(name for name, row in DATATYPES.items() if row.json == "float")
#: Element type names (numpy's) that decoded images can be cast to.
IMAGE_ELEMENTS: Final = frozenset(row.element for row in DATATYPES.values() if row.image)

#: The 4-byte little-endian unsigned length that prefixes each BYTES element (and, in
#: the same form, each front<->worker message frame: see ``wire.framing``).
LENGTH_PREFIX: Final = struct.Struct("<I")


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    count = 1
    for index in range(len(shape)):  # PERF: (mypyc) indexed: iterating made an iterator
        count *= shape[index]
    return count


def byte_size(datatype: str, shape: tuple[int, ...] | list[int]) -> int:
    """Size of a fixed-width tensor; not defined for BYTES."""
    return ELEMENT_SIZES[datatype] * element_count(shape)


# ---- BYTES: uint32 LE length, then the bytes, per element ---------------------


def bytes_elements_size(elements: list[bytes]) -> int:
    return 4 * len(elements) + sum(len(e) for e in elements)


def write_bytes_elements(target: memoryview, offset: int, elements: list[bytes]) -> int:
    """Write ``elements`` in length-prefixed form at ``offset``; returns the end offset.

    The one writer of that form, in the front and in the workers.
    """
    pos = offset
    pack = LENGTH_PREFIX.pack_into
    for element in elements:
        size = len(element)
        pack(target, pos, size)
        pos += 4
        target[pos : pos + size] = element
        pos += size
    return pos


def encode_bytes_elements(elements: list[bytes]) -> bytearray:
    """BYTES elements in the protocol's binary form, in one new buffer."""
    out = bytearray(bytes_elements_size(elements))
    write_bytes_elements(memoryview(out), 0, elements)
    return out


def split_bytes_elements(buf: memoryview) -> list[memoryview]:
    """The elements of BYTES data in binary form (uint32 LE length, then the bytes), as views.

    The prefixes must tile ``buf`` exactly; a ValueError says where they do not. The
    views keep ``buf``'s exporter alive: a shared-memory segment cannot be closed while
    they exist.
    """
    parts, _ = bytes_elements_from(buf, 0, None)
    return parts


def bytes_elements_from(
    buf: memoryview, pos: int, most: int | None
) -> tuple[list[memoryview], int]:
    """Up to ``most`` elements (None: all) of BYTES data from offset ``pos``, and where
    the next one starts: for walking a large tensor a step at a time.

    The one walker of that form, in the front and in the workers; errors as
    ``split_bytes_elements``.
    """
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    total = len(view)
    parts: list[memoryview] = []
    unpack = LENGTH_PREFIX.unpack_from
    while pos < total and (most is None or len(parts) < most):
        if pos + 4 > total:
            raise ValueError(
                f"the length prefix of element {len(parts)} is cut off "
                f"({total - pos} of 4 bytes at offset {pos})"
            )
        (length,) = unpack(view, pos)
        start = pos + 4
        pos = start + length
        if pos > total:
            raise ValueError(
                f"element {len(parts)} declares {length} bytes but only {total - start} remain"
            )
        parts.append(view[start:pos])
    return parts, pos


def bytes_count_fault(name: str, model: str, data: memoryview, count: int) -> tuple[str, bool]:
    """What is wrong with BYTES data ``data`` for a shape of ``count`` elements ("" when
    nothing), and whether the words are Triton's: the elements walked as Triton's core walks
    them (``ValidateBytesInputs``, its words for input ``name`` of model ``model``, then
    ours): at each element, a length prefix cut off, then one element past the count; an
    element longer than the data left ends the walk, and fewer elements than the count are
    refused too. An element overrunning the end while the count is right passes Triton's
    core, and its ONNX Runtime backend refuses it (backend_common's ``ValidateStringBuffer``,
    its words without the model's name or the request's id, then ours). The front's check
    of data it holds and a worker's of a client's region (``workers.worker``) both."""
    view = data if data.format == "B" and data.ndim == 1 else data.cast("B")
    total = len(view)
    pos = found = length = 0
    unpack = LENGTH_PREFIX.unpack_from
    while pos < total:
        if total - pos < 4:
            return (
                f"incomplete string length indicator for inference input '{name}' for model "
                f"'{model}', expecting 4 bytes but only {total - pos} bytes available. Please "
                "make sure the string length indicator is in one buffer. (BYTES data of input "
                f"'{name}': the length prefix of element {found} is cut off: {total - pos} of "
                f"4 bytes at offset {pos})"
            ), True
        found += 1
        if found > count:
            return (
                f"unexpected number of string elements {found} for inference input '{name}' "
                f"for model '{model}', expecting {count}: "
                f"{_elements_text(name, view, count, found)}"
            ), True
        length = unpack(view, pos)[0]
        pos += 4 + length
    if found < count:
        return (
            f"expected {count} string elements for inference input '{name}' for model "
            f"'{model}', got {found}: {_elements_text(name, view, count, found)}"
        ), True
    if pos > total:  # the last element walked runs past the end
        left = total - (pos - length)
        return (
            f"incomplete string data for inference input '{name}', expecting string of "
            f"length {length} but only {left} bytes available (BYTES data of input "
            f"'{name}': element {found - 1} declares {length} bytes but only {left} remain)"
        ), False
    return "", False


def _elements_text(name: str, view: memoryview, count: int, walked: int) -> str:
    """Ours after Triton's words for BYTES data of another element count than its shape
    (``walked``: the elements Triton's walk saw)."""
    try:
        found = str(len(split_bytes_elements(view)))
    except ValueError as exc:
        found = f"{walked} ({exc})"
    return f"input '{name}': its shape holds {count} elements but its BYTES data has {found}"


# ---- BF16 ----------------------------------------------------------------------


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 words (round to nearest even), as uint16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_to_float32(words: np.ndarray) -> np.ndarray:
    return (words.astype(np.uint32) << 16).view(np.float32)
