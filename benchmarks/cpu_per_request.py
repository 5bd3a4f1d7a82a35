"""CPU per request of several oipserve builds, interleaved: where a build spends more.

Throughput on this shared 2-core machine drifts 30-40 % between runs; CPU time per
request, read from /proc for the front process and its workers separately, moves less
and says which process a change made costlier. Each build is a source tree (a git
worktree of some commit); all are started at once on the benchmark repository that
`benchmarks/run.py` writes, then driven in turn (order reversed every other round) by
wrk at c=16 with the tiny JSON request, and medians over rounds are printed.

    git worktree add --detach ../base <commit>
    python benchmarks/cpu_per_request.py ../base . --rounds 8

Needs a prior `benchmarks/run.py` run (for benchmarks/.work/) and wrk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
WORK = BENCH / ".work"
LUA = BENCH / "lua" / "oip.lua"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _front_and_workers(pid: int) -> tuple[float, float]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return _cpu_s(pid), sum(_cpu_s(int(child)) for child in children)


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
    ns = parser.parse_args()
    env = {**os.environ, "OIPB_BODY": str(WORK / "payloads" / "simple.json"),
           "OIPB_CTYPE": "application/json", "OIPB_HLEN": "", "OIPB_COUNT_STATUS": "0",
           "OIPB_MAX_REQUESTS": "0", "OIPB_RATE": "0.0"}  # fmt: skip
    servers = {build: _start(build.resolve()) for build in ns.builds}
    results: dict[Path, list[tuple[float, float, float]]] = {b: [] for b in ns.builds}
    try:
        for rnd in range(ns.rounds):
            for build in ns.builds if rnd % 2 == 0 else ns.builds[::-1]:
                proc, url = servers[build]
                before = _front_and_workers(proc.pid)
                out = subprocess.run(
                    ["wrk", "-t1", "-c16", f"-d{ns.seconds}s", "-s", str(LUA),
                     f"http://{url}/v2/models/simple/infer"],
                    env=env, capture_output=True, text=True, check=True,
                ).stdout  # fmt: skip
                after = _front_and_workers(proc.pid)
                count = json.loads(out.split("OIPB_RESULT ", 1)[1].splitlines()[0])["requests"]
                results[build].append(
                    (
                        count / ns.seconds,
                        (after[0] - before[0]) / count * 1e6,
                        (after[1] - before[1]) / count * 1e6,
                    )
                )
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
