"""How many CPUs this process may really use: its affinity mask and its cgroup's CPU quota.

``os.cpu_count()`` and psutil count the node's CPUs. In a Kubernetes pod with
``resources.limits.cpu: 4`` on a 64-core node that is 64, while the kernel lets the pod
run 4 CPUs' worth of time (the CFS quota of its cgroup). Sizing a process pool from the
node's count there oversubscribes the pod, so what depends on "how many cores do I
have" reads this instead. (The standard library's ``os.process_cpu_count``, 3.13+,
reads the affinity mask only; no maintained library reads the quota.)

cgroup v2: ``cpu.max`` holds ``"<quota> <period>"`` or ``"max <period>"``. cgroup v1:
``cpu.cfs_quota_us`` (-1: none) and ``cpu.cfs_period_us``. A quota of 2.5 CPUs counts
as 3 (the pod may run three threads at once, for part of the time).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(
    cgroup_root: Path = _CGROUP_ROOT, own_cgroup: Path = Path("/proc/self/cgroup")
) -> int:
    """CPUs in this process's affinity mask, capped by its cgroup's CPU quota; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, own_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


#: Most fronts ``--http-workers auto`` starts. Measured up to 2 (2 cores); beyond, each
#: front adds an event loop, a connection to every worker and a batcher of its own
#: (batches form per front), so the rule stays at 4 until the curve on a many-core node
#: (``benchmarks/front_scaling.py``) says more pay (docs/scaling.md, "The default number
#: of fronts").
AUTO_MAX_FRONTS = 4
#: Usable CPUs per front from 12 CPUs: fronts take at most a quarter of the node, the rest
#: is the workers' (model runs, ONNX Runtime's threads, pre-processing).
CPUS_PER_FRONT = 4


def fronts_for(cpus: int) -> int:
    """``--http-workers auto``: how many HTTP fronts to run on ``cpus`` usable CPUs.

    1 on one CPU (a second front would only take turns with the first); 2 from 2 CPUs
    (on 2 cores two fronts gave 1.05-1.29x one at c >= 4, and level at c = 1); from 12
    CPUs one per ``CPUS_PER_FRONT``, at most ``AUTO_MAX_FRONTS``.
    """
    if cpus < 2:
        return 1
    return min(AUTO_MAX_FRONTS, max(2, cpus // CPUS_PER_FRONT))


#: Most CPU worker processes ``--instances-per-device auto`` starts. Each one holds a
#: session of every model without ``instance_group``, so the models' memory is paid once
#: per instance: 2 at most doubles it, as Triton's default of 2 CPU instances for an ONNX
#: Runtime model does. More take ``--instances-per-device N`` or ``instance_group``.
AUTO_MAX_CPU_INSTANCES = 2
#: Fronts from which one worker can no longer keep up with them (docs/scaling.md, "Worker
#: instances by default"): a front sends up to ~8,000 tiny requests a second, a worker
#: runs ~20,000, so 3 fronts (24,000) outrun one worker.
FRONTS_PER_CPU_INSTANCE = 3


def cpu_instances_for(cpus: int) -> int:
    """``--instances-per-device auto`` on the CPU: worker processes for ``cpus`` usable CPUs.

    1 while ``fronts_for(cpus)`` is at most 2 (below 12 CPUs): on 2 cores a second
    instance did not pay in four interleaved A/B runs (issue #40; it costs a process, the
    models' memory again and its own polling), and one worker runs ~20,000 tiny requests
    a second, more than two fronts send. From 12 CPUs (3 fronts and more) 2, the cap: one
    worker runs one request at a time whatever its intra-op threads, so the third front's
    requests would queue behind it. Not yet measured above 2 cores. A GPU gets 1 worker
    per device, as in Triton (``instances_for``).
    """
    if fronts_for(cpus) < FRONTS_PER_CPU_INSTANCE:
        return 1
    return AUTO_MAX_CPU_INSTANCES


def instances_for(device: str, cpus: int) -> int:
    """``--instances-per-device auto`` on ``device``: ``cpu_instances_for`` on the CPU,
    1 on a GPU (a second process per GPU holds every model in device memory again and
    shares the one device; Triton's default is 1 instance per GPU too)."""
    return cpu_instances_for(cpus) if device == "cpu" else 1


def cgroup_cpu_quota(cgroup_root: Path, own_cgroup: Path) -> float | None:
    """The CPU quota (in CPUs) of this process's cgroup, None where there is none."""
    v2_dirs, v1_dirs = _own_dirs(cgroup_root, _read(own_cgroup) or "")
    for directory in v2_dirs:
        text = _read(directory / "cpu.max")
        if text is not None:
            return parse_cpu_max(text)
    for directory in v1_dirs:
        quota, period = (
            _read(directory / "cpu.cfs_quota_us"),
            _read(directory / "cpu.cfs_period_us"),
        )
        if quota is not None and period is not None:
            return parse_cfs(quota, period)
    return None


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max``: ``"400000 100000"`` -> 4.0, ``"max 100000"`` -> None."""
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return parse_cfs(fields[0], fields[1])  # the same two numbers, v2's one file


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; a quota of -1 is none."""
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _own_dirs(cgroup_root: Path, proc_cgroup: str) -> tuple[list[Path], list[Path]]:
    """Where this process's cgroup v2 and v1 ``cpu`` settings may lie, nearest first.

    From /proc/self/cgroup (``0::/path`` for v2, ``N:cpu,cpuacct:/path`` for v1), then the
    hierarchy's root as mounted: inside a container's cgroup namespace that is its own.
    """
    v2: list[Path] = []
    v1: list[Path] = []
    v1_mounts = [cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"]
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.strip().lstrip("/")
        if hierarchy == "0" and not controllers and relative:
            v2.append(cgroup_root / relative)
        elif "cpu" in controllers.split(",") and relative:
            v1.extend(mount / relative for mount in v1_mounts)
    return v2 + [cgroup_root], v1 + v1_mounts


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
