"""Does a second front process pay on this machine? One front against two, same cores.

The front is one Python thread. At c=16 a tiny request saturates it while the machine
still has idle time (results/2026-11-27-cpu-vs-triton.md). This compares, with the same
clients and the same number of workers:

- **one front**: one server with two workers, driven by two wrk processes at c=8 each;
- **--http-workers 2**: the same server with two HTTP fronts over its two workers
  (docs/scaling.md), driven by the same two clients;
- **two servers**: two servers with one worker each, each driven by one wrk at c=8 (the
  stand-in measured before ``--http-workers`` was built: nothing shared);
- with ``--triton``, Triton (as the harness starts it) driven by the same two clients.

``--protocol grpc`` drives the servers' gRPC ports with the harness's gRPC client (one
client process of c=8 in place of each wrk); gRPC runs in each front.

Rounds are interleaved, the order reversed every other round, and the medians of the
summed req/s are printed, with each configuration's errors, how much of the machine its
servers kept busy (% of one core) and their CPU per request.

    python benchmarks/front_replicas.py --rounds 6 [--request tiny-binary] [--triton]
    python benchmarks/front_replicas.py --rounds 6 --protocol grpc [--request matmul] [--triton]

Needs a prior `benchmarks/run.py` run (for benchmarks/.work/, and its Triton venv for
``--triton``) and wrk.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from cpu_per_request import REQUESTS, TRITON_VENV, WORK, request_body  # noqa: E402
from oipbench.load import Measurement, run_grpc, run_wrk  # noqa: E402
from oipbench.models import build_models  # noqa: E402
from oipbench.payloads import HttpBody, grpc_spec  # noqa: E402
from oipbench.servers import Server, Tuning, start_oipserve, start_triton  # noqa: E402

#: Connections of each of the two clients.
CONNECTIONS = 8
#: The harness's gRPC client, in its tools venv (a `benchmarks/run.py` run makes both).
TOOLS_PYTHON = BENCH / ".venvs" / "tools" / "bin" / "python"
#: --protocol grpc --request: the model (its request spec is the harness's, `grpc_spec`).
GRPC_REQUESTS = {"tiny": "simple", "matmul": "matmul_relu"}


def _client(
    ns: argparse.Namespace, request: Path | tuple[str, HttpBody], name: str, rnd: int, i: int,
    server: Server,
) -> Measurement:  # fmt: skip
    """Client ``i`` of a round against ``server``: gRPC with a spec file, else REST."""
    scratch = WORK / "scratch" / f"replicas-{i}"
    if isinstance(request, Path):
        assert server.grpc_target is not None
        return run_grpc(name, f"replicas-{i}", rnd, TOOLS_PYTHON, server.grpc_target, request,
                        CONNECTIONS, 1.0, ns.seconds, scratch, server.root_pid(),
                        client_processes=1)  # fmt: skip
    model, body = request
    return run_wrk(name, f"replicas-{i}", rnd, server.infer_url(model), body, CONNECTIONS,
                   ns.seconds, scratch, server.root_pid())  # fmt: skip


def _drive(
    ns: argparse.Namespace, request: Path | tuple[str, HttpBody], name: str,
    targets: list[Server], rnd: int,
) -> tuple[float, int, float]:  # fmt: skip
    """Two clients at once, spread over ``targets``: summed req/s, errors, and the CPU the
    servers' trees used meanwhile (% of one core)."""
    with ThreadPoolExecutor(2) as pool:
        runs = list(
            pool.map(
                lambda i: _client(ns, request, name, rnd, i, targets[i % len(targets)]),
                range(2),
            )
        )
    for m in runs:
        if not m.ok:
            raise RuntimeError(f"{name}: {m.note}")
    # NOTE: each client measures the whole tree of the server it drives: a server that
    #   both clients drive is counted once.
    busy = sum(m.server_cpu_pct for m in runs[: len(targets)])
    return sum(m.rps for m in runs), sum(m.errors for m in runs), busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument(
        "--request",
        choices=sorted({*REQUESTS, *GRPC_REQUESTS}),
        default=None,
        help="http: tiny-json, tiny-binary (default), matmul-binary; grpc: tiny (default), matmul",
    )
    parser.add_argument("--triton", action="store_true", help="measure Triton too")
    parser.add_argument(
        "--oipserve",
        default=f"{sys.executable} -P -m oipserve",
        help="command that runs oipserve (default: this interpreter, this checkout)",
    )
    ns = parser.parse_args()
    known = GRPC_REQUESTS if ns.protocol == "grpc" else REQUESTS
    ns.request = ns.request or next(iter(known))
    if ns.request not in known:
        parser.error(f"--request {ns.request} is not one of {', '.join(known)} for {ns.protocol}")
    cases = build_models(WORK / "models")
    request: Path | tuple[str, HttpBody] = (
        grpc_spec(cases[GRPC_REQUESTS[ns.request]], WORK / "payloads")
        if ns.protocol == "grpc"
        else request_body(ns.request, cases)
    )
    # NOTE: -P keeps the current directory off sys.path; this checkout comes first instead.
    cmd = f"env PYTHONPATH={shlex.quote(str(BENCH.parent))} {ns.oipserve}"
    work = WORK / "replicas"
    configs: dict[str, list[Server]] = {}
    try:
        configs["one front, 2 workers"] = [
            start_oipserve(cmd, cases, work / "one", Tuning(instances=2))
        ]
        if ns.protocol == "http":
            configs["--http-workers 2, 2 workers"] = [
                start_oipserve(
                    cmd,
                    cases,
                    work / "http-workers",
                    Tuning(instances=2),
                    extra_args=["--http-workers", "2"],
                )
            ]
        configs["two servers, 1 worker each"] = [
            start_oipserve(cmd, cases, work / f"two-{i}", Tuning(instances=1)) for i in (0, 1)
        ]
        if ns.triton:
            configs["Triton"] = [start_triton(TRITON_VENV, cases, work / "triton", Tuning())]
        for name, servers in configs.items():
            failed = [s.error for s in servers if not s.http_url]
            if failed:
                raise RuntimeError(f"{name}: {failed[0]}")
        names = list(configs)
        results: dict[str, list[tuple[float, int, float]]] = {name: [] for name in names}
        for rnd in range(ns.rounds):
            for name in names if rnd % 2 == 0 else names[::-1]:
                results[name].append(_drive(ns, request, name, configs[name], rnd))
    finally:
        for servers in configs.values():
            for server in servers:
                server.stop()
    base = statistics.median(r[0] for r in results[names[0]])
    print(
        f"{ns.protocol} {ns.request}, 2 clients x c={CONNECTIONS}, "
        f"{ns.rounds} rounds of {ns.seconds} s:"
    )
    for name in names:
        rates = [r[0] for r in results[name]]
        rps = statistics.median(rates)
        busy = statistics.median(r[2] for r in results[name])
        print(
            f"{name:28s} req/s {rps:8,.0f} (range {min(rates):,.0f}-{max(rates):,.0f}), "
            f"{rps / base:.2f}x one front, errors {sum(r[1] for r in results[name])}; "
            f"servers busy {busy:.0f}%, {busy / 100 / rps * 1e6:.0f} us CPU a request"
        )


if __name__ == "__main__":
    main()
