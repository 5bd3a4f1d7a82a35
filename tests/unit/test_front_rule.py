"""``--http-workers auto`` (issue #40): the number of HTTP fronts from the CPUs this process
may use (``hardware.cpus.fronts_for``), resolved when the settings load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hardware.cpus import AUTO_MAX_FRONTS, fronts_for, usable_cpus
from oipserve.config import settings as settings_module
from oipserve.config.settings import load_settings


@pytest.mark.parametrize(
    ("cpus", "fronts"),
    [(1, 1), (2, 2), (3, 2), (4, 2), (8, 2), (11, 2), (12, 3), (16, 4), (32, 4), (64, 4),
     (256, 4)],
)  # fmt: skip
def test_fronts_for_usable_cpus(cpus: int, fronts: int) -> None:
    assert fronts_for(cpus) == fronts


def test_fronts_never_take_more_than_the_cpus_or_the_cap() -> None:
    for cpus in range(1, 513):
        fronts = fronts_for(cpus)
        assert 1 <= fronts <= min(cpus, AUTO_MAX_FRONTS)
        assert fronts <= max(2, cpus // 4), "fronts leave the workers most of a big node"


def test_a_pod_limited_to_two_cpus_on_a_big_node_gets_two_fronts(tmp_path: Path) -> None:
    """The quota counts, not the node's CPUs: `limits.cpu: 2` on a 64-core node is 2."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text("200000 100000\n")
    proc = tmp_path / "cgroup-of-self"
    proc.write_text("0::/\n")
    cpus = usable_cpus(root, proc)
    assert cpus == min(2, len(os.sched_getaffinity(0)))
    assert fronts_for(cpus) == fronts_for(min(2, len(os.sched_getaffinity(0))))


def _fronts(monkeypatch: pytest.MonkeyPatch, cpus: int, *argv: str, **env: str) -> int:
    monkeypatch.setattr(settings_module, "usable_cpus", lambda: cpus)
    environ = {f"OIPSERVE_{k.upper()}": v for k, v in env.items()}
    _, settings = load_settings(["serve", "--model-repository", "m", *argv], environ)
    return settings.http_workers


@pytest.mark.parametrize(("cpus", "fronts"), [(1, 1), (2, 2), (16, 4), (64, 4)])
def test_auto_as_a_flag_or_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, cpus: int, fronts: int
) -> None:
    assert _fronts(monkeypatch, cpus, "--http-workers", "auto") == fronts
    assert _fronts(monkeypatch, cpus, http_workers="auto") == fronts


def test_a_number_is_kept_whatever_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _fronts(monkeypatch, 64, "--http-workers", "1") == 1
    assert _fronts(monkeypatch, 1, "--http-workers", "3") == 3
    assert _fronts(monkeypatch, 64, http_workers="1") == 1


@pytest.mark.parametrize(("cpus", "fronts"), [(1, 1), (2, 2), (16, 4)])
def test_auto_is_the_default(monkeypatch: pytest.MonkeyPatch, cpus: int, fronts: int) -> None:
    """Issue #40: the configuration a user gets without the flag follows the rule."""
    assert _fronts(monkeypatch, cpus) == fronts
    assert _fronts(monkeypatch, cpus, "--allow-http", "false") == 1


def test_auto_without_http_is_one_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing to share without an HTTP port; a number there is refused, auto is not."""
    assert _fronts(monkeypatch, 16, "--http-workers", "auto", "--allow-http", "false") == 1
