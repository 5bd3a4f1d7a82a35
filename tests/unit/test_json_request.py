"""``data_spans``: where each input's ``data`` text lies in a body, as a worker reports it."""

from __future__ import annotations

import json

import pytest

from oipserve.wire.json_request import data_spans, decode_request


def _texts(body: bytes) -> list[bytes | None]:
    spans = data_spans(memoryview(body))
    return [body[start : start + size] if size else None for start, size in spans]


def test_each_input_in_order_with_or_without_data() -> None:
    body = (
        '{"id": "é✓", "inputs": ['
        '{"name": "ä", "shape": [2], "datatype": "FP32", "data": [1.5, 2]},'
        '{"name": "r", "shape": [1], "datatype": "INT32",'
        ' "parameters": {"shared_memory_region": "x"}},'
        '{"name": "n", "shape": [2, 1], "datatype": "INT8", "data" :\n [ [1] ,[2] ] }'
        "]}"
    ).encode()
    assert _texts(body) == [b"[1.5, 2]", None, b"[ [1] ,[2] ]"]


def test_a_view_into_a_larger_buffer() -> None:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"]}]})
    buffer = bytearray(b"junk" + body.encode() + b"junk")
    ((start, size),) = data_spans(memoryview(buffer)[4:-4])
    assert bytes(buffer[4 + start : 4 + start + size]) == b'["a"]'


@pytest.mark.parametrize("body", [b'{"inputs": [', b'{"inputs": 3}', b"[]", b'{"inputs": [{}]}'])
def test_a_bad_body_is_the_decoders_error(body: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        decode_request(body)
    with pytest.raises(ValueError) as got:
        data_spans(memoryview(body))
    assert str(got.value) == str(expected.value)
