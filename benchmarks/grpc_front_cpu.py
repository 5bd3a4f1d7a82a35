"""gRPC calls/s and the server's CPU per call: the front's and its workers'.

On a machine with no core to spare (2 cores) calls/s cannot show what a call costs the
front; its CPU time per call can: one front core allows about 1e6 / (front µs per call)
calls/s. (The calls/s curve over ``--http-workers N`` on a many-core node is
``front_scaling.py``'s.)

One server (the benchmark repository) is driven ``--rounds`` times per scenario with the
harness's gRPC client; CPU times come from /proc for the front and its workers
separately; the medians over rounds are printed. It starts one front unless told
``--http-workers N`` (then "front" is all N together: the server's own default, ``auto``,
is two fronts on 2 cores, which until 2026-11-28 this counted as the front and a worker).

    python benchmarks/grpc_front_cpu.py --rounds 4                  # 2 cores
    python benchmarks/grpc_front_cpu.py --prepare --instances 4 \\
        --client-processes 6 --scenarios tiny:16,tiny:64,mib:16 --json out.json  # many cores

Until issue #36 it compared gRPC in the front against ``--grpc-processes N`` (removed:
docs/grpc.md, "History"; results/2026-11-27-grpc-front-cpu.md).

Needs the benchmark repository and payloads in benchmarks/.work/: a prior
`benchmarks/run.py` run writes them, or ``--prepare`` builds them (onnx needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.load import concurrency_specs, medians, run_grpc  # noqa: E402
from oipbench.servers import SourceServer, serve_from  # noqa: E402

WORK = BENCH / ".work"
PAYLOADS = WORK / "payloads"
REPOSITORY = WORK / "repos" / "oipserve"
# scenario name -> (model, request payload bytes for MB/s; 0: report calls/s only)
MODELS = {"tiny": ("simple", 0), "mib": ("identity_fp32", 1 << 20)}


@dataclass
class Row:
    scenario: str
    round: int
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    front_us: float
    workers_us: float
    client_cpu_pct: float


def _prepare(instances: int) -> None:
    """Models, gRPC specs and the oipserve repository, as `benchmarks/run.py` writes them."""
    from oipbench.models import build_models, write_oipserve_repo
    from oipbench.payloads import grpc_spec
    from oipbench.servers import Tuning

    cases = build_models(WORK / "models")
    for case in cases.values():
        grpc_spec(case, PAYLOADS)
    write_oipserve_repo(cases, REPOSITORY, instances, Tuning(instances=instances).ort_params())


def _start(instances: int, http_workers: int) -> SourceServer:
    args = ["--model-repository", str(REPOSITORY), "--http-port", "0", "--grpc-port", "0",
            "--devices", "cpu", "--instances-per-device", str(instances),
            "--http-workers", str(http_workers)]  # fmt: skip
    return serve_from(BENCH.parent, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--scenarios", default="tiny:16", help="<tiny|mib>:<concurrency>,...")
    parser.add_argument("--instances", type=int, default=2, help="ORT workers per model")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument(
        "--http-workers", type=int, default=1, help="fronts (their CPU is summed as the front's)"
    )
    parser.add_argument("--prepare", action="store_true", help="build benchmarks/.work first")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    ns = parser.parse_args()
    if ns.prepare:
        _prepare(ns.instances)
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    scenarios = concurrency_specs(ns.scenarios, MODELS)
    server = _start(ns.instances, ns.http_workers)
    proc, target = server.proc, server.grpc
    rows: list[Row] = []
    try:
        for rnd in range(ns.rounds):
            for name, concurrency in scenarios:
                model, payload_bytes = MODELS[name]
                m = run_grpc("front", f"{name}-c{concurrency}", rnd, Path(sys.executable),
                             target, PAYLOADS / f"{model}.grpc.json", concurrency, 0, ns.seconds,
                             scratch, proc.pid, payload_bytes,
                             client_processes=ns.client_processes)  # fmt: skip
                if not m.ok or not m.requests:
                    raise RuntimeError(f"{name}-c{concurrency}: {m.note}")
                us = m.cpu_us_per_request()
                row = Row(f"{name}-c{concurrency}", rnd, m.rps, m.p50_ms, m.p99_ms, *us,
                          m.client_cpu_pct)  # fmt: skip
                rows.append(row)
                print(f"round {rnd} {row.scenario}: "
                      f"{m.rps:,.0f} calls/s, p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, "
                      f"CPU per call front {us[0]:.0f} us, workers {us[1]:.0f} us, "
                      f"client {m.client_cpu_pct:.0f} %", flush=True)  # fmt: skip
    finally:
        server.stop()
    if ns.json:
        ns.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    _summary(rows, scenarios)


def _summary(rows: list[Row], scenarios: list[tuple[str, int]]) -> None:
    """Medians over rounds, one line per scenario."""
    print()
    for name, concurrency in scenarios:
        scenario = f"{name}-c{concurrency}"
        got = [r for r in rows if r.scenario == scenario]
        med = medians(got, ("calls_per_s", "p50_ms", "p99_ms", "front_us", "workers_us"))
        print(
            f"{scenario:10}: {med['calls_per_s']:8,.0f} calls/s  p50 {med['p50_ms']:.2f} ms  "
            f"p99 {med['p99_ms']:.2f} ms   CPU per call: front {med['front_us']:4.0f} us, "
            f"workers {med['workers_us']:4.0f} us  "
            f"(one front core: ~{1e6 / med['front_us']:,.0f} calls/s)"
        )


if __name__ == "__main__":
    main()
