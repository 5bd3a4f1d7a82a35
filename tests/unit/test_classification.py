"""The classification extension's pure parts: top-k order, Triton's strings, label files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oipserve.errors import InvalidInput
from oipserve.models.labels import read_labels
from oipserve.models.registry import ModelVersion
from oipserve.request.classification import (
    MAX_CLASS_STRINGS,
    class_strings,
    classified_outputs,
    top_k,
)
from oipserve.request.inference import InferResult, OutputTensor


def test_top_k_is_highest_first_and_ties_keep_the_lower_index() -> None:
    row = np.array([1.0, 3.0, 3.0, 0.5, 2.0], dtype=np.float32)
    assert top_k(row, 3).tolist() == [1, 2, 4]
    assert top_k(row, 10).tolist() == [1, 2, 4, 0, 3]


def test_top_k_ranks_nan_below_every_number() -> None:
    """numpy sorts NaN last, so a highest-first order put it first (found by fuzzing)."""
    row = np.array([np.nan, 1.0, 3.0, np.nan, 3.0, -np.inf], dtype=np.float32)
    assert top_k(row, 3).tolist() == [2, 4, 1]
    assert top_k(row, 6).tolist() == [2, 4, 1, 5, 0, 3]


def test_top_k_of_unsigned_values() -> None:
    row = np.array([0, 255, 7, 255], dtype=np.uint8)
    assert top_k(row, 4).tolist() == [1, 3, 2, 0]


def test_floats_print_like_cpp_to_string() -> None:
    rows = np.array([[1.1, 3.3, 0.5, 2.4]], dtype=np.float32)
    assert class_strings(rows, 2, "FP32") == [["3.300000:1", "2.400000:3"]]
    rows64 = np.array([[-1e-7, 12345.678]], dtype=np.float64)
    assert class_strings(rows64, 2, "FP64") == [["12345.678000:1", "-0.000000:0"]]


def test_integers_print_plain() -> None:
    rows = np.array([[3, -4, 10], [7, 8, 9]], dtype=np.int32)
    assert class_strings(rows, 2, "INT32") == [["10:2", "3:0"], ["9:2", "8:1"]]
    big = np.array([[2**64 - 1, 0]], dtype=np.uint64)
    assert class_strings(big, 1, "UINT64") == [["18446744073709551615:0"]]


def test_labels_are_appended_where_the_index_has_one() -> None:
    rows = np.array([[0.25, 0.5, 0.75]], dtype=np.float32)
    strings = class_strings(rows, 3, "FP32", ("cat", ""))
    assert strings == [["0.750000:2", "0.500000:1", "0.250000:0:cat"]]


def test_read_labels_one_per_line(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_bytes("cat\r\ndog\n\nbird é\n".encode())
    assert read_labels(tmp_path, "labels.txt", "here") == ("cat", "dog", "", "bird é")


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/hostname", ".", "sub/../../x"])
def test_read_labels_refuses_paths_outside_the_model_directory(tmp_path: Path, name: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "outside.txt").write_text("a\n")
    with pytest.raises(ValueError, match="must name a file inside"):
        read_labels(model, name, "output 'OUT'")


def test_read_labels_refuses_a_link_out_of_the_model_directory(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "outside.txt").write_text("a\n")
    (model / "labels.txt").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(ValueError, match="must name a file inside"):
        read_labels(model, "labels.txt", "output 'OUT'")


def test_read_labels_refuses_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read label_filename 'none.txt'"):
        read_labels(tmp_path, "none.txt", "output 'OUT'")
    (tmp_path / "bad.txt").write_bytes(b"\xff\n")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        read_labels(tmp_path, "bad.txt", "output 'OUT'")


def test_too_many_class_strings_in_one_request_are_refused() -> None:
    """rows x k' past MAX_CLASS_STRINGS: 400 naming the bound, before any string is made."""
    rows, per_row = 32, MAX_CLASS_STRINGS // 16
    data = memoryview(np.zeros(rows * per_row, np.float32).tobytes())
    tensor = OutputTensor("OUT", "FP32", [rows, per_row], data)
    model = ModelVersion("classes", "1", "", None)
    model.max_batch_size = rows
    result = InferResult(model, [tensor], lambda: None)
    with pytest.raises(InvalidInput, match=f"at most {MAX_CLASS_STRINGS} may be returned"):
        classified_outputs(result, {"OUT": per_row})
    (small,) = classified_outputs(result, {"OUT": 1})
    assert (small.datatype, small.shape) == ("BYTES", [rows, 1])
