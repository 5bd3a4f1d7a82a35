"""gRPC calls/s and CPU per call, gRPC in the front against ``--grpc-processes N``.

What ``--grpc-processes`` is for: the front's core is the limit of one server's gRPC
calls/s on a node with cores to spare, and a gRPC process takes grpc.aio's share of
each call off it. On a 2-core machine calls/s cannot show that (no core is free); the
front's CPU time per call can: one front core allows about 1e6 / (front µs per call)
calls/s. On a many-core node the calls/s curve over N is the measurement itself.

One server per mode (same build, the benchmark repository) runs at once; every round
drives each mode in turn, order reversed every other round, with the harness's gRPC
client; CPU times come from /proc for the front, its gRPC processes and its workers
separately.

    python benchmarks/grpc_front_cpu.py --rounds 4                  # 2 cores: 0 against 1
    python benchmarks/grpc_front_cpu.py --prepare --modes 0,1,2,4 --instances 4 \\
        --client-processes 6 --scenarios tiny:16,tiny:64,mib:16 --json out.json  # many cores

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
from oipbench.procs import CpuSnapshot, cpu_snapshot  # noqa: E402
from oipbench.servers import SourceServer, serve_from  # noqa: E402

WORK = BENCH / ".work"
PAYLOADS = WORK / "payloads"
REPOSITORY = WORK / "repos" / "oipserve"
# scenario name -> (model, request payload bytes for MB/s; 0: report calls/s only)
MODELS = {"tiny": ("simple", 0), "mib": ("identity_fp32", 1 << 20)}


@dataclass
class Row:
    mode: int
    scenario: str
    round: int
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    front_us: float
    grpc_processes_us: float
    workers_us: float
    client_cpu_pct: float


def _spent(before: CpuSnapshot, after: CpuSnapshot, front: int) -> tuple[float, float, float]:
    """CPU seconds of the front, of its gRPC processes and of its workers in between."""
    grpc_pids = {pid for pid in after.per_pid if _is_grpc_process(pid)}
    spent = {
        pid: seconds - before.per_pid.get(pid, ("", 0.0))[1]
        for pid, (_, seconds) in after.per_pid.items()
    }
    in_grpc = sum(s for pid, s in spent.items() if pid in grpc_pids)
    workers = sum(s for pid, s in spent.items() if pid != front and pid not in grpc_pids)
    return spent.get(front, 0.0), in_grpc, workers


def _is_grpc_process(pid: int) -> bool:
    try:
        return b"oipserve.grpc_process" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _prepare(instances: int) -> None:
    """Models, gRPC specs and the oipserve repository, as `benchmarks/run.py` writes them."""
    from oipbench.models import build_models, write_oipserve_repo
    from oipbench.payloads import grpc_spec
    from oipbench.servers import Tuning

    cases = build_models(WORK / "models")
    for case in cases.values():
        grpc_spec(case, PAYLOADS)
    write_oipserve_repo(cases, REPOSITORY, instances, Tuning(instances=instances).ort_params())


def _start(processes: int, instances: int) -> SourceServer:
    args = ["--model-repository", str(REPOSITORY), "--http-port", "0", "--grpc-port", "0",
            "--devices", "cpu", "--instances-per-device", str(instances),
            "--grpc-processes", str(processes)]  # fmt: skip
    return serve_from(BENCH.parent, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--modes", default="0,1", help="--grpc-processes values to compare")
    parser.add_argument("--scenarios", default="tiny:16", help="<tiny|mib>:<concurrency>,...")
    parser.add_argument("--instances", type=int, default=2, help="ORT workers per model")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--prepare", action="store_true", help="build benchmarks/.work first")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    ns = parser.parse_args()
    if ns.prepare:
        _prepare(ns.instances)
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    modes = [int(m) for m in ns.modes.split(",")]
    scenarios = concurrency_specs(ns.scenarios, MODELS)
    servers = {mode: _start(mode, ns.instances) for mode in modes}
    rows: list[Row] = []
    try:
        for rnd in range(ns.rounds):
            for name, concurrency in scenarios:
                model, payload_bytes = MODELS[name]
                for mode in modes if rnd % 2 == 0 else modes[::-1]:
                    server = servers[mode]
                    proc, target = server.proc, server.grpc
                    before = cpu_snapshot(proc.pid)
                    m = run_grpc(f"processes={mode}", f"{name}-c{concurrency}", rnd,
                                 Path(sys.executable), target,
                                 PAYLOADS / f"{model}.grpc.json", concurrency, 0, ns.seconds,
                                 scratch, proc.pid, payload_bytes,
                                 client_processes=ns.client_processes)  # fmt: skip
                    front, in_grpc, workers = _spent(before, cpu_snapshot(proc.pid), proc.pid)
                    if not m.ok or not m.requests:
                        raise RuntimeError(f"--grpc-processes {mode}: {m.note}")
                    us = [x / m.requests * 1e6 for x in (front, in_grpc, workers)]
                    row = Row(mode, f"{name}-c{concurrency}", rnd, m.rps, m.p50_ms, m.p99_ms,
                              *us, m.client_cpu_pct)  # fmt: skip
                    rows.append(row)
                    print(f"round {rnd} {row.scenario} --grpc-processes {mode}: "
                          f"{m.rps:,.0f} calls/s, p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, "
                          f"CPU per call front {us[0]:.0f} us, gRPC processes {us[1]:.0f} us, "
                          f"workers {us[2]:.0f} us, client {m.client_cpu_pct:.0f} %",
                          flush=True)  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    if ns.json:
        ns.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    _summary(rows, modes, scenarios)


def _summary(rows: list[Row], modes: list[int], scenarios: list[tuple[str, int]]) -> None:
    """Medians over rounds, one line per scenario and mode, calls/s relative to mode 0."""
    print()
    for name, concurrency in scenarios:
        scenario = f"{name}-c{concurrency}"
        base = None
        for mode in modes:
            got = [r for r in rows if r.scenario == scenario and r.mode == mode]
            med = medians(got, ("calls_per_s", "p50_ms", "p99_ms", "front_us",
                                "grpc_processes_us", "workers_us"))  # fmt: skip
            base = base or med["calls_per_s"]
            print(
                f"{scenario:10} --grpc-processes {mode}: {med['calls_per_s']:8,.0f} calls/s "
                f"({med['calls_per_s'] / base:.2f}x)  p50 {med['p50_ms']:.2f} ms  "
                f"p99 {med['p99_ms']:.2f} ms   CPU per call: front {med['front_us']:4.0f} us, "
                f"gRPC processes {med['grpc_processes_us']:4.0f} us, "
                f"workers {med['workers_us']:4.0f} us  "
                f"(one front core: ~{1e6 / med['front_us']:,.0f} calls/s)"
            )


if __name__ == "__main__":
    main()
