"""Tensor values in their JSON (and gRPC typed-contents) form, to and from numpy.

The protocol's JSON carries tensors as nested or flat lists; this is where
those lists are checked against the declared datatype and shape, strictly:
no string is parsed as a number, no float is truncated to an integer, no
integer wraps around.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from oipserve.errors import InvalidInput
from oipserve.wire.datatypes import (
    FLOAT_TYPES,
    INTEGER_TYPES,
    NUMPY_DTYPES,
    bf16_to_float32,
    float32_to_bf16,
    split_bytes_elements,
)


class Deferred:
    """An input's values, not decoded yet: the data plane decodes them after its checks.

    Decoding is where a request's cost lies (a 60 MB JSON ``data`` becomes hundreds
    of MB of numbers), so the fronts hand the data plane this instead of values: it
    checks names, datatypes, shapes and batch sizes first, then compares the
    declared element count with ``most`` (the most elements the sent data can hold,
    known without decoding), and only then calls ``load``.
    """

    __slots__ = ("load", "most")

    def __init__(self, load: Callable[[], object], most: int) -> None:
        self.load = load
        self.most = most


_KIND_WORDS = {
    "b": "booleans",
    "i": "integers",
    "u": "integers",
    "f": "numbers",
    "U": "strings",
    "O": "mixed values",
}


def _flatten_strings(name: str, values: list[object], out: list[bytes]) -> None:
    for value in values:
        if isinstance(value, str):
            out.append(value.encode("utf-8"))
        elif isinstance(value, list):
            _flatten_strings(name, value, out)
        elif isinstance(value, bytes):  # gRPC bytes_contents
            out.append(value)
        else:
            raise InvalidInput(
                f"input '{name}' has datatype BYTES, so 'data' must hold strings, "
                f"not {type(value).__name__} values"
            )


def bytes_from_values(name: str, values: object, count: int) -> list[bytes]:
    if not isinstance(values, list):
        raise InvalidInput(f"'data' of input '{name}' must be an array")
    out: list[bytes] = []
    _flatten_strings(name, values, out)
    if len(out) != count:
        raise InvalidInput(
            f"input '{name}': its shape holds {count} elements but 'data' has {len(out)}"
        )
    return out


def check_datatype(name: str, datatype: str) -> None:
    """InvalidInput for a datatype the protocol does not define (REST and gRPC alike)."""
    if datatype not in NUMPY_DTYPES:
        raise InvalidInput(
            f"input '{name}' has unknown datatype '{datatype}' (known: {', '.join(NUMPY_DTYPES)})"
        )


def flatten(values: list[object], out: list[object]) -> None:
    """Append the leaves of nested JSON arrays to ``out``, in row-major order."""
    for value in values:
        if isinstance(value, list):
            flatten(value, out)
        else:
            out.append(value)


def _exact_ints(values: list[object]) -> np.ndarray | None:
    """An object array of the values if every one is a true JSON integer, else None."""
    flat: list[object] = []
    flatten(values, flat)
    if all(type(v) is int for v in flat):
        return np.array(flat, dtype=object)
    return None


#: Inclusive value ranges of the integer types, as Python ints (cheap to compare).
_INT_BOUNDS = {
    name: (int(np.iinfo(NUMPY_DTYPES[name]).min), int(np.iinfo(NUMPY_DTYPES[name]).max))
    for name in INTEGER_TYPES
}
#: Largest finite magnitude of the float types narrower than float64.
_FLOAT_LIMITS = {
    name: float(np.finfo(NUMPY_DTYPES[name]).max)
    for name in FLOAT_TYPES
    if name not in ("FP64", "BF16")
} | {"BF16": float(bf16_to_float32(np.array([0x7F7F], dtype=np.uint16))[0])}


def _kind_error(name: str, datatype: str, expected: str, source: np.ndarray) -> InvalidInput:
    got = _KIND_WORDS.get(source.dtype.kind, str(source.dtype))
    return InvalidInput(
        f"input '{name}' has datatype {datatype}; 'data' must be {expected}, got {got}"
    )


def array_from_values(name: str, datatype: str, values: object, count: int) -> np.ndarray:
    """A flat numpy array of ``datatype`` from JSON values, or InvalidInput saying why not."""
    # PERF: this runs for every JSON input; numpy scalar comparisons, np.iinfo and
    #   np.errstate each cost about a microsecond, so bounds are precomputed.
    # NOTE: an ndarray comes from fast_json: a flat array of JSON numbers, parsed
    #   as float64, int64 or uint64, and checked below like any decoded list.
    if not isinstance(values, (list, np.ndarray)):
        raise InvalidInput(f"'data' of input '{name}' must be an array")
    try:
        source = np.asarray(values)
    except (ValueError, OverflowError):
        raise InvalidInput(
            f"'data' of input '{name}' is ragged or holds values of mixed types: "
            "nested arrays must all have the same length"
        ) from None
    if source.size != count:
        raise InvalidInput(
            f"input '{name}': its shape holds {count} elements but 'data' has {source.size}"
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
        low, high = int(source.min()), int(source.max())
        if low < bounds[0] or high > bounds[1]:
            bad = low if low < bounds[0] else high
            raise InvalidInput(
                f"input '{name}': value {bad} is out of range for {datatype} "
                f"[{bounds[0]}, {bounds[1]}]"
            )
        return source.astype(NUMPY_DTYPES[datatype])
    if datatype in FLOAT_TYPES:
        if kind not in "iuf":
            raise _kind_error(name, datatype, "numbers", source)
        limit = _FLOAT_LIMITS.get(datatype)
        # NOTE: integers too: 70000 is beyond FP16 and would become inf.
        if limit is not None and max(-float(source.min()), float(source.max())) > limit:
            raise InvalidInput(f"input '{name}': a value is too large for {datatype}")
        if datatype == "BF16":
            return float32_to_bf16(source.astype(np.float32))
        return source.astype(NUMPY_DTYPES[datatype])
    raise InvalidInput(f"input '{name}': datatype {datatype} cannot be sent as JSON values")


def json_values(datatype: str, data: memoryview, count: int) -> np.ndarray | list[str]:
    """An output tensor held in ``data``, flat, in a form the JSON encoder writes directly."""
    if datatype == "BYTES":
        return [str(element, "utf-8", "replace") for element in split_bytes_elements(data)]
    if datatype == "BF16":
        return bf16_to_float32(np.frombuffer(data, dtype=np.uint16, count=count))
    return np.frombuffer(data, dtype=NUMPY_DTYPES[datatype], count=count)
