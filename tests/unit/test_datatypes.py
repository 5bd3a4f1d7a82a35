"""The datatype table (oipserve.wire.datatypes) against the schemas it stands for."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from tritonclient.grpc import model_config_pb2, service_pb2

from oipserve.wire.datatypes import (
    BY_ONNX,
    BY_TRITON,
    DATATYPES,
    ELEMENT_SIZES,
    bytes_elements_from,
    encode_bytes_elements,
    split_bytes_elements,
    write_bytes_elements,
)

OIP_NAMES = {
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
}  # fmt: skip


def test_one_row_per_oip_datatype() -> None:
    assert set(DATATYPES) == OIP_NAMES
    assert len(BY_ONNX) == len(BY_TRITON) == len(DATATYPES)
    assert "BYTES" not in ELEMENT_SIZES


def test_triton_names_are_triton_config_enums() -> None:
    names = set(model_config_pb2.DataType.keys())
    for row in DATATYPES.values():
        assert row.triton in names, row


def test_onnx_types_match_onnx_element_types() -> None:
    onnx_names = {
        "tensor(float)": onnx.TensorProto.FLOAT,
        "tensor(double)": onnx.TensorProto.DOUBLE,
        "tensor(string)": onnx.TensorProto.STRING,
    }
    for row in DATATYPES.values():
        elem = onnx_names.get(row.onnx)
        if elem is None:
            elem = onnx.TensorProto.DataType.Value(row.onnx[7:-1].upper())
        if row.name in ("BF16", "BYTES"):
            continue  # no numpy dtype of their own
        assert onnx.helper.tensor_dtype_to_np_dtype(elem) == row.numpy, row


def test_grpc_contents_fields_exist_and_fit() -> None:
    fields = service_pb2.InferTensorContents.DESCRIPTOR.fields_by_name
    for row in DATATYPES.values():
        if row.grpc_contents is None:
            assert row.name in ("FP16", "BF16")  # raw_input_contents only, as in Triton
            continue
        assert row.grpc_contents in fields, row


@pytest.mark.parametrize("elements", [[], [b""], [b"a", b"", b"xyz" * 100], [bytes(range(256))]])
def test_bytes_elements_round_trip(elements: list[bytes]) -> None:
    blob = encode_bytes_elements(elements)
    assert [bytes(v) for v in split_bytes_elements(memoryview(blob))] == elements
    target = bytearray(len(blob) + 8)
    end = write_bytes_elements(memoryview(target), 8, elements)
    assert end == len(target) and target[8:] == blob


def test_split_names_the_broken_element() -> None:
    with pytest.raises(ValueError, match="element 1 declares 9 bytes"):
        split_bytes_elements(memoryview(encode_bytes_elements([b"ok"]) + b"\x09\0\0\0abc"))
    with pytest.raises(ValueError, match="cut off"):
        split_bytes_elements(memoryview(b"\x01\0"))


def test_image_elements_are_numpy_names() -> None:
    for row in DATATYPES.values():
        if row.image:
            assert np.dtype(row.element).name == row.element


def test_bytes_elements_walked_in_steps_are_the_whole_split() -> None:
    elements = [bytes([i % 251]) * (i % 7) for i in range(1000)]
    data = memoryview(encode_bytes_elements(elements))
    walked: list[bytes] = []
    pos = 0
    while pos < len(data):
        step, pos = bytes_elements_from(data, pos, 64)
        assert len(step) <= 64
        walked += [bytes(e) for e in step]
    assert walked == [bytes(e) for e in split_bytes_elements(data)] == elements
