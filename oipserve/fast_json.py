"""Large JSON inference requests: number arrays parsed straight into numpy.

msgspec turns each number of a JSON ``data`` array into a Python object, and
numpy then walks those objects again: for a 1 MiB FP32 tensor (262,144 numbers,
~5 MB of text) that is ~19 ms of the front's time. simdjson's ``as_buffer``
writes a flat array of JSON numbers into one C buffer instead (~6 ms for the
whole request); the few hundred bytes around the arrays are then checked by
``msgspec.convert`` against the same Struct the standard decoder uses.

This is an accelerator, never a second opinion: it answers ``None`` whenever
it cannot show its result is the standard decoder's (nested, boolean or string
``data``, BYTES and BOOL tensors, any simdjson or validation error), and the
caller then decodes with msgspec, which also writes any error message. The only
difference in a result is that ``data`` is a flat float64/int64/uint64 array
rather than a list; ``tensors.array_from_values`` checks both the same way.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import simdjson

from oipserve.wire.datatypes import DATATYPES

#: Bodies shorter than this go to msgspec directly: below it the two-step
#: decode (simdjson, then msgspec.convert) costs more than it saves (measured:
#: 1,024 FP32 numbers, 20 KB, 61 us with msgspec and 53 us here; 256, 5 KB, 17 vs 23 us).
MIN_BODY = 16 * 1024

#: ``as_buffer`` element type per OIP datatype: doubles for the float types,
#: 64-bit integers for the integer types (ranges are checked afterwards by
#: ``tensors.array_from_values``, exactly as for decoded lists).
_BUFFER_TYPES = {
    name: "d" if row.json == "float" else "u" if row.numpy == np.uint64 else "i"
    for name, row in DATATYPES.items()
    if row.json in ("int", "float")
}
_BUFFER_DTYPES = {"d": np.float64, "i": np.int64, "u": np.uint64}
_LEFT_BRACKET = ord("[")


#: The parser keeps buffers of about twice the largest body it has parsed; after
#: a body larger than this it is replaced, so one huge request does not pin
#: hundreds of megabytes in the front for good.
RETAIN_MAX = 32 * 1024 * 1024
#: Bytes scanned at a time when counting brackets (bounds the temporary mask).
_SCAN_STEP = 4 * 1024 * 1024

#: Most arrays a nested ``data`` value may hold for the fast path: checking that
#: they are regular costs a Python step each (an image [1, 3, 224, 224] has 676).
MAX_NESTED_ARRAYS = 4096


class _NotFast(Exception):
    """The request is not one the fast path can decode exactly."""


class NumberArrayDecoder:
    """Decodes request bodies into ``struct_type``, number arrays as numpy arrays."""

    def __init__(self, struct_type: type[msgspec.Struct]) -> None:
        self._type = struct_type
        # NOTE: one parser, reused: its buffers stay allocated (and their pages
        #   mapped) between requests. Every simdjson proxy object must be gone
        #   before the next parse, so nothing here outlives a call.
        self._parser = simdjson.Parser()

    def decode(self, body: bytes | memoryview) -> Any | None:
        """The decoded request, or None: then decode it with msgspec instead."""
        try:
            document = self._parser.parse(body)
        except RuntimeError:
            # NOTE: "parser in use": some proxy of an earlier document is still
            #   alive. A new parser keeps the fast path working from the next body.
            self._parser = simdjson.Parser()
            return None
        except (ValueError, TypeError):
            return None
        try:
            header, data_brackets = _plain(document)
        except (_NotFast, ValueError, TypeError, RuntimeError, IndexError):
            return None
        finally:
            del document
            if len(body) > RETAIN_MAX:
                self._parser = simdjson.Parser()
        # NOTE: as_buffer flattens nested arrays without looking at their shape.
        #   _number_array checked every array above the numbers; an array hidden among
        #   the numbers (``[[1], 2]``) shows as one '[' more than the parts account for.
        if _count_brackets(body) != _header_brackets(header) + data_brackets:
            return None
        try:
            return msgspec.convert(header, self._type)
        except msgspec.ValidationError:
            return None


def _plain(document: Any) -> tuple[dict[str, Any], int]:
    """The request as plain Python values, each input's numbers as one flat array.

    Also returns how many JSON arrays the ``data`` values hold in all.
    """
    if not isinstance(document, simdjson.Object):
        raise _NotFast
    header = _object(document)
    inputs = header.get("inputs")
    if not isinstance(inputs, simdjson.Array):
        raise _NotFast
    plain_inputs = []
    data_brackets = 0
    for item in inputs:
        if not isinstance(item, simdjson.Object):
            raise _NotFast
        entry = _object(item)
        data = entry.get("data")
        kind = _BUFFER_TYPES.get(entry.get("datatype"))  # type: ignore[arg-type]
        if not isinstance(data, simdjson.Array) or kind is None:
            raise _NotFast
        array, brackets = _number_array(data, kind)
        data_brackets += brackets
        plain = {key: _python(value) for key, value in entry.items() if key != "data"}
        plain["data"] = array
        plain_inputs.append(plain)
    request = {key: _python(value) for key, value in header.items() if key != "inputs"}
    request["inputs"] = plain_inputs
    return request, data_brackets


def _number_array(data: Any, kind: str) -> tuple[np.ndarray, int]:
    """The numbers of a regular (maybe nested) JSON array, flat, and its array count."""
    dims = [len(data)]
    node = data
    while dims[-1] and isinstance(node := node[0], simdjson.Array):
        dims.append(len(node))
    # A regular array has prod(dims[:i]) arrays at depth i; bound the walk before it starts.
    arrays = sum(math.prod(dims[:depth]) for depth in range(len(dims)))
    if arrays > MAX_NESTED_ARRAYS:
        raise _NotFast
    # Every array above the innermost level must hold arrays of the same length,
    #   as numpy would require of a nested list.
    level = [data]
    for size in dims[1:]:
        children = []
        for parent in level:
            for child in parent:
                if not isinstance(child, simdjson.Array) or len(child) != size:
                    raise _NotFast
                children.append(child)
        level = children
    array = np.frombuffer(data.as_buffer(of_type=kind), dtype=_BUFFER_DTYPES[kind])
    if array.size != math.prod(dims):
        raise _NotFast
    return array, arrays


def _object(proxy: Any) -> dict[str, Any]:
    """A simdjson object's members as proxies (``items()`` would convert them all)."""
    keys = list(proxy.keys())
    if len(set(keys)) != len(keys):
        raise _NotFast  # which duplicate wins is msgspec's to say
    return {key: proxy[key] for key in keys}


def _python(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _header_brackets(value: Any) -> int:
    """How many '[' the JSON text of ``value`` holds (number arrays not counted)."""
    if isinstance(value, np.ndarray):
        return 0
    if isinstance(value, str):
        return value.count("[")
    if isinstance(value, list):
        return 1 + sum(_header_brackets(item) for item in value)
    if isinstance(value, dict):
        return sum(key.count("[") + _header_brackets(item) for key, item in value.items())
    return 0


def _count_brackets(body: bytes | memoryview) -> int:
    octets = np.frombuffer(body, dtype=np.uint8)
    return sum(
        int(np.count_nonzero(octets[start : start + _SCAN_STEP] == _LEFT_BRACKET))
        for start in range(0, len(octets), _SCAN_STEP)
    )
