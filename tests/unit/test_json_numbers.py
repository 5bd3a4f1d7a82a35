"""The simdjson fast path for large ``data`` texts must agree with msgspec, or step aside.

For every ``data`` text: either the fast decoder declines (None), or msgspec accepts the
text too and both give, through ``array_from_values``, the same tensor or the same error.
"""

from __future__ import annotations

import json
import random

import msgspec
import numpy as np
import pytest

from oipserve.errors import InvalidInput
from oipserve.request.tensors import array_from_values, decode_data
from oipserve.wire import json_numbers
from oipserve.wire.json_numbers import MIN_BODY, NumberArrayDecoder
from oipserve.wire.json_request import REQUEST_DECODER, decode_request
from oipserve.wire.json_values import DATA_DECODER, LARGE_DATA_DECODER

PAD = "p" * MIN_BODY


def body_of(
    data_text: str, datatype: str = "FP32", shape: list[int] | None = None, extra: str = ""
) -> bytes:
    """A request body of at least MIN_BODY bytes with ``data_text`` as its data."""
    shape_text = json.dumps(shape if shape is not None else [-1])
    return (
        '{"id":"'
        + PAD
        + '","inputs":[{"name":"x","shape":'
        + shape_text
        + ',"datatype":"'
        + datatype
        + '","data":'
        + data_text
        + extra
        + "}]}"
    ).encode()


def fast(body: bytes) -> np.ndarray | None:
    """The fast path's reading of the first input's ``data`` (None: it declined)."""
    tensor = REQUEST_DECODER.decode(body).inputs[0]
    return LARGE_DATA_DECODER.decode(memoryview(tensor.data), tensor.datatype)


def converted(datatype: str, shape: list[int], data: object) -> object:
    """The tensor after the strict conversion, or the error message."""
    count = int(np.prod(shape)) if -1 not in shape else None
    try:
        size = count if count is not None else np.asarray(data).size
        return array_from_values("x", datatype, data, size)
    except (InvalidInput, ValueError) as exc:
        return str(exc)


def assert_agrees(body: bytes) -> np.ndarray | None:
    try:
        tensor = REQUEST_DECODER.decode(body).inputs[0]
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    text = memoryview(tensor.data)
    got_array = LARGE_DATA_DECODER.decode(text, tensor.datatype)
    if got_array is None:
        return None
    slow = DATA_DECODER.decode(text)  # must not raise where the fast path accepted
    got = converted(tensor.datatype, tensor.shape, got_array)
    want = converted(tensor.datatype, tensor.shape, slow)
    if isinstance(want, str):
        assert got == want
    else:
        assert isinstance(got, np.ndarray) and isinstance(want, np.ndarray)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    return got_array


@pytest.mark.parametrize(
    ("data", "datatype", "shape"),
    [
        ("[1.5, -2, 3e2, -0.0, 1E-3]", "FP32", [5]),
        ("[[1, 2, 3], [4, 5, 6]]", "FP64", [2, 3]),
        ("[[[1], [2]], [[3], [4]]]", "FP16", [2, 2, 1]),
        ("[0.1, 0.2, 0.3]", "BF16", [3]),
        ("[1, -2, 127]", "INT8", [3]),
        ("[9223372036854775807, -9223372036854775808]", "INT64", [2]),
        ("[0, 18446744073709551615]", "UINT64", [2]),
        ("[1, 2, 65535]", "UINT16", [3]),
        ("[]", "FP32", [0]),
        ("[[]]", "FP32", [1, 0]),
        ("[3.4028234663852886e38]", "FP32", [1]),
    ],
)
def test_fast_path_takes_regular_number_arrays(data: str, datatype: str, shape: list[int]) -> None:
    array = assert_agrees(body_of(data, datatype, shape))
    assert isinstance(array, np.ndarray), "the fast path should have decoded this body"


@pytest.mark.parametrize(
    ("data", "datatype"),
    [
        ("[[1], 2]", "FP32"),  # flattens to the right count, but ragged
        ("[1, [2]]", "FP32"),
        ("[[1, 2], [3]]", "FP32"),
        ("[[1, 2, 3], [4, 5, 6, 7, 8, 9], []]", "FP32"),  # right counts, wrong rows
        ("[[1, 2], 3, 4]", "FP32"),
        ("[true, false]", "BOOL"),
        ("[1, true]", "FP32"),
        ('["a", "b"]', "BYTES"),
        ('["1.5"]', "FP32"),
        ("[1.5, 2]", "INT32"),
        ("[1, 18446744073709551615]", "INT64"),
        ("[-1]", "UINT64"),
        ("[1e400]", "FP32"),
        ("[1, null]", "FP32"),
        ("[1, {}]", "FP32"),
        ("7", "FP32"),
        ("null", "FP32"),
        ("[1, 2]", "FP99"),
    ],
)
def test_fast_path_declines_what_only_msgspec_can_judge(data: str, datatype: str) -> None:
    assert fast(body_of(data, datatype)) is None


def test_the_header_keeps_data_as_text_until_it_is_asked_for() -> None:
    body = body_of("[[1, 2], [3, 4]]", "FP32", [2, 2], extra=',"parameters":{"[":"]"}')
    tensor = decode_request(body).inputs[0]
    assert isinstance(tensor.data, msgspec.Raw)
    assert bytes(memoryview(tensor.data)) == b"[[1, 2], [3, 4]]"
    assert decode_data("x", "FP32", tensor.data) == [[1, 2], [3, 4]]


def test_large_data_goes_through_the_fast_path() -> None:
    text = "[" + ",".join(["1.5"] * MIN_BODY) + "]"
    tensor = decode_request(body_of(text, "FP32", [MIN_BODY])).inputs[0]
    values = decode_data("x", "FP32", tensor.data)
    assert isinstance(values, np.ndarray) and values.size == MIN_BODY


def test_malformed_or_non_utf8_data_names_the_input() -> None:
    body = body_of('["a", ["b", "c@"]]', "BYTES", [3]).replace(b"@", b"\xff")
    tensor = decode_request(body).inputs[0]
    with pytest.raises(InvalidInput, match="element 2 of input 'x' is not valid UTF-8"):
        decode_data("x", "BYTES", tensor.data)


def test_fast_path_agrees_on_random_requests() -> None:
    rng = random.Random(7)
    datatypes = [
        "FP32",
        "FP64",
        "FP16",
        "BF16",
        "INT8",
        "INT32",
        "INT64",
        "UINT8",
        "UINT64",
        "BOOL",
        "BYTES",
    ]
    values = [
        "0",
        "-1",
        "1.5",
        "255",
        "256",
        "-129",
        "1e39",
        "70000",
        "true",
        '"s"',
        "null",
        "9223372036854775808",
        "[1]",
        "[]",
        "-0.0",
        "1e-50",
    ]
    fast_hits = 0
    for _ in range(400):
        rows, cols = rng.randint(0, 3), rng.randint(0, 4)
        nested = rng.random() < 0.5
        if rng.random() < 0.7:
            cells = [rng.choice(values[:8]) for _ in range(rows * cols)]
        else:
            cells = [rng.choice(values) for _ in range(rows * cols)]
        if nested:
            text = (
                "["
                + ",".join(
                    "[" + ",".join(cells[r * cols : (r + 1) * cols]) + "]" for r in range(rows)
                )
                + "]"
            )
            if rng.random() < 0.2 and rows:
                text = text.replace("]", ",1]", 1)  # one ragged row
        else:
            text = "[" + ",".join(cells) + "]"
        body = body_of(text, rng.choice(datatypes), [rows, cols] if nested else [rows * cols])
        fast_hits += assert_agrees(body) is not None
    assert fast_hits > 50, "the random requests should exercise the fast path"


def test_a_large_fp32_tensor_round_trips_exactly() -> None:
    values = np.random.default_rng(1).standard_normal(70_000).astype(np.float32)
    body = body_of("[" + ",".join(map(repr, values.tolist())) + "]", "FP32", [70_000])
    array = assert_agrees(body)
    assert array is not None
    got = array_from_values("x", "FP32", array, 70_000)
    assert got.dtype == np.float32 and np.array_equal(got, values)


def test_parser_is_reusable_after_declining() -> None:
    assert fast(body_of("[[1], 2]")) is None
    assert fast(body_of("[1, 2]", "BYTES")) is None
    assert fast(body_of("[1, 2]")) is not None


def test_parser_memory_is_let_go_after_a_huge_body(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = NumberArrayDecoder()
    kept = decoder._parser
    decoder.decode(b"[1, 2]", "FP32")
    assert decoder._parser is kept
    monkeypatch.setattr(json_numbers, "RETAIN_MAX", 4)
    assert decoder.decode(b"[1, 2]", "FP32") is not None
    assert decoder._parser is not kept


def test_a_proxy_left_alive_costs_one_body_not_the_fast_path() -> None:
    decoder = NumberArrayDecoder()
    leftover = decoder._parser.parse(b"[1]")  # a proxy of an earlier document
    assert decoder.decode(b"[1, 2]", "FP32") is None
    assert decoder.decode(b"[1, 2]", "FP32") is not None
    del leftover


def test_too_many_nested_arrays_go_to_msgspec() -> None:
    rows = "[" + ",".join(["[1]"] * (json_numbers.MAX_NESTED_ARRAYS + 1)) + "]"
    assert fast(body_of(rows, "FP32", [-1, 1])) is None
    rows = "[" + ",".join(["[1]"] * (json_numbers.MAX_NESTED_ARRAYS - 1)) + "]"
    assert assert_agrees(body_of(rows, "FP32", [-1, 1])) is not None
