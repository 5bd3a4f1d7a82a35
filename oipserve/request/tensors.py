"""Tensor values in their JSON (and gRPC typed-contents) form, to and from numpy.

The protocol's JSON carries tensors as nested or flat lists. The numeric rules
live in the wire contract (``wire.json_values``), shared with the workers that
decode large bodies; here they raise the front's InvalidInput. BYTES values and
the deferred decoding of inputs are the front's own.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np

from oipserve.errors import InvalidInput, RequestRefusal
from oipserve.wire import json_values as shared
from oipserve.wire.datatypes import NUMPY_DTYPES, bf16_to_float32, split_bytes_elements
from oipserve.wire.json_numbers import MAX_JSON_DEPTH
from oipserve.wire.json_values import DataError, bytes_as_text, flatten, nesting_error
from oipserve.wire.shm import Lease

__all__ = [
    "Deferred",
    "array_from_values",
    "bytes_from_values",
    "check_datatype",
    "decode_data",
    "flatten",
    "packed_from_values",
    "string_count_words",
]


class Deferred:
    """An input's values, not decoded yet: the data plane decodes them after its checks.

    Decoding is where a request's cost lies (a 60 MB JSON ``data`` becomes hundreds
    of MB of numbers), so the fronts hand the data plane this instead of values: it
    checks names, datatypes, shapes and batch sizes first, then compares the
    declared element count with ``most`` (the most elements the sent data can hold,
    known without decoding), and only then calls ``load``.

    ``text`` is set when the JSON text lies in a pooled segment (lease, offset, size):
    the data plane may then have a worker decode it (``oipserve.request.json_offload``)
    instead of calling ``load``. ``exact``: ``most`` is the element count itself (a gRPC
    tensor's typed contents), so another count is refused before decoding, in the words
    Triton's gRPC front leads to (``placement.payload``).
    """

    __slots__ = ("load", "most", "text", "exact")

    def __init__(
        self,
        load: Callable[[], object],
        most: int,
        text: tuple[Lease, int, int] | None = None,
        exact: bool = False,
    ) -> None:
        self.load = load
        self.most = most
        self.text = text
        self.exact = exact


class _Walk:
    """What a walk over nested BYTES values has seen: each depth's list length, and the
    depth of its strings (0: none yet); any other length or depth makes them ragged."""

    __slots__ = ("lengths", "leaf_depth")

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.leaf_depth = 0


def _flatten_strings(
    name: str, values: list[object], out: list[bytes], walk: _Walk, depth: int = 1
) -> None:
    """Append the BYTES elements of nested ``values`` (its elements at ``depth``) to ``out``;
    InvalidInput for ragged nesting, as the numeric types (``wire.json_values``)."""
    # NOTE: Triton's nesting limit, checked here as it walks: nothing to walk for it
    #   on a normal request (numbers are checked by numpy's 64-dimension limit).
    if depth >= MAX_JSON_DEPTH and values:
        raise InvalidInput(str(nesting_error(name)))
    lengths = walk.lengths
    if len(lengths) < depth:
        lengths.append(len(values))
    elif lengths[depth - 1] != len(values):
        raise _ragged(name)
    for value in values:
        if isinstance(value, list):
            _flatten_strings(name, value, out, walk, depth + 1)
            continue
        if walk.leaf_depth != depth:
            if walk.leaf_depth:
                raise _ragged(name)
            walk.leaf_depth = depth
        if isinstance(value, str):
            out.append(value.encode("utf-8"))
        elif isinstance(value, bytes):  # gRPC bytes_contents
            out.append(value)
        else:
            raise InvalidInput(
                f"input '{name}' has datatype BYTES, so 'data' must hold strings, "
                f"not {type(value).__name__} values"
            )


def _ragged(name: str) -> InvalidInput:
    return InvalidInput(
        f"'data' of input '{name}' is ragged: nested arrays must all have the same length"
        " and hold their strings at the same depth"
    )


def bytes_from_values(name: str, values: object, count: int, model: str = "") -> list[bytes]:
    """The elements of a BYTES input's JSON ``data``; another count than ``count`` is
    refused in the words of Triton's core (its HTTP front sizes BYTES data by the data
    itself, and core's ValidateBytesInputs counts the elements, for model ``model``),
    then ours."""
    if not isinstance(values, list):
        raise InvalidInput(f"'data' of input '{name}' must be an array")
    out: list[bytes] = []
    _flatten_strings(name, values, out, _Walk())
    if len(out) != count:
        ours = f"input '{name}': its shape holds {count} elements but 'data' has {len(out)}"
        raise RequestRefusal(string_count_words(name, model, count, len(out)) + ": " + ours)
    return out


def string_count_words(name: str, model: str, count: int, found: int) -> str:
    """Triton's core's words (ValidateBytesInputs) for BYTES data of ``found`` elements where
    the shape holds ``count``: it stops at the first element past the count."""
    if found > count:
        return (
            f"unexpected number of string elements {count + 1} for inference input '{name}' "
            f"for model '{model}', expecting {count}"
        )
    return (
        f"expected {count} string elements for inference input '{name}' for model '{model}', "
        f"got {found}"
    )


def check_datatype(name: str, datatype: str) -> None:
    """InvalidInput for a datatype the protocol does not define (REST and gRPC alike)."""
    if datatype not in NUMPY_DTYPES:
        raise InvalidInput(
            f"input '{name}' has unknown datatype '{datatype}' (known: {', '.join(NUMPY_DTYPES)})"
        )


def array_from_values(name: str, datatype: str, values: object, count: int) -> np.ndarray:
    """A flat numpy array of ``datatype`` from JSON values, or InvalidInput saying why not."""
    try:
        return shared.array_from_values(name, datatype, values, count)
    except DataError as exc:
        raise InvalidInput(str(exc)) from None


def packed_from_values(name: str, datatype: str, values: object, count: int) -> bytes | np.ndarray:
    """The bytes (or a flat array) of JSON values of ``datatype`` to place, or InvalidInput
    saying why not (``wire.json_values.packed_from_values``)."""
    try:
        return shared.packed_from_values(name, datatype, values, count)
    except DataError as exc:
        raise InvalidInput(str(exc)) from None


def decode_data(name: str, datatype: str, raw: msgspec.Raw | memoryview) -> object:
    """The values of one input's ``data`` text, or InvalidInput naming the input."""
    try:
        return shared.decode_data(name, datatype, raw)
    except DataError as exc:
        raise InvalidInput(str(exc)) from None


def json_values(datatype: str, data: memoryview, count: int) -> np.ndarray | list[str]:
    """An output tensor held in ``data``, flat, in a form the JSON encoder writes directly."""
    if datatype == "BYTES":
        return bytes_as_text(split_bytes_elements(data))
    if datatype == "BF16":
        return bf16_to_float32(np.frombuffer(data, dtype=np.uint16, count=count))
    return np.frombuffer(data, dtype=NUMPY_DTYPES[datatype], count=count)
