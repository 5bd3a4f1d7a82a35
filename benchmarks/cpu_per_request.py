"""CPU per request of several oipserve builds, interleaved: where a build spends more.

Throughput on this shared 2-core machine drifts 30-40 % between runs; CPU time per
request, read from /proc for the front process and its workers separately, moves less
and says which process a change made costlier. Each build is a source tree (a git
worktree of some commit); all are started at once on the benchmark repository that
`benchmarks/run.py` writes, then driven in turn (order reversed every other round) by
wrk at c=16 (``--concurrency``) with the tiny JSON request, and medians over rounds are
printed.

    git worktree add --detach ../base <commit>
    python benchmarks/cpu_per_request.py ../base . --rounds 8

Needs a prior `benchmarks/run.py` run (for benchmarks/.work/) and wrk; it drives wrk and reads
CPU times with the harness's own `run_wrk` and `cpu_snapshot`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.load import run_wrk  # noqa: E402
from oipbench.payloads import HttpBody  # noqa: E402
from oipbench.procs import CpuSnapshot, cpu_snapshot  # noqa: E402

WORK = BENCH / ".work"


def _front_and_workers(before: CpuSnapshot, after: CpuSnapshot, front: int) -> tuple[float, float]:
    """CPU seconds the front and the rest of its tree (its workers) spent in between."""
    spent = {
        pid: seconds - before.per_pid.get(pid, ("", 0.0))[1]
        for pid, (_, seconds) in after.per_pid.items()
    }
    return spent.get(front, 0.0), sum(s for pid, s in spent.items() if pid != front)


def _start(build: Path) -> tuple[subprocess.Popen[str], str]:
    # NOTE: -P and PYTHONPATH: each build's own code, not the current directory's.
    env = {**os.environ, "PYTHONPATH": str(build), "OIPSERVE_METRICS_PORT": "0"}
    argv = [sys.executable, "-P", "-m", "oipserve", "serve", "--model-repository",
            str(WORK / "repos" / "oipserve"), "--http-port", "0", "--grpc-port", "0",
            "--instances-per-device", "2"]  # fmt: skip
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"ready http://(\S+)", line)
        if match:
            return proc, match.group(1)
    raise RuntimeError(f"{build}: the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", type=Path, help="source trees to compare")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16, help="wrk connections")
    ns = parser.parse_args()
    body = HttpBody(WORK / "payloads" / "simple.json", "application/json", None)
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    servers = {build: _start(build.resolve()) for build in ns.builds}
    results: dict[Path, list[tuple[float, float, float]]] = {b: [] for b in ns.builds}
    try:
        for rnd in range(ns.rounds):
            for build in ns.builds if rnd % 2 == 0 else ns.builds[::-1]:
                proc, url = servers[build]
                before = cpu_snapshot(proc.pid)
                m = run_wrk(str(build), f"tiny-json-c{ns.concurrency}", rnd,
                            f"http://{url}/v2/models/simple/infer", body, ns.concurrency,
                            ns.seconds, scratch, proc.pid)  # fmt: skip
                front, workers = _front_and_workers(before, cpu_snapshot(proc.pid), proc.pid)
                if not m.ok:
                    raise RuntimeError(f"{build}: {m.note}")
                results[build].append((m.rps, front / m.requests * 1e6, workers / m.requests * 1e6))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
    for build, rows in results.items():
        rps, front, workers = (statistics.median(r[i] for r in rows) for i in range(3))
        print(
            f"{str(build):30s} req/s {rps:8,.0f}   CPU per request: front {front:5.0f} us "
            f"(min {min(r[1] for r in rows):.0f}), workers {workers:5.0f} us"
        )


if __name__ == "__main__":
    main()
