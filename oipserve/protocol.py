"""The REST wire format of the OIP: typed msgspec Structs and codecs built once.

Requests are decoded by msgspec into typed Structs. Responses are encoded by
orjson, which writes numpy arrays directly (no ``tolist``) and prints float32
values in their shortest form: for a 1 MiB FP32 output that is about 4x faster
and half the size of going through Python floats.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from oipserve.fast_json import MIN_BODY, NumberArrayDecoder

Parameters = dict[str, str | int | float | bool]


class RequestInput(msgspec.Struct, frozen=True):
    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: Any = msgspec.UNSET


class RequestOutput(msgspec.Struct, frozen=True):
    name: str
    parameters: Parameters | None = None


class InferRequest(msgspec.Struct, frozen=True):
    inputs: list[RequestInput]
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[RequestOutput] | None = None


REQUEST_DECODER = msgspec.json.Decoder(InferRequest)
LARGE_REQUEST_DECODER = NumberArrayDecoder(InferRequest)
ENCODER = msgspec.json.Encoder()


def decode_request(body: bytes | memoryview) -> InferRequest:
    """Decode an inference request header; any problem is a ``ValueError`` with the path.

    Large bodies first try ``LARGE_REQUEST_DECODER`` (number arrays straight into
    numpy); whatever it declines is decoded here, errors included.
    """
    if len(body) >= MIN_BODY:
        request = LARGE_REQUEST_DECODER.decode(body)
        if request is not None:
            return request
    try:
        return REQUEST_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid inference request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise ValueError("malformed JSON: nested too deeply") from None


def encode_response(response: dict[str, object]) -> bytes:
    """JSON of an inference response whose output ``data`` may be numpy arrays."""
    return orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
