"""Large JSON tensors: a ``data`` array of numbers parsed straight into numpy.

Part of the wire contract because both sides decode JSON ``data``: the front for
small bodies and the worker for large ones (``oipserve.request.json_offload``), with the
same code and the same error messages.

msgspec turns each number of a JSON ``data`` array into a Python object, and
numpy then walks those objects again: for a 1 MiB FP32 tensor (262,144 numbers,
~5 MB of text) that is ~19 ms of the front's time. simdjson's ``as_buffer``
writes a flat array of JSON numbers into one C buffer instead (~6 ms).

The request's header (names, shapes, datatypes) is decoded first by msgspec with
each ``data`` kept as raw JSON text (``wire.json_request``); the data plane
checks it against the model, and only then is each input's text decoded, by
``NumberArrayDecoder.decode`` when it is large. So a body whose shapes the model
cannot take costs a scan, never the numbers.

This is an accelerator, never a second opinion: it answers ``None`` whenever
it cannot show its result is the standard decoder's (nested ragged, boolean or
string ``data``, BYTES and BOOL tensors, any simdjson error), and the caller
then decodes with msgspec, which also writes any error message. The only
difference in a result is that ``data`` is a flat float64/int64/uint64 array
rather than a list; ``json_values.array_from_values`` checks both the same way.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import simdjson

from oipserve.wire.datatypes import DATATYPES

#: Triton's limit on the nesting of a JSON ``data`` array (HTTP_MAX_JSON_NESTING_DEPTH): it
#: counts the outermost array as depth 0 and refuses any array or value at depth 100, so
#: a value inside 100 nested arrays is refused and one inside 99 is not
#: (``json_values.nesting_error``).
MAX_JSON_DEPTH: Final = 100

#: ``data`` texts shorter than this go to msgspec directly: below it the two-step
#: decode (simdjson, then msgspec.convert) costs more than it saves (measured:
#: 1,024 FP32 numbers, 20 KB, 61 us with msgspec and 53 us here; 256, 5 KB, 17 vs 23 us).
MIN_BODY: Final = 16 * 1024

#: ``as_buffer`` element type per OIP datatype: doubles for the float types,
#: 64-bit integers for the integer types (ranges are checked afterwards by
#: ``json_values.array_from_values``, exactly as for decoded lists).
_BUFFER_TYPES: Final = {
    name: "d" if row.json == "float" else "u" if row.numpy == np.uint64 else "i"
    for name, row in DATATYPES.items()
    if row.json in ("int", "float")
}
_BUFFER_DTYPES: Final = {"d": np.float64, "i": np.int64, "u": np.uint64}
_LEFT_BRACKET: Final = ord("[")


#: The parser keeps buffers of about twice the largest body it has parsed; after
#: a body larger than this it is replaced, so one huge request does not pin
#: hundreds of megabytes in the front for good.
RETAIN_MAX = 32 * 1024 * 1024
#: Bytes scanned at a time when counting brackets (bounds the temporary mask).
_SCAN_STEP: Final = 4 * 1024 * 1024

#: Most arrays a nested ``data`` value may hold for the fast path: checking that
#: they are regular costs a Python step each (an image [1, 3, 224, 224] has 676).
MAX_NESTED_ARRAYS: Final = 4096


class _NotFast(Exception):
    """The request is not one the fast path can decode exactly."""


class NumberArrayDecoder:
    """Decodes the JSON text of one input's ``data`` into a flat numpy array."""

    def __init__(self) -> None:
        # NOTE: one parser, reused: its buffers stay allocated (and their pages
        #   mapped) between requests. Every simdjson proxy object must be gone
        #   before the next parse, so nothing here outlives a call.
        self._parser = simdjson.Parser()

    def decode(self, text: bytes | memoryview, datatype: str) -> np.ndarray | None:
        """The numbers of ``text`` (a JSON array) flat, or None: decode it with msgspec."""
        kind = _BUFFER_TYPES.get(datatype)
        if kind is None:
            return None
        try:
            document = self._parser.parse(text)
        except RuntimeError:
            # NOTE: "parser in use": some proxy of an earlier document is still
            #   alive. A new parser keeps the fast path working from the next body.
            self._parser = simdjson.Parser()
            return None
        except (ValueError, TypeError):
            return None
        try:
            if not isinstance(document, simdjson.Array):
                return None
            array, brackets = _number_array(document, kind)
        except (_NotFast, ValueError, TypeError, RuntimeError, IndexError):
            return None
        finally:
            del document
            if len(text) > RETAIN_MAX:
                self._parser = simdjson.Parser()
        # NOTE: as_buffer flattens nested arrays without looking at their shape.
        #   _number_array checked every array above the numbers; an array hidden among
        #   the numbers (``[[1], 2]``) shows as one '[' more than the walk accounts for.
        if _count_brackets(text) != brackets:
            return None
        return array


def _number_array(data: Any, kind: str) -> tuple[np.ndarray, int]:
    """The numbers of a regular (maybe nested) JSON array, flat, and its array count."""
    dims = [len(data)]
    node = data
    while dims[-1] and isinstance(node := node[0], simdjson.Array):
        dims.append(len(node))
    if len(dims) >= MAX_JSON_DEPTH:
        raise _NotFast  # the standard decoder refuses it, in Triton's words
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


def _count_brackets(body: bytes | memoryview) -> int:
    octets = np.frombuffer(body, dtype=np.uint8)
    return sum(
        int(np.count_nonzero(octets[start : start + _SCAN_STEP] == _LEFT_BRACKET))
        for start in range(0, len(octets), _SCAN_STEP)
    )
