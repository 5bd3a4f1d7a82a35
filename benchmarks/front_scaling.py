"""Requests/s over ``--http-workers N``: the front's scaling curve on a many-core node.

One Python front is one core's worth of protocol work; ``--http-workers N`` runs N fronts
over one worker pool (docs/scaling.md). On this project's 2-core VM no core is free for
a third front, so the curve itself needs a node with cores to spare (the `device` tool's
machines have 16). This drives one server per N, all started at once from the same build,
with the same clients in turn (order reversed every other round), and prints the medians
of requests/s, p50 and p99, and the CPU a request of the fronts (summed) and the workers.

Scenarios are ``<json|binary|grpc>:<concurrency>`` on the tiny model (``simple``): REST
with wrk (``--wrk-threads`` event loops), gRPC with the harness's client
(``--client-processes`` processes).

    python benchmarks/front_scaling.py --rounds 3                        # 2 cores: 1 and 2
    python benchmarks/front_scaling.py --prepare --modes 1,2,4,8 --instances 4 \\
        --scenarios json:64,binary:64,grpc:64 --wrk-threads 4 --client-processes 6 \\
        --rounds 2 --seconds 4 --json out.json                          # a 16-core node

On a lent machine (bare: no wrk, and of oipserve's dependencies only those its image
holds): carry the missing ones as wheels and a wrk binary with its LuaJIT, and put them
on ``PYTHONPATH``, ``PATH`` and ``LD_LIBRARY_PATH`` (docs/scaling.md, "Measuring the
curve on a lent machine", has the commands); ``--prepare`` builds the models (onnx
needed). Four modes, three scenarios and two rounds of 4 s take about 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.load import (  # noqa: E402
    Measurement,
    concurrency_specs,
    medians,
    run_grpc,
    run_wrk,
)
from oipbench.models import build_models, write_oipserve_repo  # noqa: E402
from oipbench.payloads import HttpBody, binary_body, grpc_spec, json_body  # noqa: E402
from oipbench.servers import SourceServer, Tuning, serve_from  # noqa: E402

WORK = BENCH / ".work"
PAYLOADS = WORK / "payloads"
REPOSITORY = WORK / "repos" / "oipserve"
MODEL = "simple"
PROTOCOLS = ("json", "binary", "grpc")


@dataclass
class Row:
    http_workers: int
    scenario: str
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    front_us: float
    workers_us: float
    client_cpu_pct: float
    errors: int


def _start(http_workers: int, instances: int) -> SourceServer:
    args = ["--model-repository", str(REPOSITORY), "--host", "127.0.0.1", "--http-port", "0",
            "--grpc-port", "0", "--devices", "cpu", "--instances-per-device", str(instances),
            "--http-workers", str(http_workers)]  # fmt: skip
    return serve_from(BENCH.parent, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="1,2", help="--http-workers values to compare")
    parser.add_argument("--scenarios", default="json:16,grpc:16",
                        help="<json|binary|grpc>:<concurrency>,...")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--instances", type=int, default=2, help="ORT workers per model")
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--client-processes", type=int, default=2, help="gRPC client's")
    parser.add_argument("--prepare", action="store_true", help="(re)build benchmarks/.work")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    ns = parser.parse_args()
    modes = [int(m) for m in ns.modes.split(",")]
    scenarios = concurrency_specs(ns.scenarios, PROTOCOLS)
    # The models, the repository and the tiny model's bodies, as `benchmarks/run.py`
    # writes them (the repository only when asked, or missing).
    cases = build_models(WORK / "models")
    if ns.prepare or not REPOSITORY.exists():
        tuning = Tuning(instances=ns.instances)
        write_oipserve_repo(cases, REPOSITORY, ns.instances, tuning.ort_params())
    case = cases[MODEL]
    bodies = {
        "json": json_body(case, PAYLOADS / f"{MODEL}.json"),
        "binary": binary_body(case, PAYLOADS / f"{MODEL}.bin"),
    }
    spec = grpc_spec(case, PAYLOADS)
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    servers: dict[int, SourceServer] = {}
    rows: list[Row] = []
    try:
        for mode in modes:
            servers[mode] = _start(mode, ns.instances)
        for rnd in range(ns.rounds):
            for protocol, concurrency in scenarios:
                scenario = f"{protocol}-c{concurrency}"
                for mode in modes if rnd % 2 == 0 else modes[::-1]:
                    server = servers[mode]
                    m = _measure(ns, server, mode, protocol, concurrency, scenario, rnd,
                                 bodies, spec, scratch)  # fmt: skip
                    if not m.ok or not m.requests:
                        raise RuntimeError(f"--http-workers {mode}, {scenario}: {m.note}")
                    row = Row(mode, scenario, rnd, m.rps, m.p50_ms, m.p99_ms,
                              *m.cpu_us_per_request(), m.client_cpu_pct, m.errors)  # fmt: skip
                    rows.append(row)
                    print(f"round {rnd} {scenario} --http-workers {mode}: {m.rps:,.0f} req/s, "
                          f"p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, CPU a request: "
                          f"fronts {row.front_us:.0f} us, workers {row.workers_us:.0f} us, "
                          f"client {m.client_cpu_pct:.0f} %, errors {m.errors}",
                          flush=True)  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    if ns.json:
        ns.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    _summary(rows, modes, scenarios)


def _measure(
    ns: argparse.Namespace,
    server: SourceServer,
    http_workers: int,
    protocol: str,
    concurrency: int,
    scenario: str,
    rnd: int,
    bodies: dict[str, HttpBody],
    spec: Path,
    scratch: Path,
) -> Measurement:
    label = f"http-workers={http_workers}"
    pid = server.proc.pid
    if protocol == "grpc":
        return run_grpc(label, scenario, rnd, Path(sys.executable), server.grpc, spec,
                        concurrency, 0, ns.seconds, scratch, pid,
                        client_processes=ns.client_processes)  # fmt: skip
    return run_wrk(label, scenario, rnd, f"http://{server.http}/v2/models/{MODEL}/infer",
                   bodies[protocol], concurrency, ns.seconds, scratch, pid,
                   threads=ns.wrk_threads)  # fmt: skip


def _summary(rows: list[Row], modes: list[int], scenarios: list[tuple[str, int]]) -> None:
    """Medians over rounds, one line per scenario and mode, req/s relative to the first."""
    print()
    for protocol, concurrency in scenarios:
        scenario = f"{protocol}-c{concurrency}"
        base = None
        for mode in modes:
            got = [r for r in rows if r.scenario == scenario and r.http_workers == mode]
            med = medians(got, ("rps", "p50_ms", "p99_ms", "front_us", "workers_us"))
            base = base or med["rps"]
            print(
                f"{scenario:10} --http-workers {mode}: {med['rps']:8,.0f} req/s "
                f"({med['rps'] / base:.2f}x)  p50 {med['p50_ms']:.2f} ms  "
                f"p99 {med['p99_ms']:.2f} ms   CPU a request: fronts {med['front_us']:4.0f} us, "
                f"workers {med['workers_us']:4.0f} us, errors {sum(r.errors for r in got)}"
            )


if __name__ == "__main__":
    main()
