"""Worker instances per device, A/B: req/s, p50/p99 and CPU per request, interleaved.

The question (issue #40): how many worker processes should a CPU device get by default
(``--instances-per-device``), for a model without ``instance_group`` (which gets a session
in every worker of the device)? The harness (`benchmarks/run.py`) always writes
``instance_group { count: 2 }`` and passes ``--instances-per-device 2``, so it never
measures what a user's plain model gets. This script writes the harness's models again
WITHOUT ``instance_group`` (benchmarks/.work/repos/worker-instances), starts one server per
configuration (all at once, default fronts: ``--http-workers auto``), and drives the
workers-bound rows in turn, order reversed every other round:

    matmul-binary-c4       matmul_relu, binary extension, 4 connections
    matmul-unbatched-c16   matmul_unbatched, binary extension, 16 connections
    tiny-json-c16          simple (INT32 [1,16] add/sub), JSON, 16 connections

``--configs``: comma list of ``N`` (``--instances-per-device N``, intra-op threads as the
server splits them: usable CPUs // N) or ``NtM`` (N instances, M intra-op threads each).
``NtM`` sets ``OIPSERVE_BENCH_THREADS=M`` in the server's environment, which only a build
whose ``_threads_per_worker`` (oipserve/app/server.py) reads it honours: make a patched
copy for that (benchmarks/results/2026-11-28-worker-instances.md says how).

    python benchmarks/worker_instances.py --build . --configs 1,2 --rounds 6

Needs a prior `benchmarks/run.py` run (benchmarks/.work/models and payloads) and wrk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.load import run_wrk  # noqa: E402
from oipbench.models import ModelCase, build_models  # noqa: E402
from oipbench.payloads import HttpBody, binary_body, json_body  # noqa: E402
from oipbench.procs import (  # noqa: E402
    _runs_models,
    cpu_snapshot,
    front_and_workers,
    machine_busy_seconds,
    machine_cpu_pct,
)
from oipbench.servers import SourceServer, serve_from  # noqa: E402

WORK = BENCH / ".work"
HARNESS_REPO = WORK / "repos" / "oipserve"
REPO = WORK / "repos" / "worker-instances"

#: row -> (model, body writer, connections)
ROWS: dict[str, tuple[str, Callable[[ModelCase, Path], HttpBody], int]] = {
    "matmul-binary-c4": ("matmul_relu", binary_body, 4),
    "matmul-unbatched-c16": ("matmul_unbatched", binary_body, 16),
    "tiny-json-c16": ("simple", json_body, 16),
}


@dataclass
class Config:
    """One server: its instances, its forced intra-op threads (None: the server's split)."""

    name: str
    instances: int
    threads: int | None
    server: SourceServer | None = None
    rows: dict[str, dict[int, tuple[float, ...]]] = field(default_factory=dict)


def parse_configs(text: str) -> list[Config]:
    """``1,2,2t2`` -> configurations (see the module docstring)."""
    configs = []
    for item in text.split(","):
        found = re.fullmatch(r"(\d+)(?:t(\d+))?", item.strip())
        if not found:
            raise SystemExit(f"--configs: {item!r} is not N or NtM")
        threads = int(found.group(2)) if found.group(2) else None
        configs.append(Config(item.strip(), int(found.group(1)), threads))
    return configs


def write_repo(models: list[str]) -> Path:
    """The harness's configs of ``models`` without ``instance_group`` and thread parameters."""
    if REPO.exists():
        shutil.rmtree(REPO)
    for model in models:
        shutil.copytree(HARNESS_REPO / model, REPO / model)
        config = REPO / model / "config.pbtxt"
        kept = [
            line
            for line in config.read_text().splitlines()
            if not line.startswith(("instance_group", "parameters"))
        ]
        config.write_text("\n".join(kept) + "\n")
    return REPO


def start(build: Path, config: Config, repo: Path) -> SourceServer:
    """One server of ``config`` from ``build`` (default fronts)."""
    saved = os.environ.get("OIPSERVE_BENCH_THREADS")
    os.environ.pop("OIPSERVE_BENCH_THREADS", None)
    if config.threads is not None:
        os.environ["OIPSERVE_BENCH_THREADS"] = str(config.threads)
    try:
        args = ["--model-repository", str(repo), "--http-port", "0", "--grpc-port", "0",
                "--instances-per-device", str(config.instances)]  # fmt: skip
        return serve_from(build, args)
    finally:
        os.environ.pop("OIPSERVE_BENCH_THREADS", None)
        if saved is not None:
            os.environ["OIPSERVE_BENCH_THREADS"] = saved


def workers_rss_mib(pid: int) -> float:
    """Resident memory of the tree's model-running processes, MiB."""
    total = 0
    for child in psutil.Process(pid).children(recursive=True):
        if _runs_models(child.pid):
            total += child.memory_info().rss
    return total / 2**20


def wait_for_quiet(limit_s: float) -> None:
    """Wait (at most ``limit_s``) for a second in which the machine is < 40 % busy: the box
    is shared, and a round started while another tenant's tests run measures them."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = machine_busy_seconds()
        time.sleep(1.0)
        if (machine_busy_seconds() - before) * 100 < 40:
            return


def measure(config: Config, row: str, body: HttpBody, rnd: int, ns: argparse.Namespace) -> None:
    """One wrk run of ``row`` on ``config``'s server; appends (req/s, p50, p99, CPU/req, busy)."""
    assert config.server is not None
    model, _, connections = ROWS[row]
    pid = config.server.proc.pid
    url = f"http://{config.server.http}/v2/models/{model}/infer"
    scratch = WORK / "scratch"
    run_wrk(config.name, row, rnd, url, body, connections, 1, scratch, pid)  # warm-up
    before = cpu_snapshot(pid)
    m = run_wrk(config.name, row, rnd, url, body, connections, ns.seconds, scratch, pid)
    after = cpu_snapshot(pid)
    front, workers = front_and_workers(before, after)
    if not m.ok:  # (a busy shared box: one failed run loses that round, not the others)
        print(f"round {rnd + 1}: {config.name} {row} failed: {m.note}", flush=True)
        return
    per_request = 1e6 / m.requests
    busy = (front + workers) / m.duration_s * 100
    other = max(0.0, machine_cpu_pct(before, after) - busy)  # other tenants (and wrk)
    config.rows.setdefault(row, {})[rnd] = (
        m.rps,
        m.p50_ms,
        m.p99_ms,
        (front + workers) * per_request,
        busy,
        other,
    )


def report(configs: list[Config], rows: list[str]) -> None:
    """Medians per row and configuration; *paired* is the median over rounds of each round's
    req/s against the first configuration's in the same round (drift between rounds cancels),
    with its min-max; *other* is the CPU the rest of the machine used meanwhile."""
    base = configs[0]
    print(
        "| row | config | req/s median (min-max) | paired vs first (min-max) | p50 ms | p99 ms "
        "| CPU us/req | busy % | other % |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        first = base.rows.get(row, {})
        for config in configs:
            by_round = config.rows.get(row, {})
            got = list(by_round.values())
            if not got:
                continue
            rps, p50, p99, cpu, busy, other = (
                statistics.median(r[i] for r in got) for i in range(6)
            )
            low, high = min(r[0] for r in got), max(r[0] for r in got)
            ratios = [r[0] / first[n][0] for n, r in by_round.items() if n in first] or [0.0]
            paired = statistics.median(ratios)
            print(
                f"| {row} | {config.name} | {rps:,.0f} ({low:,.0f}-{high:,.0f}) | "
                f"{paired:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {p50:.2f} | {p99:.2f} "
                f"| {cpu:.0f} | {busy:.0f} | {other:.0f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, default=BENCH.parent, help="source tree")
    parser.add_argument("--configs", default="1,2")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument("--quiet-wait", type=float, default=20, help="seconds, per round")
    ns = parser.parse_args()
    configs = parse_configs(ns.configs)
    rows = ns.rows.split(",")
    cases = build_models(WORK / "models")
    bodies = {}
    for row in rows:
        model, write, _ = ROWS[row]
        suffix = "json" if write is json_body else "bin"
        bodies[row] = write(cases[model], WORK / "payloads" / f"{model}.{suffix}")
    repo = write_repo(sorted({ROWS[row][0] for row in rows}))
    (WORK / "scratch").mkdir(parents=True, exist_ok=True)
    try:
        for config in configs:
            config.server = start(ns.build.resolve(), config, repo)
            print(f"{config.name}: workers hold {workers_rss_mib(config.server.proc.pid):.0f} MiB")
        for rnd in range(ns.rounds):
            wait_for_quiet(ns.quiet_wait)
            order = configs if rnd % 2 == 0 else configs[::-1]
            for row in rows:
                for config in order:
                    measure(config, row, bodies[row], rnd, ns)
            print(f"round {rnd + 1} of {ns.rounds} done", flush=True)
    finally:
        for config in configs:
            if config.server is not None:
                config.server.stop()
        print(f"{ns.rounds} rounds of {ns.seconds} s, default fronts, no instance_group:")
        report(configs, rows)
        if ns.json:
            ns.json.write_text(json.dumps({c.name: c.rows for c in configs}, indent=1))


if __name__ == "__main__":
    main()
