"""``--http-workers auto`` (issue #40): the number of HTTP fronts from the CPUs this process
may use (``hardware.cpus.fronts_for``), whatever the repository holds, settled at start-up
(``oipserve.app.fronts.settle_fronts``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hardware.cpus import AUTO_MAX_FRONTS, fronts_for, usable_cpus
from oipserve.app import fronts as fronts_module
from oipserve.app.fronts import settle_fronts
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


def _repository(root: Path, **configs: str) -> Path:
    """A repository of models named by ``configs``, each with that config.pbtxt ("" none)."""
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(b"")
        if config:
            (root / name / "config.pbtxt").write_text(config)
    return root


PLAIN = "max_batch_size: 8\n"
DYNAMIC = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 100 }\n"
SEQUENCE = "max_batch_size: 4\nsequence_batching { }\n"


def _fronts(
    monkeypatch: pytest.MonkeyPatch, cpus: int, *argv: str, repo: Path | None = None, **env: str
) -> int:
    """The fronts a server started with ``argv`` and ``env`` on ``repo`` settles on."""
    monkeypatch.setattr(fronts_module, "usable_cpus", lambda: cpus)
    environ = {f"OIPSERVE_{k.upper()}": v for k, v in env.items()}
    root = str(repo) if repo is not None else "m"
    _, settings = load_settings(["serve", "--model-repository", root, *argv], environ)
    if repo is None:  # not started: what load_settings left
        return settings.fronts if settings.http_workers is not None else 0
    settled = settle_fronts(settings)
    assert settled.http_workers is not None
    return settled.http_workers


@pytest.mark.parametrize(("cpus", "fronts"), [(1, 1), (2, 2), (16, 4), (64, 4)])
def test_auto_as_a_flag_or_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpus: int, fronts: int
) -> None:
    repo = _repository(tmp_path, plain=PLAIN, bare="")
    assert _fronts(monkeypatch, cpus, "--http-workers", "auto", repo=repo) == fronts
    assert _fronts(monkeypatch, cpus, http_workers="auto", repo=repo) == fronts


def test_a_number_is_kept_whatever_the_cpus_and_the_models(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = _repository(tmp_path, batched=DYNAMIC)
    assert _fronts(monkeypatch, 64, "--http-workers", "1", repo=repo) == 1
    assert _fronts(monkeypatch, 1, "--http-workers", "3", repo=repo) == 3
    assert _fronts(monkeypatch, 64, http_workers="1", repo=repo) == 1
    assert _fronts(monkeypatch, 2, http_workers="2", repo=repo) == 2


@pytest.mark.parametrize(("cpus", "fronts"), [(1, 1), (2, 2), (16, 4)])
def test_auto_is_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpus: int, fronts: int
) -> None:
    """Issue #40: the configuration a user gets without the flag follows the rule."""
    repo = _repository(tmp_path, plain=PLAIN)
    assert _fronts(monkeypatch, cpus, repo=repo) == fronts
    assert _fronts(monkeypatch, cpus, "--allow-http", "false") == 1


def test_auto_is_settled_at_start_up_not_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings leave ``auto`` to start-up."""
    assert _fronts(monkeypatch, 16) == 0


@pytest.mark.parametrize("config", [DYNAMIC, SEQUENCE], ids=["dynamic", "sequence"])
def test_a_batching_model_keeps_the_cpus_fronts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: str
) -> None:
    """Dynamic batches and sequences form in the primary front whatever the number of
    fronts (until 2026-11-29 ``auto`` kept one front for them: each front batched its own
    clients, and Triton's L0_batcher QA tests failed against two)."""
    repo = _repository(tmp_path, plain=PLAIN, batching=config)
    assert _fronts(monkeypatch, 2, repo=repo) == 2
    assert _fronts(monkeypatch, 16, repo=repo) == 4
