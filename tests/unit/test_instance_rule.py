"""``--instances-per-device auto`` (issue #40): worker processes per device from the CPUs this
process may use (``hardware.cpus.instances_for``), chosen when each device's workers start."""

from __future__ import annotations

import pytest

from hardware.cpus import (
    AUTO_MAX_CPU_INSTANCES,
    cpu_instances_for,
    fronts_for,
    instances_for,
)
from oipserve.config.settings import SettingsError, load_settings


@pytest.mark.parametrize(
    ("cpus", "instances"),
    [(1, 1), (2, 1), (4, 1), (8, 1), (11, 1), (12, 2), (16, 2), (64, 2), (512, 2)],
)  # fmt: skip
def test_cpu_instances_for_usable_cpus(cpus: int, instances: int) -> None:
    assert cpu_instances_for(cpus) == instances


def test_a_second_cpu_instance_comes_with_the_third_front_and_never_a_third() -> None:
    """One worker runs one request at a time: it keeps up with two fronts, not three; the
    cap holds the models' memory (every instance holds every model) to twice one's."""
    for cpus in range(1, 513):
        instances = cpu_instances_for(cpus)
        assert 1 <= instances <= min(cpus, AUTO_MAX_CPU_INSTANCES)
        assert (instances == 2) == (fronts_for(cpus) >= 3), cpus


@pytest.mark.parametrize("cpus", [1, 2, 16, 64])
def test_a_gpu_gets_one_worker_whatever_the_cpus(cpus: int) -> None:
    assert instances_for("cuda:0", cpus) == 1
    assert instances_for("cuda:3", cpus) == 1
    assert instances_for("cpu", cpus) == cpu_instances_for(cpus)


def _instances(*argv: str, **env: str) -> int | None:
    environ = {f"OIPSERVE_{k.upper()}": v for k, v in env.items()}
    _, settings = load_settings(["serve", "--model-repository", "m", *argv], environ)
    return settings.instances_per_device


def test_auto_is_the_default_flag_or_env_and_is_chosen_per_device_at_start() -> None:
    """None: the server picks each device's count (``instances_for``) as it starts it."""
    assert _instances() is None
    assert _instances("--instances-per-device", "auto") is None
    assert _instances(instances_per_device="auto") is None


def test_a_number_is_kept_for_every_device() -> None:
    assert _instances("--instances-per-device", "3") == 3
    assert _instances(instances_per_device="2") == 2
    assert _instances("--instances-per-device", "1", instances_per_device="auto") == 1


@pytest.mark.parametrize("value", ["null", "two", "-1", "1.5", ""])
def test_neither_a_number_nor_auto_is_refused_by_name(value: str) -> None:
    with pytest.raises(SettingsError, match="--instances-per-device"):
        _instances("--instances-per-device", value)
    if not value:  # an empty variable is not set: the default, auto (settings._from_environment)
        assert _instances(instances_per_device=value) is None
        return
    with pytest.raises(SettingsError, match="OIPSERVE_INSTANCES_PER_DEVICE"):
        _instances(instances_per_device=value)
