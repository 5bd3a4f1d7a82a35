"""A load's ``config`` and ``file:`` parameters: parsing, path safety, the upload directory."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path, PurePosixPath

import pytest

from oipserve.errors import InvalidInput
from oipserve.management.load_override import check_model_name, parse_load_parameters
from oipserve.models.config.parse import ModelConfigError, parse_model_config_json
from oipserve.models.uploads import UploadArea, UploadError, check_upload_path


def test_config_json_follows_protobufs_mapping() -> None:
    assert parse_model_config_json('{"max_batch_size": "16"}').max_batch_size == 16
    assert parse_model_config_json('{"maxBatchSize": 4}').max_batch_size == 4
    config = parse_model_config_json(
        '{"input": [{"name": "X", "data_type": "TYPE_FP32", "dims": ["-1", 3]}]}'
    )
    assert config.inputs[0].dims == (-1, 3) and config.inputs[0].data_type == "FP32"
    assert config.document == {"input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1, 3]}]}
    for bad in ("{", "[1]", '{"max_batch_size": "x"}', '{"nope": 1}', "[" * 10_000):
        with pytest.raises(ModelConfigError):
            parse_model_config_json(bad)
    for not_an_object in ("[]", '""', '"abc"', " 1", "null"):
        # protobuf's parser took [] and "" for an empty configuration (found by fuzzing)
        with pytest.raises(ModelConfigError, match="^the configuration must be a JSON object$"):
            parse_model_config_json(not_an_object)
    assert parse_model_config_json(' \n\t{"max_batch_size": 2}').max_batch_size == 2


@pytest.mark.parametrize(
    "path", ["", "/abs", "../x", "1/../../x", "1//m", "1/./m", "a\\b", "a\0b", "x" * 256]
)
def test_unsafe_upload_paths_are_refused(path: str) -> None:
    with pytest.raises(UploadError):
        check_upload_path(path)


def test_safe_upload_paths() -> None:
    assert check_upload_path("1/model.onnx") == PurePosixPath("1", "model.onnx")
    assert check_upload_path("1/a/b.bin").parts == ("1", "a", "b.bin")


def test_parameters() -> None:
    data = base64.b64encode(b"onnx").decode()
    override = parse_load_parameters("m", {"config": "{}", "file:1/model.onnx": data}, True, 9)
    # NOTE: base64 text is decoded by the writer's thread (test_upload_area_decodes_base64).
    assert override.files == {PurePosixPath("1/model.onnx"): data}
    assert override.config is not None
    grpc = parse_load_parameters("m", {"config": "{}", "file:1/model.onnx": b"onnx"}, False, 9)
    assert grpc.files == {PurePosixPath("1/model.onnx"): b"onnx"}
    assert parse_load_parameters("m", {}, True, 9).config is None
    for parameters in (
        {"file:1/model.onnx": data},  # no config
        {"config": 1},
        {"config": "{}", "file:1/model.onnx": b"onnx"},  # bytes over HTTP
        {"config": "{}", "file:1/model.onnx": data.encode()},
        {"other": "x"},
    ):
        with pytest.raises(InvalidInput, match="^failed to load 'm': "):
            parse_load_parameters("m", parameters, True, 9)
    with pytest.raises(InvalidInput, match="bytes_param"):
        parse_load_parameters("m", {"config": "{}", "file:1/model.onnx": data}, False, 9)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\\b", "n" * 256])
def test_model_names_that_cannot_be_directories(name: str) -> None:
    with pytest.raises(InvalidInput, match="^failed to load '") as info:
        check_model_name(name)
    if "\\" in name:  # the reason names what it refuses (it said "('/', '..')")
        assert "must not contain '/', '\\' or NUL" in info.value.message


def test_upload_area_writes_outside_and_cleans_up(tmp_path: Path) -> None:
    stale = tmp_path / "oipserve-999999999-uploads-old"
    stale.mkdir()  # left by a server that no longer runs
    area = UploadArea(tmp_path)
    files = {PurePosixPath("1/model.onnx"): b"a", PurePosixPath("1/x/y.bin"): b"b"}
    place = asyncio.run(area.write("m", files))
    assert (place / "m" / "1" / "x" / "y.bin").read_bytes() == b"b"
    assert area.root is not None and area.root.name.startswith(f"oipserve-{os.getpid()}-uploads-")
    assert oct(area.root.stat().st_mode & 0o777) == "0o700"
    assert not stale.exists()
    second = asyncio.run(area.write("m", files))
    area.remove(place)
    assert not place.exists() and second.exists()
    area.close()
    assert not any(tmp_path.iterdir())
