"""An ``OIPSERVE_*`` variable set empty is not set: its setting keeps its default, whatever
its type (``settings._from_environment``). ``OIPSERVE_BUSY_POLL_US=`` stopped the start
('invalid value for --busy-poll-us ...: Expected `int`, got `str`'), as did every number,
boolean and choice set so; a list read as empty, and a few strings were taken as ''."""

from __future__ import annotations

import msgspec
import pytest

from oipserve.config.settings import Settings, SettingsError, load_settings

#: The command line every case starts from; one front, so that ``auto`` does not depend on
#: the machine's CPUs.
BASE = ["serve", "--model-repository", "/m", "--http-workers", "1"]

NAMES = [f.name for f in msgspec.structs.fields(Settings) if f.name != "model_repository"]


@pytest.mark.parametrize("name", NAMES)
def test_a_variable_set_empty_keeps_the_default(name: str) -> None:
    unset = load_settings(BASE, {})[1]
    empty = load_settings(BASE, {f"OIPSERVE_{name.upper()}": ""})[1]
    assert getattr(empty, name) == getattr(unset, name)


def test_every_variable_set_empty_at_once_is_the_defaults() -> None:
    environ = {f"OIPSERVE_{name.upper()}": "" for name in NAMES}
    assert load_settings(BASE, environ)[1] == load_settings(BASE, {})[1]


def test_an_empty_variable_leaves_the_flag_and_a_set_one_still_counts() -> None:
    environ = {"OIPSERVE_BUSY_POLL_US": "", "OIPSERVE_WORKER_BUSY_POLL_US": "7"}
    settings = load_settings([*BASE, "--busy-poll-us", "12"], environ)[1]
    assert (settings.busy_poll_us, settings.worker_busy_poll_us) == (12, 7)


@pytest.mark.parametrize("value", [" ", "x"])
def test_a_variable_that_is_not_empty_is_still_checked(value: str) -> None:
    with pytest.raises(SettingsError, match="OIPSERVE_BUSY_POLL_US"):
        load_settings(BASE, {"OIPSERVE_BUSY_POLL_US": value})


def test_an_empty_model_repository_is_still_missing() -> None:
    with pytest.raises(SettingsError, match="--model-repository is required"):
        load_settings(["serve"], {"OIPSERVE_MODEL_REPOSITORY": ""})
