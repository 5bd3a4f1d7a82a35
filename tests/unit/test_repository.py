"""Reading a model repository: version directories, version_policy, config warnings."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from oipserve.models.repository import read_model, version_number


def _model(root: Path, versions: list[str], config: str | None = None) -> Path:
    for version in versions:
        (root / "m" / version).mkdir(parents=True)
        (root / "m" / version / "model.onnx").write_bytes(b"not read here")
    if config is not None:
        (root / "m" / "config.pbtxt").write_text(config, encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("entry", "number"),
    [
        ("1", 1),
        ("0", 0),
        ("10", 10),
        ("007", None),
        ("01", None),
        ("²", None),
        ("١", None),
        ("1a", None),
        ("", None),
        ("-1", None),
    ],
)
def test_version_number_takes_ascii_digits_only(entry: str, number: int | None) -> None:
    assert version_number(entry) == number


def test_non_ascii_digit_directory_is_skipped(tmp_path: Path) -> None:
    source = read_model(_model(tmp_path, ["²", "3"]), "m")
    assert source.error is None and source.versions == {"3": str(tmp_path / "m/3/model.onnx")}


def test_a_version_directory_with_a_leading_zero_is_ignored_as_triton_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Triton ignores it, with a warning: ``1`` and ``01`` serve version 1, ``1`` and ``02``
    version 1 (``02`` was version 2 here, another model than Triton serves), ``007`` alone
    no version (Triton's QA configs, compared)."""
    policy = "version_policy: { all { } }\n"
    source = read_model(_model(tmp_path, ["01", "1"], policy), "m")
    assert source.error is None and list(source.versions) == ["1"]
    assert "ignore version directory '01' which contains leading zeros" in caplog.text
    other = read_model(_model(tmp_path / "other", ["1", "02"]), "m")
    assert list(other.versions) == ["1"]
    alone = read_model(_model(tmp_path / "alone", ["007"]), "m")
    assert alone.error is not None and not alone.versions


def test_default_policy_serves_the_latest_version(tmp_path: Path) -> None:
    source = read_model(_model(tmp_path, ["1", "10", "9"]), "m")
    assert list(source.versions) == ["10"]


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("version_policy { all { } }", ["1", "9", "10"]),
        ("version_policy { latest { num_versions: 2 } }", ["9", "10"]),
        ("version_policy { specific { versions: [ 1, 10 ] } }", ["1", "10"]),
    ],
)
def test_version_policy_selects(tmp_path: Path, policy: str, served: list[str]) -> None:
    source = read_model(_model(tmp_path, ["1", "10", "9"], policy), "m")
    assert list(source.versions) == served


def test_specific_versions_missing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _model(tmp_path, ["1", "2"], "version_policy { specific { versions: [ 2, 5 ] } }")
    with caplog.at_level(logging.WARNING, "oipserve.repository"):
        assert list(read_model(root, "m").versions) == ["2"]
    assert "asks for versions [5]" in caplog.text
    (root / "m" / "config.pbtxt").write_text("version_policy { specific { versions: [ 5 ] } }")
    source = read_model(root, "m")
    assert source.versions == {} and "selects none of the versions found ([1, 2])" in str(
        source.error
    )


def test_ignored_fields_are_logged_as_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _model(
        tmp_path, ["1"], 'model_warmup { name: "w" }\nmetric_tags { key: "a" value: "b" }\n'
    )
    with caplog.at_level(logging.WARNING, "oipserve.repository"):
        assert read_model(root, "m").error is None
    assert (
        "model 'm': config.pbtxt field 'model_warmup' is not supported by oipserve "
        "and is ignored" in caplog.text
    )
    assert "field 'metric_tags'" in caplog.text


def test_refused_config_makes_the_model_unavailable(tmp_path: Path) -> None:
    source = read_model(
        _model(tmp_path, ["1"], "sequence_batching { iterative_sequence: true }"), "m"
    )
    assert source.error is not None
    assert "sequence_batching.iterative_sequence: not supported by oipserve" in source.error
