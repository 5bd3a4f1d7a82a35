"""The values of a JSON ``data`` array, decoded and checked against a datatype.

Part of the wire contract because both sides do it: the front for small bodies,
a worker for large ones (``oipserve.request.json_offload``). One implementation means one
set of rules and the same message for the same mistake, wherever it is found.

The checks are strict: no string is parsed as a number, no float is truncated to
an integer, no integer wraps around. Errors are ``DataError``; the front raises
them as InvalidInput (``oipserve.request.tensors``), a worker answers them as an
INVALID_INPUT failure.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

import msgspec
import numpy as np

from oipserve.wire.datatypes import (
    FLOAT_TYPES,
    INTEGER_TYPES,
    NUMPY_DTYPES,
    bf16_to_float32,
    float32_to_bf16,
)
from oipserve.wire.json_numbers import MAX_JSON_DEPTH, MIN_BODY, NumberArrayDecoder
from oipserve.wire.json_request import syntax_error

__all__ = [
    "MAX_JSON_DEPTH",
    "DataError",
    "array_from_values",
    "bytes_as_text",
    "count_words",
    "decode_data",
    "flatten",
    "nesting_error",
    "packed_from_values",
    "too_deep",
]


class DataError(ValueError):
    """The ``data`` of an input is not what its datatype and shape say; the text is for clients."""


def count_words(found: int, count: int) -> str:
    """Triton's HTTP front's words for JSON ``data`` of ``found`` numbers where the shape
    holds ``count`` (its ReadDataFromJson: a 500 there, a 400 here)."""
    if found > count:
        return "Unable to parse 'data': Shape does not match true shape of 'data' field"
    return "Failed to parse 'data' field: shape does not match true shape"


def nesting_error(name: str) -> DataError:
    """Triton's words for ``data`` nested past ``MAX_JSON_DEPTH``, then ours."""
    return DataError(
        f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH}): 'data' of "
        f"input '{name}' has a value inside {MAX_JSON_DEPTH} or more nested arrays"
    )


def too_deep(values: object) -> bool:
    """Whether decoded ``data`` nests past ``MAX_JSON_DEPTH`` (as Triton counts it).

    Only on error paths: numpy refuses more than 64 dimensions, so nesting that deep
    never becomes an array and normal requests never pay for this walk.
    """
    # (each entry: an array and the depth of its elements)
    stack: list[tuple[list[object], int]] = [(values, 1)] if isinstance(values, list) else []
    while stack:
        items, depth = stack.pop()
        if items and depth >= MAX_JSON_DEPTH:
            return True
        stack.extend((item, depth + 1) for item in items if isinstance(item, list))
    return False


DATA_DECODER: Final = msgspec.json.Decoder()
_RAW_LIST_DECODER: Final = msgspec.json.Decoder(list[msgspec.Raw])
#: One per process: it keeps its parse buffers between requests (``json_numbers``).
LARGE_DATA_DECODER: Final = NumberArrayDecoder()


def decode_data(name: str, datatype: str, raw: msgspec.Raw | memoryview) -> Any:
    """The values of one input's ``data`` text: a flat numpy array or nested lists.

    Large number arrays go straight into numpy (``json_numbers``); the rest, and
    whatever that path declines, is decoded by msgspec.
    """
    if len(raw) >= MIN_BODY:
        array = LARGE_DATA_DECODER.decode(memoryview(raw), datatype)
        if array is not None:
            return array
    try:
        values = DATA_DECODER.decode(raw)  # PERF: a Raw decodes faster than a view of it
    except UnicodeDecodeError:  # msgspec before 0.23
        raise _not_utf8(name, raw) from None
    except msgspec.DecodeError as exc:
        # NOTE: msgspec 0.23 reports a string that is not UTF-8 as a DecodeError: told
        #   apart by the bytes, not by its wording.
        if not _is_utf8(raw):
            raise _not_utf8(name, raw) from None
        raise DataError(
            f"malformed JSON in 'data' of input '{name}': {syntax_error(exc, raw)}"
        ) from None
    except RecursionError:
        raise nesting_error(name) from None
    # NOTE: checked after decoding, not before: a look at the first byte costs every
    #   request a view, and what is decoded here is bounded by the body's size anyway.
    if not isinstance(values, list):
        raise DataError(f"'data' of input '{name}' must be an array")
    return values


def _is_utf8(raw: msgspec.Raw | memoryview) -> bool:
    try:
        str(memoryview(raw), "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _not_utf8(name: str, raw: msgspec.Raw | memoryview) -> DataError:
    return DataError(
        f"element {_bad_utf8_element(memoryview(raw))} of input '{name}' is not valid UTF-8: "
        "JSON strings must be UTF-8 text (send other bytes as binary data)"
    )


def _bad_utf8_element(text: memoryview) -> int | str:
    """The flat (row-major) index of the first string in ``text`` that is not UTF-8.

    Only on the error path: msgspec's error says which bytes (before 0.23) or nothing
    (from 0.23), not where.
    """
    index = 0

    def walk(items: list[msgspec.Raw]) -> int | None:
        nonlocal index
        for item in items:
            piece = memoryview(item)
            if piece[:1].tobytes() == b"[":
                found = walk(_RAW_LIST_DECODER.decode(piece))
                if found is not None:
                    return found
                continue
            try:
                DATA_DECODER.decode(piece)
            except (UnicodeDecodeError, msgspec.DecodeError):  # (a whole element: not UTF-8)
                return index
            index += 1
        return None

    try:
        found = walk(_RAW_LIST_DECODER.decode(text))
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        found = None
    return "?" if found is None else found


_KIND_WORDS: Final = {
    "b": "booleans",
    "i": "integers",
    "u": "integers",
    "f": "numbers",
    "U": "strings",
    "O": "mixed values",
}


def flatten(values: Iterable[object], out: list[object]) -> None:
    """Append the leaves of nested JSON arrays to ``out``, in row-major order."""
    for value in values:
        if isinstance(value, list):
            flatten(value, out)
        else:
            out.append(value)


def _exact_ints(values: list[object] | np.ndarray) -> np.ndarray | None:
    """An object array of the values if every one is a true JSON integer, else None."""
    flat: list[object] = []
    flatten(values, flat)
    if all(type(v) is int for v in flat):
        return np.array(flat, dtype=object)
    return None


#: Inclusive value ranges of the integer types, as Python ints (cheap to compare).
_INT_BOUNDS: Final = {
    name: (int(np.iinfo(NUMPY_DTYPES[name]).min), int(np.iinfo(NUMPY_DTYPES[name]).max))
    for name in INTEGER_TYPES
}
#: Largest finite magnitude of the float types narrower than float64.
_FLOAT_LIMITS: Final = {
    name: float(np.finfo(NUMPY_DTYPES[name]).max)
    for name in FLOAT_TYPES
    if name not in ("FP64", "BF16")
} | {"BF16": float(bf16_to_float32(np.array([0x7F7F], dtype=np.uint16))[0])}


def _kind_error(name: str, datatype: str, expected: str, source: np.ndarray) -> DataError:
    got = _KIND_WORDS.get(source.dtype.kind, str(source.dtype))
    return DataError(
        f"input '{name}' has datatype {datatype}; 'data' must be {expected}, got {got}"
    )


def array_from_values(name: str, datatype: str, values: object, count: int) -> np.ndarray:
    """A flat numpy array of ``datatype`` from JSON values, or DataError saying why not."""
    # PERF: this runs for every JSON input; numpy scalar comparisons, np.iinfo and
    #   np.errstate each cost about a microsecond, so bounds are precomputed.
    # NOTE: an ndarray comes from json_numbers: a flat array of JSON numbers, parsed
    #   as float64, int64 or uint64, and checked below like any decoded list.
    if not isinstance(values, (list, np.ndarray)):
        raise DataError(f"'data' of input '{name}' must be an array")
    if type(values) is list and 0 < len(values) == count <= SMALL_FLAT:
        small = _small_flat(name, datatype, values)
        if small is not None:
            return small
    try:
        source = np.asarray(values)
    except (ValueError, OverflowError):
        if too_deep(values):
            raise nesting_error(name) from None
        raise DataError(
            f"'data' of input '{name}' is ragged or holds values of mixed types: "
            "nested arrays must all have the same length"
        ) from None
    if source.size != count:
        raise DataError(
            f"{count_words(source.size, count)}: input '{name}': its shape holds {count} "
            f"elements but 'data' has {source.size}"
        )
    source = source.reshape(-1)
    if count == 0:
        return np.empty(0, dtype=NUMPY_DTYPES[datatype])
    kind = source.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise _kind_error(name, datatype, "true/false", source)
        return source
    bounds = _INT_BOUNDS.get(datatype)
    if bounds is not None:
        if kind in "fO":
            # NOTE: numpy infers float64 (or object) when ints span beyond int64,
            #   e.g. [0, 2**64 - 1]; check such values as exact Python ints instead.
            exact = _exact_ints(values)
            if exact is not None:
                source, kind = exact, "i"
        if kind not in "iu":
            raise _kind_error(name, datatype, "integers", source)
        _check_int_range(name, datatype, int(source.min()), int(source.max()), bounds)
        return source.astype(NUMPY_DTYPES[datatype])
    if datatype in FLOAT_TYPES:
        if kind not in "iuf":
            raise _kind_error(name, datatype, "numbers", source)
        # NOTE: integers too: 70000 is beyond FP16 and would become inf.
        _check_float_range(name, datatype, float(source.min()), float(source.max()), source)
        if datatype == "BF16":
            return float32_to_bf16(source.astype(np.float32))
        return source.astype(NUMPY_DTYPES[datatype])
    raise DataError(f"input '{name}': datatype {datatype} cannot be sent as JSON values")


#: Flat lists of at most this many values skip numpy's type inference: checking each
#: value's type and the bounds in Python costs less than ``np.asarray`` and two
#: reductions: 2.4 against 5.0 us for 16 INT32 values, 3.8 against 5.7 at 32; by 64
#: the two are nearly even.
SMALL_FLAT: Final = 32


def packed_from_values(name: str, datatype: str, values: object, count: int) -> bytes | np.ndarray:
    """The bytes of ``count`` values of ``datatype`` as a tensor holds them: a small flat
    list of plain values packed straight to bytes (``_small_checked``), anything else
    through ``array_from_values``; DataError for what it refuses.

    PERF: the front places a request's inputs in shared memory and needs their bytes, not
    an array. For 16 INT32 values numpy made 7 objects (the array, its uint8 view, the
    flat reshape, a memoryview and its managed buffer, a format string) and ran its type
    discovery; a precompiled ``struct.Struct`` makes the bytes (and the argument tuple).
    Both round a float as C does (to nearest, ties to even)."""
    if type(values) is list and 0 < len(values) == count <= SMALL_FLAT:
        packers = _PACKERS.get(datatype)
        if packers is not None and _small_checked(name, datatype, values):
            return packers[count](*values)
    return array_from_values(name, datatype, values, count)


def _small_flat(name: str, datatype: str, values: list[object]) -> np.ndarray | None:
    """``values`` as an array when ``_small_checked`` takes them; else None, and the
    general path decides (its messages for wrong kinds stay the only ones)."""
    if _small_checked(name, datatype, values):
        return np.array(values, dtype=NUMPY_DTYPES[datatype])
    return None


def _small_checked(name: str, datatype: str, values: list[object]) -> bool:
    """True when ``values`` are all JSON integers (integer datatypes) or all JSON floats
    (FP16, FP32, FP64), in range as the general path checks them (DataError beyond);
    False for anything else, which the general path decides.

    PERF: one indexed pass (mypyc) finds the least and greatest: ``min`` and ``max``
    made an iterator each."""
    bounds = _INT_BOUNDS.get(datatype)
    if bounds is not None:
        low = high = 0
        for index in range(len(values)):
            value = values[index]
            if type(value) is not int:  # (a bool is not an int here)
                return False
            if index == 0 or value < low:
                low = value
            if index == 0 or value > high:
                high = value
        _check_int_range(name, datatype, low, high, bounds)
        return True
    if datatype in _SMALL_FLOATS:
        least = greatest = 0.0
        for index in range(len(values)):
            value = values[index]
            if type(value) is not float:
                return False
            if index == 0 or value < least:
                least = value
            if index == 0 or value > greatest:
                greatest = value
        _check_float_range(name, datatype, least, greatest, cast("list[float]", values))
        return True
    return False


#: The float types ``_small_checked`` takes (BF16 is converted from float32).
_SMALL_FLOATS: Final = frozenset({"FP16", "FP32", "FP64"})

#: struct's little-endian code of each datatype ``packed_from_values`` packs.
_STRUCT_CODES: Final = {
    "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q",
    "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q",
    "FP16": "e", "FP32": "f", "FP64": "d",
}  # fmt: skip
#: Per datatype, the packer of each count up to ``SMALL_FLAT`` (index: the count): a
#: ``struct.Struct``'s bound ``pack``, kept (a method looked up at each call is a new object).
_PACKERS: Final[dict[str, list[Callable[..., bytes]]]] = {
    datatype: [struct.Struct(f"<{count}{code}").pack for count in range(SMALL_FLAT + 1)]
    for datatype, code in _STRUCT_CODES.items()
}


def _check_int_range(
    name: str, datatype: str, low: int, high: int, bounds: tuple[int, int]
) -> None:
    if low < bounds[0] or high > bounds[1]:
        bad = low if low < bounds[0] else high
        raise DataError(
            f"input '{name}': value {bad} is out of range for {datatype} [{bounds[0]}, {bounds[1]}]"
        )


def _check_float_range(
    name: str, datatype: str, low: float, high: float, values: np.ndarray | list[float]
) -> None:
    """DataError when a finite value of ``values`` (``low`` and ``high`` their least and
    greatest) is beyond ``datatype``'s largest. An infinity is not: every float type holds
    it, and gRPC's typed contents carry it (an attention mask's -inf); JSON has no token
    for one (msgspec refuses ``1e400``). It was refused as too large (found by fuzzing)."""
    limit = _FLOAT_LIMITS.get(datatype)
    if limit is not None and max(-low, high) > limit:
        array = np.asarray(values, dtype=np.float64)
        finite = array[np.isfinite(array)]
        if finite.size and float(np.abs(finite).max()) > limit:
            raise DataError(f"input '{name}': a value is too large for {datatype}")


def bytes_as_text(elements: Iterable[bytes | memoryview]) -> list[str]:
    """BYTES output elements as the JSON strings of a response (invalid UTF-8 replaced)."""
    return [str(element, "utf-8", "replace") for element in elements]
