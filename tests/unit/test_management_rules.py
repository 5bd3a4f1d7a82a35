"""AMD endpoint naming, typed parameter matching, start-up model selection, settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from oipserve.config.settings import SettingsError, load_settings
from oipserve.errors import InvalidInput
from oipserve.management import EndpointNames, param_key, startup_models
from oipserve.models.repository import RepositoryError


def test_param_key_is_typed_and_ignores_share() -> None:
    assert param_key("w", {"a": 1}) == param_key("w", {"a": 1, "share": False})
    assert param_key("w", {"a": 1}) != param_key("w", {"a": 1.0})
    assert param_key("w", {"a": 1}) != param_key("w", {"a": True})
    assert param_key("w", {"a": "1"}) != param_key("w", {"a": 1})
    # Negative integers are doubles, as amdinfer converts them.
    assert param_key("w", {"a": -1}) == param_key("w", {"a": -1.0})
    assert param_key("w", {"a": 1, "b": 2}) == param_key("w", {"b": 2, "a": 1})
    assert param_key("w", {}) != param_key("w", {"a": 1})
    assert param_key("w", {}) != param_key("v", {})


@pytest.mark.parametrize("value", [None, [1], {"x": 1}])
def test_param_key_rejects_non_scalars(value: object) -> None:
    with pytest.raises(InvalidInput, match="parameter 'a'"):
        param_key("w", {"a": value})


def test_param_key_rejects_worker() -> None:
    with pytest.raises(InvalidInput, match="worker"):
        param_key("w", {"worker": "x"})


def test_names_bare_then_suffixed_and_reset_when_all_gone() -> None:
    names = EndpointNames()
    a, b, c = (param_key("w", {"p": i}) for i in range(3))
    assert names.next_name("w") == "w"
    assert names.add("w", a) == "w"
    assert names.add("w", b) == "w-0"
    assert names.find("w", a) == "w" and names.find("w", b) == "w-0"
    names.remove("w", "w")
    assert names.find("w", a) is None
    # w-0 still exists: the counter goes on, no bare name.
    assert names.add("w", a) == "w-1"
    assert names.add("w", c) == "w-2"
    for name in ("w-0", "w-1", "w-2"):
        names.remove("w", name)
    assert names.add("w", c) == "w"
    assert names.add("other", c) == "other"


def test_startup_models(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    assert startup_models("none", (), tmp_path) == ["a", "b", "c"]
    assert startup_models("explicit", (), tmp_path) == []
    assert startup_models("explicit", ("c", "a", "c"), tmp_path) == ["c", "a"]
    assert startup_models("explicit", ("*",), tmp_path) == ["a", "b", "c"]
    with pytest.raises(RepositoryError, match="zzz"):
        startup_models("explicit", ("zzz",), tmp_path)


def test_model_control_settings() -> None:
    base = ["serve", "--model-repository", "r"]
    _, settings = load_settings(base, {})
    assert settings.model_control_mode == "none" and settings.load_model == ()
    _, settings = load_settings(
        [*base, "--model-control-mode", "explicit", "--load-model", "a,b", "--load-model", "c"],
        {},
    )
    assert settings.model_control_mode == "explicit"
    assert settings.load_model == ("a", "b", "c")
    explicit = {"OIPSERVE_MODEL_CONTROL_MODE": "explicit"}
    _, settings = load_settings(base, {**explicit, "OIPSERVE_LOAD_MODEL": "x, y"})
    assert settings.load_model == ("x", "y")
    with pytest.raises(SettingsError, match="only applies with --model-control-mode explicit"):
        load_settings(base, {"OIPSERVE_LOAD_MODEL": "x, y"})
    with pytest.raises(SettingsError, match="poll .* is not implemented"):
        load_settings([*base, "--model-control-mode", "poll"], {})
