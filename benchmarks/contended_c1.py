"""c=1 while CPU hogs hold the cores: oipserve builds (and Triton) with and without hogs.

Issue 40: on a node whose cores are shared (other workers, pre-processing, someone's
build), oipserve's c=1 rate was seen to collapse while Triton's held. This makes the
contention reproducible and the script's own: ``--hogs`` processes running
``while True: pass`` at nice 0, each in a session of its own (so each is its own
autogroup, as another user's build is), started before and stopped after each batch of
measurements. Every round measures every server without hogs and with them (the order of
both reversed every other round), so the hogs' presence is the variable and the other
tenants of a shared box fall on both sides.

Each variant is ``NAME=TREE[:ENV=VALUE,...]``: the source tree to serve from and
environment variables for that server (``OIPSERVE_BUSY_POLL_US=0``, ...). Servers are
started with the tiny model repository that ``benchmarks/run.py`` writes, each in a
session of its own as the harness starts them (``--instances-per-device 2``, the rest
default: ``--http-workers auto``). wrk at ``--concurrency`` drives the harness's REST
request (``--request``, tiny JSON by default). Besides req/s, p50/p99 and the CPU a
request of the front(s) and the workers, each row reads the scheduler's view of the server's
processes from ``/proc/<pid>/task/<tid>/schedstat`` and ``status``: time waiting on a run
queue, time slices and nonvoluntary context switches, a request.

    python benchmarks/contended_c1.py base=../base fix=. --triton --hogs 4 --rounds 3

Needs a prior ``benchmarks/run.py`` run (benchmarks/.work, and its Triton venv for
``--triton``) and wrk (as ``benchmarks/cpu_per_request.py``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import cpu_per_request as cpr  # noqa: E402
from oipbench import procs  # noqa: E402
from oipbench import servers as oipb_servers  # noqa: E402
from oipbench.load import run_wrk  # noqa: E402

#: Per process kind ("front", "worker"): run-queue wait µs, slices and nonvoluntary
#: switches, a request.
Sched = dict[str, tuple[float, float, float]]
#: One measurement: req/s, p50 ms, p99 ms, front and workers CPU µs a request, Sched.
Row = tuple[float, float, float, float, float, Sched]
Server = tuple[int, str, Callable[[], None]]


class _OwnSession:
    """``subprocess`` for ``serve_from``, whose servers then start in sessions of their own
    as the harness's do: in the caller's session they would share its autogroup."""

    Popen = staticmethod(functools.partial(subprocess.Popen, start_new_session=True))

    def __getattr__(self, name: str) -> object:
        return getattr(subprocess, name)


def _sched(root: int) -> dict[int, tuple[str, int, int, int]]:
    """Per process of the tree: kind, then wait ns, slices and nonvoluntary switches summed
    over its threads."""
    out: dict[int, tuple[str, int, int, int]] = {}
    for pid in procs.tree_pids(root):
        kind = "worker" if procs._runs_models(pid) else "front"
        wait = slices = switches = 0
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                task = Path(f"/proc/{pid}/task/{tid}")
                _, waited, turns = task.joinpath("schedstat").read_text().split()
                wait += int(waited)
                slices += int(turns)
                for line in task.joinpath("status").read_text().splitlines():
                    if line.startswith("nonvoluntary_ctxt_switches"):
                        switches += int(line.split()[1])
        except (OSError, ValueError):
            continue
        out[pid] = (kind, wait, slices, switches)
    return out


def _sched_delta(
    before: dict[int, tuple[str, int, int, int]],
    after: dict[int, tuple[str, int, int, int]],
    requests: float,
) -> Sched:
    sums: dict[str, list[int]] = {}
    for pid, (kind, *now) in after.items():
        then = before.get(pid, (kind, 0, 0, 0))[1:]
        total = sums.setdefault(kind, [0, 0, 0])
        for i in range(3):
            total[i] += now[i] - then[i]
    return {
        kind: (wait / requests / 1e3, slices / requests, switches / requests)
        for kind, (wait, slices, switches) in sums.items()
    }


def _start(spec: str, args: list[str]) -> tuple[str, Server]:
    name, rest = spec.split("=", 1)
    tree, _, envs = rest.partition(":")
    saved = dict(os.environ)
    try:
        for pair in filter(None, envs.split(",")):
            key, value = pair.split("=", 1)
            os.environ[key] = value
        server = oipb_servers.serve_from(Path(tree), args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return name, (server.proc.pid, server.http, server.stop)


def _measure(server: Server, model: str, body: cpr.HttpBody, ns: argparse.Namespace) -> Row:
    pid, url, _ = server
    before = _sched(pid)
    m = run_wrk("server", "contended", 0, f"http://{url}/v2/models/{model}/infer", body,
                ns.concurrency, ns.seconds, cpr.WORK / "scratch", pid)  # fmt: skip
    if not m.ok:
        raise RuntimeError(m.note)
    front, workers = m.cpu_us_per_request()
    sched = _sched_delta(before, _sched(pid), max(m.rps * m.duration_s, 1.0))
    return (m.rps, m.p50_ms, m.p99_ms, front, workers, sched)


def _line(row: Row) -> str:
    rps, p50, p99, front, workers, sched = row
    kinds = " ".join(
        f"{kind}: wait {w:5.0f} us, slices {s:4.1f}, nvcsw {n:4.2f}"
        for kind, (w, s, n) in sorted(sched.items())
    )
    return (
        f"{rps:7,.0f} req/s p50 {p50:.3f} p99 {p99:.3f} CPU front {front:4.0f} "
        f"workers {workers:4.0f} us | {kinds}"
    )


def _batch(
    servers: dict[str, Server], hogs: int, order: list[str], model: str, body: cpr.HttpBody,
    ns: argparse.Namespace, rows: dict[tuple[str, int], list[Row]], rnd: int,
) -> None:  # fmt: skip
    """Every server measured once while ``hogs`` hogs run."""
    argv = [sys.executable, "-c", "while True: pass"]
    running = [subprocess.Popen(argv, start_new_session=True) for _ in range(hogs)]
    try:
        time.sleep(0.5)  # the hogs are running: the scheduler has placed them
        for name in order:
            row = _measure(servers[name], model, body, ns)
            rows.setdefault((name, hogs), []).append(row)
            print(f"round {rnd} hogs {hogs} {name:12s} {_line(row)}", flush=True)
    finally:
        for hog in running:
            hog.kill()
            hog.wait()


def _report(rows: dict[tuple[str, int], list[Row]]) -> None:
    print("medians (req/s min-max):")
    for (name, hogs), measured in sorted(rows.items()):
        rates = [r[0] for r in measured]
        med = [statistics.median(r[i] for r in measured) for i in range(5)]
        waits = {
            kind: statistics.median(r[5].get(kind, (0.0, 0.0, 0.0))[0] for r in measured)
            for kind in ("front", "worker")
        }
        print(
            f"{name:12s} hogs {hogs}: {med[0]:7,.0f} req/s ({min(rates):,.0f}-{max(rates):,.0f})"
            f" p50 {med[1]:.3f} p99 {med[2]:.3f} CPU front {med[3]:.0f} workers {med[4]:.0f}"
            f" us; run-queue wait front {waits['front']:.0f} worker {waits['worker']:.0f} us"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", help="NAME=TREE[:ENV=VALUE,...]")
    parser.add_argument("--hogs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--request", choices=sorted(cpr.REQUESTS), default="tiny-json")
    parser.add_argument("--triton", action="store_true", help="measure Triton too")
    ns = parser.parse_args()
    cases = cpr.build_models(cpr.WORK / "models")
    model, body = cpr.request_body(ns.request, cases)
    (cpr.WORK / "scratch").mkdir(parents=True, exist_ok=True)
    oipb_servers.subprocess = _OwnSession()  # type: ignore[assignment]
    args = ["--model-repository", str(cpr.WORK / "repos" / "oipserve"), "--http-port", "0",
            "--grpc-port", "0", "--instances-per-device", "2"]  # fmt: skip
    servers: dict[str, Server] = {}
    rows: dict[tuple[str, int], list[Row]] = {}
    try:
        if ns.triton:
            servers["triton"] = cpr._start_triton(cases)
        for spec in ns.variants:
            name, server = _start(spec, args)
            servers[name] = server
        for name, server in servers.items():
            cpr._warm(name, server, model, body)
        names = list(servers)
        for rnd in range(ns.rounds):
            forward = rnd % 2 == 0
            for hogs in [0, ns.hogs] if forward else [ns.hogs, 0]:
                _batch(servers, hogs, names if forward else names[::-1], model, body, ns,
                       rows, rnd)  # fmt: skip
    finally:
        for _, _, stop in servers.values():
            stop()
    _report(rows)


if __name__ == "__main__":
    main()
