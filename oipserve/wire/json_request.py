"""The JSON inference request of the REST front: typed msgspec Structs, decoded once.

Part of the wire contract because a large body is parsed by a worker
(``oipserve.request.json_offload``): the worker checks the whole body with the same decoder
the front uses and answers where each input's ``data`` text lies (``data_spans``),
so the front then decodes only the small rest.

``syntax_error`` words msgspec's syntax errors for clients; msgspec calls a string with an
unpaired UTF-16 surrogate escape (``"\\ud800"``, invalid Unicode) "Input data was
truncated", which sent clients looking for a short body.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec
import numpy as np

__all__ = [
    "InferRequest",
    "RequestInput",
    "RequestOutput",
    "data_spans",
    "decode_request",
    "syntax_error",
]

Parameters = dict[str, str | int | float | bool]


class RequestInput(msgspec.Struct, frozen=True):
    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    #: The JSON text of ``data``, decoded once the shape is checked (``json_values``).
    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class RequestOutput(msgspec.Struct, frozen=True):
    name: str
    parameters: Parameters | None = None


class InferRequest(msgspec.Struct, frozen=True):
    inputs: list[RequestInput]
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[RequestOutput] | None = None


REQUEST_DECODER: Final = msgspec.json.Decoder(InferRequest)


def decode_request(body: bytes | memoryview) -> InferRequest:
    """Decode an inference request header; any problem is a ``ValueError`` with the path.

    Each input's ``data`` stays raw JSON text; msgspec still checks that the whole
    body is well-formed JSON, without building values.
    """
    try:
        return REQUEST_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid inference request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed JSON: {syntax_error(exc, body)}") from None
    except RecursionError:
        raise ValueError(
            "JSON nesting depth exceeds maximum allowed limit (100): malformed JSON, nested "
            "too deeply"
        ) from None


#: A JSON escape: ``\\uXXXX`` (group 1: the code unit) or a backslash and any one byte.
_ESCAPE: Final = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
#: Where msgspec says a syntax error is ("... (byte 57)": the offset just past it).
_AT_BYTE: Final = re.compile(r"\(byte (\d+)\)")


def syntax_error(exc: msgspec.DecodeError, text: bytes | memoryview | msgspec.Raw) -> str:
    """What is wrong with ``text``, for a client, given msgspec's error (error path only).

    An unpaired surrogate escape is named as such, with its place, unless msgspec
    found another error before it.
    """
    found = unpaired_surrogate(text)
    if found is not None:
        at = _AT_BYTE.search(str(exc))
        # NOTE: msgspec's byte N is just past where it stopped: an error before the
        #   surrogate's backslash has N <= its offset.
        if at is None or int(at.group(1)) > found[0]:
            offset, escape = found
            return (
                f"the string escape '{escape}' at byte {offset} is an unpaired UTF-16 "
                "surrogate, which is not valid Unicode (a high surrogate \\ud800-\\udbff "
                "must be followed by a low one, \\udc00-\\udfff)"
            )
    return str(exc)


def unpaired_surrogate(text: bytes | memoryview | msgspec.Raw) -> tuple[int, str] | None:
    """(byte offset, the escape) of the first ``\\uXXXX`` escape in ``text`` that is half
    of a surrogate pair without its other half; None if there is none."""
    pending: re.Match[bytes] | None = None  # a high surrogate waiting for its low half
    for match in _ESCAPE.finditer(bytes(text)):
        unit = int(match.group(1), 16) if match.group(1) else -1
        if pending is not None:
            if 0xDC00 <= unit <= 0xDFFF and match.start() == pending.end():
                pending = None
                continue
            break
        if 0xD800 <= unit <= 0xDBFF:
            pending = match
        elif 0xDC00 <= unit <= 0xDFFF:
            return match.start(), match.group().decode("ascii")
    if pending is not None:
        return pending.start(), pending.group().decode("ascii")
    return None


def data_spans(body: memoryview) -> list[tuple[int, int]]:
    """Where each input's ``data`` text lies in ``body``: (offset, length), in input order.

    (0, 0) for an input without ``data``. ValueError as ``decode_request`` for a body
    that is not a valid inference request.
    """
    request = decode_request(body)
    base = _address(body)
    return [
        (0, 0) if tensor.data is msgspec.UNSET else (_address(tensor.data) - base, len(tensor.data))
        for tensor in request.inputs
    ]


def _address(buffer: memoryview | msgspec.Raw) -> int:
    # NOTE: a Raw is a view into the decoded buffer (msgspec does not copy it), so the
    #   difference of two addresses is the text's offset in the body.
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)
