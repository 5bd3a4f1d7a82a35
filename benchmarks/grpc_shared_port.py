"""gRPC on the HTTP port (h2c, issue #39 item 3) against the dedicated gRPC port, and REST
on the HTTP port before and after that change.

1. gRPC: one server; tiny unary ModelInfer (``simple``) through the HTTP port and through
   the gRPC port, alternated within each round (the order swapped every round), with the
   harness's gRPC client. Calls/s, latency and the front's CPU per call (/proc).
2. REST (``--baseline TREE``): a server from TREE (the code before) and one from this tree,
   both running, tiny JSON infer with wrk, alternated the same way; requests/s, latency
   and the front's CPU per request.

3. ``--sequential N``: N tiny ModelInfer calls in a loop from one tritonclient.grpc client
   per port (this process, no load generator beside it), the ports alternated each round;
   the front's CPU and the wall time per call. The steadiest of the three on a busy machine.

On 2 shared cores calls/s is noisy; CPU per call is the steadier figure. Medians over
rounds are printed, with the ratio (shared / dedicated, after / before).

    python benchmarks/grpc_shared_port.py --rounds 5 --baseline /tmp/base

Needs benchmarks/.work (payloads and the oipserve repository): a prior
``benchmarks/run.py`` run, or ``benchmarks/grpc_front_cpu.py --prepare``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.load import Measurement, run_grpc, run_wrk  # noqa: E402
from oipbench.payloads import HttpBody  # noqa: E402
from oipbench.procs import cpu_snapshot  # noqa: E402
from oipbench.servers import SourceServer, serve_from  # noqa: E402

WORK = BENCH / ".work"
PAYLOADS = WORK / "payloads"
REPOSITORY = WORK / "repos" / "oipserve"


@dataclass
class Row:
    what: str  # "grpc:http-port", "grpc:grpc-port", "rest:before", "rest:after"
    concurrency: int
    rate: float
    p50_ms: float
    p99_ms: float
    front_us: float


def _start(code: Path, instances: int) -> SourceServer:
    args = ["--model-repository", str(REPOSITORY), "--http-port", "0", "--grpc-port", "0",
            "--devices", "cpu", "--instances-per-device", str(instances)]  # fmt: skip
    return serve_from(code, args)


def _front_us(server: SourceServer, before: float, requests: int) -> float:
    """The front's own CPU (not its workers') per request since ``before``, in µs."""
    after = cpu_snapshot(server.proc.pid).per_pid[server.proc.pid][1]
    return (after - before) / max(requests, 1) * 1e6


def _front_cpu(server: SourceServer) -> float:
    return cpu_snapshot(server.proc.pid).per_pid[server.proc.pid][1]


def _grpc(server: SourceServer, target: str, c: int, seconds: float, scratch: Path) -> Row:
    before = _front_cpu(server)
    m = run_grpc("front", f"tiny-c{c}", 0, Path(sys.executable), target,
                 PAYLOADS / "simple.grpc.json", c, 1, seconds, scratch, server.proc.pid,
                 client_processes=min(2, c))  # fmt: skip
    return _row(m, server, before, c)


def _rest(server: SourceServer, c: int, seconds: float, scratch: Path) -> Row:
    body = HttpBody(PAYLOADS / "simple.json", "application/json", None)
    before = _front_cpu(server)
    url = f"http://{server.http}/v2/models/simple/infer"
    m = run_wrk("front", f"tiny-json-c{c}", 0, url, body, c, int(seconds), scratch,
                server.proc.pid)  # fmt: skip
    return _row(m, server, before, c)


def _row(m: Measurement, server: SourceServer, before: float, c: int) -> Row:
    if not m.ok or not m.requests or m.errors:
        raise RuntimeError(f"c={c}: {m.note or m.errors}")
    return Row("", c, m.rps, m.p50_ms, m.p99_ms, _front_us(server, before, m.requests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="source tree of the code before (REST A/B)")
    parser.add_argument("--sequential", type=int, default=0, help="calls per sequential run")
    ns = parser.parse_args()
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    levels = [int(c) for c in ns.concurrency.split(",")]
    rows: list[Row] = []
    after = _start(BENCH.parent, ns.instances)
    before = _start(ns.baseline, ns.instances) if ns.baseline else None
    try:
        if ns.sequential:
            _sequential(after, ns.rounds, ns.sequential)
        for rnd in range(ns.rounds):
            for c in levels:
                ways = [("grpc:http-port", after.http), ("grpc:grpc-port", after.grpc)]
                for what, target in ways if rnd % 2 == 0 else ways[::-1]:
                    rows.append(_named(what, _grpc(after, target, c, ns.seconds, scratch)))
                if before is None:
                    continue
                trees = [("rest:before", before), ("rest:after", after)]
                for what, server in trees if rnd % 2 == 0 else trees[::-1]:
                    rows.append(_named(what, _rest(server, c, ns.seconds, scratch)))
    finally:
        after.stop()
        if before is not None:
            before.stop()
    _summary(rows, levels)


def _sequential(server: SourceServer, rounds: int, calls: int) -> None:
    """Tiny calls one after another on each port from this process: front CPU per call."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        tensors.append(tensor)
    ports = {"http-port": server.http, "grpc-port": server.grpc}
    clients = {what: grpcclient.InferenceServerClient(target) for what, target in ports.items()}
    seen: dict[str, list[tuple[float, float]]] = {what: [] for what in ports}
    try:
        for client in clients.values():
            for _ in range(200):  # warm up
                client.infer("simple", tensors)
        for rnd in range(rounds):
            for what in list(ports) if rnd % 2 == 0 else list(ports)[::-1]:
                cpu = _front_cpu(server)
                started = time.perf_counter()
                for _ in range(calls):
                    clients[what].infer("simple", tensors)
                wall = (time.perf_counter() - started) / calls * 1e6
                seen[what].append((_front_us(server, cpu, calls), wall))
                print(f"sequential {what}: front {seen[what][-1][0]:.0f} us/call, "
                      f"wall {wall:.0f} us/call", flush=True)  # fmt: skip
    finally:
        for client in clients.values():
            client.close()
    med = {w: [statistics.median(x[i] for x in got) for i in (0, 1)] for w, got in seen.items()}
    for what, (front, wall) in med.items():
        print(f"sequential {what} median: front {front:.0f} us/call, wall {wall:.0f} us/call")
    http, grpc = med["http-port"], med["grpc-port"]
    print(f"sequential ratio http-port / grpc-port: front CPU {http[0] / grpc[0]:.3f}, "
          f"wall {http[1] / grpc[1]:.3f}\n", flush=True)  # fmt: skip


def _named(what: str, row: Row) -> Row:
    row.what = what
    print(f"{what:15} c={row.concurrency:<3} {row.rate:8,.0f}/s  p50 {row.p50_ms:.2f} ms  "
          f"p99 {row.p99_ms:.2f} ms  front {row.front_us:.0f} us/request", flush=True)  # fmt: skip
    return row


def _summary(rows: list[Row], levels: list[int]) -> None:
    print("\nmedians over rounds (ratio: the first of each pair over the second)")
    for first, second in (("grpc:http-port", "grpc:grpc-port"), ("rest:after", "rest:before")):
        for c in levels:
            med = {}
            for what in (first, second):
                got = [r for r in rows if r.what == what and r.concurrency == c]
                if not got:
                    break
                med[what] = {
                    f: statistics.median(getattr(r, f) for r in got)
                    for f in ("rate", "p50_ms", "p99_ms", "front_us")
                }
            if len(med) < 2:
                continue
            for what in (first, second):
                m = med[what]
                print(f"{what:15} c={c:<3} {m['rate']:8,.0f}/s  p50 {m['p50_ms']:.2f} ms  "
                      f"p99 {m['p99_ms']:.2f} ms  front {m['front_us']:.0f} us")  # fmt: skip
            a, b = med[first], med[second]
            print(f"{'ratio':15} c={c:<3} rate {a['rate'] / b['rate']:.3f}  "
                  f"p50 {a['p50_ms'] / b['p50_ms']:.3f}  "
                  f"front CPU/request {a['front_us'] / b['front_us']:.3f}\n")  # fmt: skip


if __name__ == "__main__":
    main()
