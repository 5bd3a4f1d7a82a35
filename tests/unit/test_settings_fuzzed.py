"""Settings a fuzzed command line found unchecked, each now a one-line error naming its flag:
a duration that is no finite time (``--infer-timeout inf`` passed the checks, and a front
that armed a timer with it died at start: a traceback, ``HTTP front 1 did not start``), and
a ready-file path that is no regular file."""

from __future__ import annotations

import pathlib

import msgspec
import pytest

from oipserve.config.settings import MAX_SECONDS, Settings, SettingsError, load_settings

#: Every float setting: each is a number of seconds.
DURATIONS = [
    f.name
    for f in msgspec.structs.fields(Settings)
    if f.type is not None and "float" in str(f.type)
]


def test_every_float_setting_is_a_bounded_duration() -> None:
    assert len(DURATIONS) >= 8, DURATIONS
    for name in DURATIONS:
        settings = load_settings(["serve", "--model-repository", "."], {})[1]
        assert getattr(settings, name) <= MAX_SECONDS


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400", str(MAX_SECONDS * 2)])
@pytest.mark.parametrize("name", DURATIONS)
def test_a_duration_that_is_no_finite_time_names_its_flag(name: str, value: str) -> None:
    flag = "--" + name.replace("_", "-")
    with pytest.raises(SettingsError, match=f"invalid value for {flag} "):
        load_settings(["serve", "--model-repository", ".", f"{flag}={value}"], {})
    with pytest.raises(SettingsError, match=f"OIPSERVE_{name.upper()}"):
        load_settings(["serve", "--model-repository", "."], {f"OIPSERVE_{name.upper()}": value})


@pytest.mark.parametrize("target", ["directory", "/dev/null"])
def test_a_ready_file_path_that_is_no_regular_file_is_refused(
    tmp_path: pathlib.Path, target: str
) -> None:
    """The ready file is replaced when ready and removed at shutdown: a directory failed at
    shutdown with a traceback (exit 1), and a device node was replaced, then deleted."""
    path = str(tmp_path) if target == "directory" else target
    with pytest.raises(SettingsError, match="is not a regular file"):
        load_settings(["serve", "--model-repository", ".", "--ready-file", path], {})
    kept = load_settings(
        ["serve", "--model-repository", ".", "--ready-file", str(tmp_path / "r")], {}
    )
    assert kept[1].ready_file == str(tmp_path / "r")


@pytest.mark.parametrize("given", [["--model-repository", ""], ["--model-repository", "  "]])
def test_an_empty_model_repository_is_refused_not_the_working_directory(given: list[str]) -> None:
    with pytest.raises(SettingsError, match="--model-repository is required"):
        load_settings(["serve", *given], {})
    with pytest.raises(SettingsError, match="--model-repository is required"):
        load_settings(["serve"], {"OIPSERVE_MODEL_REPOSITORY": ""})
