"""Large JSON texts handled in the worker, so the front's event loop never spends tens of
milliseconds on one request.

Requests: the worker's half of ``oipserve.request.json_offload``. The front hands a worker a
large JSON body lying in one of its segments; both steps run the wire contract's
code, the same the front runs for small bodies, so a client gets the same answer and
the same error words whichever side read its body.

Responses: a large output the client wants as JSON is printed here (``print_output``)
exactly as the front would print it (orjson, flat), and the front splices the text
into its response without reading it (``oipserve.front.rest.render``).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np
import orjson

from oipserve.wire.datatypes import bf16_to_float32
from oipserve.wire.json_request import data_spans
from oipserve.wire.json_values import array_from_values, bytes_as_text, decode_data
from oipserve.wire.messages import JsonText, ParseJson
from oipserve.wire.shm import SegmentCache

if TYPE_CHECKING:
    from workers.runtime import Prepared

__all__ = ["decode", "parse", "print_output"]

#: Array kinds orjson prints as the front does (booleans, integers, floats).
_PRINTABLE = frozenset("biuf")
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def parse(message: ParseJson, segments: SegmentCache) -> list[tuple[int, int]]:
    """Where each input's ``data`` text lies in the body; ValueError for a bad body."""
    view = segments.get(message.segment).buf[message.offset : message.offset + message.nbytes]
    try:
        return data_spans(view)
    finally:
        view.release()


def decode(texts: list[JsonText], segments: SegmentCache) -> None:
    """Decode each text into its target; DataError (a ValueError) for bad ``data``."""
    for text in texts:
        source = segments.get(text.segment).buf[text.offset : text.offset + text.nbytes]
        try:
            values = decode_data(text.name, text.datatype, source)
            array = array_from_values(text.name, text.datatype, values, text.count)
            del values
        finally:
            source.release()
        target = segments.get(text.target).buf
        end = text.target_offset + array.nbytes
        target[text.target_offset : end] = np.ascontiguousarray(array).view(np.uint8).data


def print_output(datatype: str, ready: Prepared, nbytes: int) -> bytes | None:
    """The JSON text of an output's ``data`` as the front prints it; None: the front prints it.

    ``ready`` is the output as ``runtime.output_size`` prepared it: an array, BYTES
    elements, or a BF16 OrtValue of ``nbytes``.
    """
    if isinstance(ready, list):  # BYTES elements
        return orjson.dumps(bytes_as_text(ready))
    if isinstance(ready, np.ndarray):
        if ready.dtype.kind not in _PRINTABLE or ready.dtype.byteorder == ">":
            return None
        return orjson.dumps(np.ascontiguousarray(ready).reshape(-1), option=_NUMPY)
    if datatype == "BF16":  # an OrtValue: numpy has no bfloat16
        raw = np.frombuffer(ctypes.string_at(ready.data_ptr(), nbytes), dtype=np.uint16)
        return orjson.dumps(bf16_to_float32(raw), option=_NUMPY)
    return None
