"""Usable CPUs (affinity and cgroup quota), and the CPU workers' threads sized from them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hardware import FakeInventory, InventoryError, SystemInventory
from hardware.cpus import cgroup_cpu_quota, parse_cfs, parse_cpu_max, usable_cpus


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("400000 100000", 4.0),
        ("250000 100000", 2.5),
        ("max 100000", None),
        ("", None),
        ("x 100000", None),
        ("0 100000", None),
    ],  # fmt: skip
)
def test_cpu_max(text: str, cpus: float | None) -> None:
    assert parse_cpu_max(text) == cpus


@pytest.mark.parametrize(
    ("quota", "period", "cpus"),
    [("200000", "100000", 2.0), ("-1", "100000", None), ("?", "1", None)],
)
def test_cfs(quota: str, period: str, cpus: float | None) -> None:
    assert parse_cfs(quota, period) == cpus


def _proc_cgroup(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proc-self-cgroup"
    path.write_text(text)
    return path


def test_v2_quota_of_own_cgroup_wins_over_the_root(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    own = root / "kubepods.slice" / "pod1"
    own.mkdir(parents=True)
    (own / "cpu.max").write_text("300000 100000\n")
    (root / "cpu.max").write_text("max 100000\n")
    proc = _proc_cgroup(tmp_path, "0::/kubepods.slice/pod1\n")
    assert cgroup_cpu_quota(root, proc) == 3.0
    assert usable_cpus(root, proc) == min(3, len(os.sched_getaffinity(0)))


def test_v2_inside_a_cgroup_namespace_reads_the_root(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(root, _proc_cgroup(tmp_path, "0::/\n")) == 1.5
    assert usable_cpus(root, _proc_cgroup(tmp_path, "0::/\n")) <= 2  # 1.5 CPUs: 2 at once


def test_v1_cpu_hierarchy(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    own = root / "cpu,cpuacct" / "docker" / "abc"
    own.mkdir(parents=True)
    (own / "cpu.cfs_quota_us").write_text("200000\n")
    (own / "cpu.cfs_period_us").write_text("100000\n")
    proc = _proc_cgroup(tmp_path, "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_quota(root, proc) == 2.0


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    proc = _proc_cgroup(tmp_path, "0::/\n")
    assert cgroup_cpu_quota(tmp_path / "none", proc) is None
    assert usable_cpus(tmp_path / "none", proc) >= 1


def test_cpu_workers_share_the_usable_cpus_not_the_nodes() -> None:
    """A pod limited to 4 CPUs on a 64-core node: 2 instances get 2 threads each, not 32."""
    from oipserve.app.server import _threads_per_worker

    assert _threads_per_worker("cpu", 4, 2, 64) == 2
    assert _threads_per_worker("cpu", 1, 2, 64) == 1
    assert _threads_per_worker("cuda:0", 4, 2, 64) == 1
    # --max-threads-per-session bounds it (an inventory's 100,000 cores hung the start)
    assert _threads_per_worker("cpu", 100_000, 1, 64) == 64


def test_the_system_inventory_counts_usable_cores() -> None:
    cpu = SystemInventory().read().cpu
    assert 1 <= cpu.usable_cores <= cpu.logical_cores
    assert cpu.usable_cores == min(cpu.logical_cores, usable_cpus())


def test_a_fake_inventory_without_usable_cores_has_no_quota(tmp_path: Path) -> None:
    path = tmp_path / "inventory.json"
    path.write_text('{"cpu": {"logical_cores": 16}}')
    assert FakeInventory(path).read().cpu.usable_cores == 16
    path.write_text('{"cpu": {"logical_cores": 16, "usable_cores": 4}}')
    assert FakeInventory(path).read().cpu.usable_cores == 4
    path.write_text('{"cpu": {"logical_cores": 4, "usable_cores": 8}}')
    with pytest.raises(InventoryError, match="usable_cores"):
        FakeInventory(path).read()
