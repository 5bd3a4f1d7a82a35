"""CPU per gRPC call of the front, with gRPC in the front and with ``--grpc-processes``.

What ``--grpc-processes`` is for: the front's core is the limit of one server's gRPC
calls/s on a node with cores to spare, and a gRPC process takes grpc.aio's share of
each call off it. Calls/s on this 2-core machine cannot show that (no core is free);
the front's CPU time per call can: one front core allows about 1e6 / (front µs per
call) calls/s. Both servers (same build, the benchmark repository that
`benchmarks/run.py` writes) run at once and are driven in turn, order reversed every
other round, by the harness's gRPC client (tiny ``simple`` request, c=16); CPU times
come from /proc for the front, its gRPC processes and its workers separately.

    python benchmarks/grpc_front_cpu.py --rounds 4

Needs a prior `benchmarks/run.py` run (for benchmarks/.work/).
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

from oipbench.load import run_grpc  # noqa: E402
from oipbench.procs import CpuSnapshot, cpu_snapshot  # noqa: E402

WORK = BENCH / ".work"
SPEC = WORK / "payloads" / "simple.grpc.json"


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


def _start(processes: int) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent), "OIPSERVE_METRICS_PORT": "0"}
    argv = [sys.executable, "-P", "-m", "oipserve", "serve", "--model-repository",
            str(WORK / "repos" / "oipserve"), "--http-port", "0", "--grpc-port", "0",
            "--instances-per-device", "2", "--grpc-processes", str(processes)]  # fmt: skip
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"grpc=(\S+)", line)
        if match and "ready" in line:
            return proc, match.group(1)
    raise RuntimeError(f"--grpc-processes {processes}: the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--processes", type=int, default=1, help="--grpc-processes to compare")
    ns = parser.parse_args()
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    modes = [0, ns.processes]
    servers = {mode: _start(mode) for mode in modes}
    rows: dict[int, list[tuple[float, float, float, float]]] = {mode: [] for mode in modes}
    try:
        for rnd in range(ns.rounds):
            for mode in modes if rnd % 2 == 0 else modes[::-1]:
                proc, target = servers[mode]
                before = cpu_snapshot(proc.pid)
                m = run_grpc(f"processes={mode}", "tiny-grpc-c16", rnd, Path(sys.executable),
                             target, SPEC, 16, 0, ns.seconds, scratch, proc.pid)  # fmt: skip
                front, in_grpc, workers = _spent(before, cpu_snapshot(proc.pid), proc.pid)
                if not m.ok or not m.requests:
                    raise RuntimeError(f"--grpc-processes {mode}: {m.note}")
                per_call = [x / m.requests * 1e6 for x in (front, in_grpc, workers)]
                rows[mode].append((m.rps, *per_call))
                print(f"round {rnd} --grpc-processes {mode}: {m.rps:,.0f} calls/s, CPU per call "
                      f"front {per_call[0]:.0f} us, gRPC processes {per_call[1]:.0f} us, "
                      f"workers {per_call[2]:.0f} us", flush=True)  # fmt: skip
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    print()
    for mode, results in rows.items():
        rps, front, in_grpc, workers = (statistics.median(r[i] for r in results) for i in range(4))
        print(
            f"--grpc-processes {mode}: {rps:8,.0f} calls/s   CPU per call: front {front:4.0f} us, "
            f"gRPC processes {in_grpc:4.0f} us, workers {workers:4.0f} us   "
            f"(one front core: ~{1e6 / front:,.0f} calls/s)"
        )


if __name__ == "__main__":
    main()
