"""The worker's half of ``oipserve.json_offload``: large JSON bodies parsed and decoded here.

The front hands a worker a large JSON body lying in one of its segments, so that
its event loop never spends tens of milliseconds on one request. Both steps run
the wire contract's code, the same the front runs for small bodies, so a client
gets the same answer and the same error words whichever side read its body.
"""

from __future__ import annotations

import numpy as np

from oipserve.wire.json_request import data_spans
from oipserve.wire.json_values import array_from_values, decode_data
from oipserve.wire.messages import JsonText, ParseJson
from oipserve.wire.shm import SegmentCache

__all__ = ["decode", "parse"]


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
