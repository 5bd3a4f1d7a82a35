"""At low load: a front and its worker on one core, polling or not (an experiment).

At c=1 a request crosses between processes four times: client to front, front to worker,
worker to front, front to client. When the process woken sleeps on another core, each
crossing wakes a halted vCPU (an inter-processor interrupt, a VM exit on this 2-core VM),
and busy polling (``oipserve.runtime.busy_poll``, ``workers.busy_poll``) buys the latency
back by keeping both cores spinning. When the front and its worker share one core, the two
crossings between them are a context switch on that core instead.

This measures, interleaved (order reversed every other round), one build in several
configurations: ``free`` (as the README starts it), ``free-nopoll`` (polling off),
``pinned`` (front and workers on the last CPU) and ``pinned-nopoll``; and Triton
(``--triton``, free). This script runs on the first CPU and so does wrk (one connection
per ``--concurrency``), as a client on another machine would not share the server's core.
Prints req/s, p50 and the server's CPU per request (medians over rounds).

    python benchmarks/colocation.py . --rounds 6 --concurrency 1

Needs a prior `benchmarks/run.py` run (benchmarks/.work/; its Triton venv for ``--triton``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from cpu_per_request import WORK, request_body  # noqa: E402
from oipbench.load import run_wrk  # noqa: E402
from oipbench.models import build_models  # noqa: E402
from oipbench.procs import cpu_snapshot, tree_pids  # noqa: E402
from oipbench.servers import Tuning, serve_from, start_triton  # noqa: E402

#: Configuration -> (pinned to the last CPU, extra serve arguments).
CONFIGS: dict[str, tuple[bool, list[str]]] = {
    "free": (False, []),
    "free-nocoloc": (False, ["--low-load-colocation", "false"]),
    "free-nopoll": (False, ["--busy-poll-us", "0", "--worker-busy-poll-us", "0"]),
    "pinned": (True, []),
    "pinned-nopoll": (True, ["--busy-poll-us", "0", "--worker-busy-poll-us", "0"]),
}


def _pin(root: int, cpus: set[int]) -> None:
    """Every process (and thread) of a server's tree onto ``cpus``."""
    for pid in tree_pids(root):
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(task), cpus)
            except OSError:
                continue  # a thread that has ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="the source tree to measure")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--request", default="tiny-json")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--triton", action="store_true")
    ns = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        parser.error("needs two CPUs: one for the client, one for the pinned server")
    client_cpu, server_cpu = cpus[0], cpus[-1]
    cases = build_models(WORK / "models")
    model, body = request_body(ns.request, cases)
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    servers: dict[str, tuple[int, str, Callable[[], None]]] = {}
    rows: dict[str, list[tuple[float, float, float]]] = {}
    try:
        for name in ns.configs.split(","):
            pinned, extra = CONFIGS[name]
            args = ["--model-repository", str(WORK / "repos" / "oipserve"), "--http-port", "0",
                    "--grpc-port", "0", "--http-workers", "1", *extra]  # fmt: skip
            server = serve_from(ns.build.resolve(), args)
            _pin(server.proc.pid, {server_cpu} if pinned else set(cpus))
            servers[name] = (server.proc.pid, server.http, server.stop)
        if ns.triton:
            triton = start_triton(WORK.parent / ".venvs" / "triton", cases, WORK / "co-triton",
                                  Tuning())  # fmt: skip
            assert triton.proc is not None
            _pin(triton.root_pid(), set(cpus))
            url = triton.http_url.removeprefix("http://")
            servers["triton"] = (triton.root_pid(), url, triton.proc.stop)
        # NOTE: only now: the servers, started before, size their fronts and ONNX Runtime's
        #   threads by the CPUs they may use; wrk inherits this process's.
        os.sched_setaffinity(0, {client_cpu})
        names = list(servers)
        rows = {name: [] for name in names}
        for rnd in range(ns.rounds):
            for name in names if rnd % 2 == 0 else names[::-1]:
                pid, url, _ = servers[name]
                before = cpu_snapshot(pid)
                m = run_wrk(name, f"{ns.request}-c{ns.concurrency}", rnd,
                            f"http://{url}/v2/models/{model}/infer", body, ns.concurrency,
                            ns.seconds, scratch, pid)  # fmt: skip
                after = cpu_snapshot(pid)
                if not m.ok:
                    raise RuntimeError(f"{name}: {m.note}")
                spent = sum(s for _, s in after.per_pid.values()) - sum(
                    s for _, s in before.per_pid.values()
                )
                rows[name].append((m.rps, m.p50_ms * 1000, spent / m.requests * 1e6))
    finally:
        for _, _, stop in servers.values():
            stop()
    print(f"{ns.request}, c={ns.concurrency}, {ns.rounds} rounds of {ns.seconds} s (medians):")
    for name, measured in rows.items():
        rps, p50, cpu = (statistics.median(r[i] for r in measured) for i in range(3))
        print(f"{name:14s} req/s {rps:7,.0f}   p50 {p50:5.0f} us   server CPU {cpu:4.0f} us/req")


if __name__ == "__main__":
    main()
