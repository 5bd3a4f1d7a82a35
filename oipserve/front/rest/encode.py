"""The REST wire format's encoders, built once.

Requests are decoded by the Structs of ``oipserve.wire.json_request`` (shared with
the workers, which parse large bodies). Responses are encoded by orjson, which
writes numpy arrays directly (no ``tolist``) and prints float32 values in their
shortest form: for a 1 MiB FP32 output that is about 4x faster and half the size
of going through Python floats.
"""

from __future__ import annotations

from typing import Final

import msgspec
import orjson

ENCODER: Final = msgspec.json.Encoder()


def encode_response(response: dict[str, object]) -> bytes:
    """JSON of an inference response whose output ``data`` may be numpy arrays."""
    return orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
