"""The JSON inference request of the REST front: typed msgspec Structs, decoded once.

Part of the wire contract because a large body is parsed by a worker
(``oipserve.json_offload``): the worker checks the whole body with the same decoder
the front uses and answers where each input's ``data`` text lies (``data_spans``),
so the front then decodes only the small rest.
"""

from __future__ import annotations

import msgspec
import numpy as np

__all__ = ["InferRequest", "RequestInput", "RequestOutput", "data_spans", "decode_request"]

Parameters = dict[str, str | int | float | bool]


class RequestInput(msgspec.Struct, frozen=True):
    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    #: The JSON text of ``data``, decoded once the shape is checked (``json_values``).
    data: msgspec.Raw = msgspec.UNSET


class RequestOutput(msgspec.Struct, frozen=True):
    name: str
    parameters: Parameters | None = None


class InferRequest(msgspec.Struct, frozen=True):
    inputs: list[RequestInput]
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[RequestOutput] | None = None


REQUEST_DECODER = msgspec.json.Decoder(InferRequest)


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
        raise ValueError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise ValueError("malformed JSON: nested too deeply") from None


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
