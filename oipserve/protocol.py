"""The REST wire format of the OIP: typed msgspec Structs and codecs built once."""

from __future__ import annotations

from typing import Any

import msgspec

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


class ResponseOutput(msgspec.Struct, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, int] | None = None
    data: Any = msgspec.UNSET


class InferResponse(msgspec.Struct, omit_defaults=True):
    model_name: str
    model_version: str
    outputs: list[ResponseOutput]
    id: str | msgspec.UnsetType = msgspec.UNSET


REQUEST_DECODER = msgspec.json.Decoder(InferRequest)
ENCODER = msgspec.json.Encoder()


def decode_request(body: bytes | memoryview) -> InferRequest:
    """Decode an inference request header; any problem is a ``ValueError`` with the path."""
    try:
        return REQUEST_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid inference request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise ValueError("malformed JSON: nested too deeply") from None
