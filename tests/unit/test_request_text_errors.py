"""What a client is told about a REST request's text (issue #35, row 12): unpaired
surrogate escapes, a header length past the JSON, schedule parameters past gRPC's range."""

from __future__ import annotations

import json

import pytest

from oipserve.errors import InvalidInput
from oipserve.front.rest.binary import decode_header
from oipserve.request.parameters import schedule_parameters
from oipserve.wire.json_request import decode_request, unpaired_surrogate
from oipserve.wire.json_values import DataError, decode_data


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (rb'"\ud800"', (1, "\\ud800")),
        (rb'"\udc00"', (1, "\\udc00")),  # a low half first
        (rb'"ab\uDBFFx"', (3, "\\uDBFF")),
        (rb'"\ud800\u0041"', (1, "\\ud800")),  # followed by an escape that is no low half
        (rb'"\ud800\ud800\udc00"', (1, "\\ud800")),
        (rb'"\\\ud800"', (3, "\\ud800")),  # an escaped backslash, then the escape
        (rb'"\ud83d\ude00"', None),  # a pair
        (rb'"\\ud800"', None),  # an escaped backslash and the text "ud800"
        (rb'"a\nb\u0041"', None),
    ],
)
def test_unpaired_surrogate(text: bytes, found: tuple[int, str] | None) -> None:
    assert unpaired_surrogate(text) == found


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": [], "id": "\\ud800"}',
        b'{"inputs": [], "id": "\\ud800 and more"}',
        b'{"inputs": [], "id": "x\\udfff"}',
    ],
)
def test_decode_request_names_the_surrogate(body: bytes) -> None:
    with pytest.raises(ValueError, match="unpaired UTF-16 surrogate") as refused:
        decode_request(body)
    assert "truncated" not in str(refused.value)
    with pytest.raises(ValueError, match="unpaired UTF-16 surrogate"):
        decode_request(memoryview(body))


def test_an_earlier_syntax_error_is_reported_first() -> None:
    with pytest.raises(ValueError, match="expected") as refused:
        decode_request(b'{"inputs": [] x "id": "\\ud800"}')
    assert "surrogate" not in str(refused.value)
    with pytest.raises(ValueError, match="truncated"):
        decode_request(b'{"inputs": [')  # truncated really


def test_decode_data_names_the_surrogate() -> None:
    with pytest.raises(DataError, match=r"'data' of input 'x'.*unpaired UTF-16 surrogate"):
        decode_data("x", "BYTES", b'["ok", "\\ud800"]')


def _header_and_data() -> tuple[bytes, bytes]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "a",
                    "shape": [1, 2],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 8},
                }
            ]
        }
    ).encode()
    return header, b"\x01\x00\x00\x00\x02\x00\x00\x00"


def test_header_length_of_the_whole_body() -> None:
    header, data = _header_and_data()
    body = header + data
    assert decode_header(body, len(header)).inputs[0].name == "a"
    with pytest.raises(InvalidInput) as refused:
        decode_header(body, len(body))
    message = refused.value.message
    assert f"is {len(body)} (the whole body)" in message, message
    assert f"ends before byte {len(header)}" in message, message
    assert f"(here probably {len(header)})" in message, message
    with pytest.raises(InvalidInput, match=f"is {len(header) + 3}, but"):
        decode_header(body, len(header) + 3)
    # All JSON, no binary data: the header length may be the whole body.
    whole = json.dumps({"inputs": [{"name": "a", "shape": [1], "datatype": "INT32", "data": [1]}]})
    assert decode_header(whole.encode(), len(whole)).inputs[0].name == "a"
    with pytest.raises(InvalidInput, match="malformed JSON"):
        decode_header(b'{"inputs": [', None)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (None, (0, 0)),
        ({"priority": 2**64 - 1, "timeout": 2**63 - 1}, (2**64 - 1, 2**63 - 1)),
        ({"priority": 3}, (3, 0)),
    ],
)
def test_schedule_parameters_in_range(
    parameters: dict[str, object] | None, expected: tuple[int, int]
) -> None:
    assert schedule_parameters(parameters) == expected


@pytest.mark.parametrize(
    "parameters",
    [
        {"priority": 2**64},
        {"priority": -1},
        {"priority": 1.0},
        {"priority": True},
        {"priority": "1"},
        {"timeout": 2**63},
        {"timeout": -5},
    ],
)
def test_schedule_parameters_out_of_range(parameters: dict[str, object]) -> None:
    key = next(iter(parameters))
    with pytest.raises(InvalidInput, match=f"parameter '{key}' must be"):
        schedule_parameters(parameters)
