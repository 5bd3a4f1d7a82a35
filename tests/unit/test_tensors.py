from __future__ import annotations

import numpy as np
import pytest

from oipserve.errors import InvalidInput
from oipserve.front.rest.encode import encode_response
from oipserve.request.tensors import (
    array_from_values,
    bytes_from_values,
    json_values,
    packed_from_values,
)
from oipserve.wire.datatypes import (
    bf16_to_float32,
    encode_bytes_elements,
    float32_to_bf16,
    split_bytes_elements,
)


@pytest.mark.parametrize(
    ("datatype", "values", "expected"),
    [
        ("INT32", [[1, 2], [3, 4]], np.array([1, 2, 3, 4], dtype=np.int32)),
        ("UINT64", [0, 2**64 - 1], np.array([0, 2**64 - 1], dtype=np.uint64)),
        ("INT64", [-(2**63), 2**63 - 1], np.array([-(2**63), 2**63 - 1], dtype=np.int64)),
        ("FP32", [1, 2.5], np.array([1.0, 2.5], dtype=np.float32)),
        ("BOOL", [True, False], np.array([True, False])),
        ("FP16", [0.5], np.array([0.5], dtype=np.float16)),
    ],
)
def test_good_values(datatype: str, values: list, expected: np.ndarray) -> None:
    got = array_from_values("x", datatype, values, expected.size)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("datatype", "values", "count", "fragment"),
    [
        ("INT32", ["1"], 1, "got strings"),
        ("INT32", [1.0], 1, "got numbers"),
        ("INT32", [True], 1, "got booleans"),
        ("UINT8", [256], 1, "out of range"),
        ("UINT8", [-1], 1, "out of range"),
        ("UINT64", [2**64], 1, "out of range"),
        ("INT64", [2**63], 1, "out of range"),
        ("BOOL", [1], 1, "true/false"),
        ("FP32", ["a"], 1, "got strings"),
        ("FP16", [1e9], 1, "too large"),
        ("FP16", [0, 70000], 2, "too large"),  # an integer beyond FP16 is not inf
        ("FP32", np.array([-1e39]), 1, "too large"),  # json_numbers' flat arrays
        ("INT32", [1, 2], 3, "3 elements but 'data' has 2"),
        ("INT32", [[1, 2], [3]], 3, "ragged"),
        ("INT32", 5, 1, "must be an array"),
    ],
)
def test_bad_values(datatype: str, values: object, count: int, fragment: str) -> None:
    with pytest.raises(InvalidInput, match=fragment):
        array_from_values("x", datatype, values, count)


#: Flat lists short enough for the small-list path, each beside the same values nested one
#: level deeper (which always takes the general path): both must give the same array or
#: the same error.
SMALL_CASES = [
    ("INT32", list(range(16))),
    ("INT32", [-(2**31), 2**31 - 1]),
    ("INT32", [0, 2**31]),
    ("INT32", [-(2**31) - 1, 5]),
    ("INT32", [1, True]),  # a bool among ints
    ("INT32", [1, 2.0]),  # a float among ints
    ("INT32", [1, "2"]),
    ("INT8", [-128, 127, 0]),
    ("UINT8", [255, -1]),
    ("UINT64", [0, 2**64 - 1]),
    ("UINT64", [2**64]),
    ("INT64", [-(2**63), 2**63 - 1]),
    ("INT64", [2**63, -(2**70)]),
    ("FP32", [0.5, -1.25, 3.0e38]),
    ("FP32", [3.5e38]),
    ("FP32", [1.0, 2]),  # an int among floats
    ("FP32", [1.0, False]),
    ("FP32", [float("inf")]),
    ("FP16", [0.5, 65504.0]),
    ("FP16", [70000.0]),
    ("FP16", [-70000.0, 1.0]),
    ("FP64", [1e308, -1e308, float("inf")]),
    ("BF16", [1.5, 2.0]),
    ("BOOL", [True, False]),
    ("BOOL", [1, 0]),
]


def _outcome(datatype: str, values: list, count: int) -> tuple[str, np.ndarray | str]:
    try:
        return "array", array_from_values("x", datatype, values, count)
    except InvalidInput as exc:
        return "error", str(exc)


@pytest.mark.parametrize(("datatype", "values"), SMALL_CASES)
def test_small_flat_lists_match_the_general_path(datatype: str, values: list) -> None:
    flat = _outcome(datatype, values, len(values))
    nested = _outcome(datatype, [values], len(values))
    assert flat[0] == nested[0], (flat, nested)
    if flat[0] == "error":
        assert flat[1] == nested[1]
    else:
        assert isinstance(flat[1], np.ndarray) and isinstance(nested[1], np.ndarray)
        assert flat[1].dtype == nested[1].dtype
        np.testing.assert_array_equal(flat[1], nested[1])


#: Floats numpy and struct must round alike (to nearest, ties to even), beside SMALL_CASES.
ROUNDING_CASES = [
    ("FP32", [0.1, -0.0, 1e-45, 3.4028235e38, 16777217.0]),
    ("FP16", [1.0009765625, 1.00048828125, 1.00146484375, 6e-8, -0.0, 65519.0]),
    ("FP16", [65520.0]),
    ("FP64", [0.1, 5e-324]),
    ("UINT16", [0, 65535]),
    ("INT16", [-32768, 32767, -1]),
    ("INT16", [-32768, 32767, 32768]),
    ("UINT8", [0, 255, 7]),
    ("UINT32", [4294967295]),
]


@pytest.mark.parametrize(("datatype", "values"), SMALL_CASES + ROUNDING_CASES)
def test_packed_small_lists_are_the_general_paths_bytes(datatype: str, values: list) -> None:
    """What the front places (``packed_from_values``) is the general path's array's bytes,
    or its error, whichever path packed it."""
    try:
        packed = packed_from_values("x", datatype, values, len(values))
    except InvalidInput as exc:
        assert _outcome(datatype, [values], len(values)) == ("error", str(exc))
        return
    kind, general = _outcome(datatype, [values], len(values))
    assert kind == "array", general
    assert isinstance(general, np.ndarray)
    got = packed if isinstance(packed, bytes) else packed.tobytes()
    assert got == general.tobytes()


def test_packed_small_lists_are_bytes() -> None:
    """The small path packs (no array) what it takes; the rest stays an array."""
    assert packed_from_values("x", "INT32", [1, -2], 2) == b"\x01\0\0\0\xfe\xff\xff\xff"
    assert isinstance(packed_from_values("x", "FP32", [1.5], 1), bytes)
    assert isinstance(packed_from_values("x", "FP32", [1, 2.5], 2), np.ndarray)  # mixed
    assert isinstance(packed_from_values("x", "BOOL", [True], 1), np.ndarray)


def test_bytes_values() -> None:
    assert bytes_from_values("s", [["a", "é"], ["", "b"]], 4) == [b"a", "é".encode(), b"", b"b"]
    assert bytes_from_values("s", [[["a"]], [["b"]]], 2) == [b"a", b"b"]
    assert bytes_from_values("s", [[], []], 0) == []
    with pytest.raises(InvalidInput, match="must hold strings"):
        bytes_from_values("s", [1], 1)
    with pytest.raises(InvalidInput, match="2 elements"):
        bytes_from_values("s", ["a"], 2)


@pytest.mark.parametrize(
    "values",
    [
        [["a", "b"], [""]],  # rows of different lengths
        [["a", "b"], "c"],  # a string beside a row
        ["a", ["b"], "c"],
        [[["a"], ["b"]], [["c", "d"]]],  # cousins of different lengths
        [["a"], []],
    ],
)
def test_ragged_bytes_values_are_refused_as_ragged_numbers_are(values: list[object]) -> None:
    with pytest.raises(InvalidInput, match="is ragged"):
        bytes_from_values("s", values, 3)


def test_bytes_codec_round_trip_and_tiling() -> None:
    raw = bytearray(encode_bytes_elements([b"ab", b"", b"xyz"]))
    parts = split_bytes_elements(memoryview(raw))
    assert [bytes(p) for p in parts] == [b"ab", b"", b"xyz"]
    raw[4] = ord("X")  # zero-copy: the views see changes to the buffer
    assert bytes(parts[0]) == b"Xb"
    assert split_bytes_elements(memoryview(b"")) == []
    words = np.frombuffer(encode_bytes_elements([b"abcd"]), dtype=np.uint32)
    assert [bytes(p) for p in split_bytes_elements(memoryview(words))] == [b"abcd"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x0e\x00\x00", r"prefix of element 0 is cut off \(3 of 4 bytes at offset 0\)"),
        (encode_bytes_elements([b"ab"]) + b"c", r"prefix of element 1 is cut off"),
        (encode_bytes_elements([b"abcdefghij"])[:7], r"element 0 declares 10 bytes but only 3"),
        (encode_bytes_elements([b"ok"]) + b"\xff\xff\xff\xff", r"element 1 declares 4294967295"),
    ],
)
def test_bytes_tiling_errors(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_bytes_elements(memoryview(raw))


def test_bf16_conversion_rounds_to_nearest_even() -> None:
    values = np.array([1.0, -2.5, 3.140625, 1.00390625], dtype=np.float32)
    words = float32_to_bf16(values)
    assert bf16_to_float32(words).tolist() == [1.0, -2.5, 3.140625, 1.0]


def test_json_values_encode_exactly() -> None:
    data = np.array([1, 2, 3], dtype=np.int16).tobytes()
    assert encode_response({"d": json_values("INT16", memoryview(data), 3)}) == b'{"d":[1,2,3]}'
    floats = np.array([0.1, 2.5], dtype=np.float32).tobytes()
    # float32 values print in their shortest round-tripping form, not as float64 noise
    assert encode_response({"d": json_values("FP32", memoryview(floats), 2)}) == b'{"d":[0.1,2.5]}'
    blob = encode_bytes_elements([b"hi", b"\xff"])
    assert json_values("BYTES", memoryview(blob), 2) == ["hi", "\ufffd"]
    words = float32_to_bf16(np.array([1.5], dtype=np.float32)).tobytes()
    assert encode_response({"d": json_values("BF16", memoryview(words), 1)}) == b'{"d":[1.5]}'
