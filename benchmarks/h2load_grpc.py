"""Sustained gRPC load from nghttp2's h2load, a load generator that is not ours: oipserve's
gRPC port against Triton's, interleaved rounds.

h2load speaks plain HTTP/2; it posts one canned gRPC ModelInfer body (the 5-byte message
prefix and the protobuf of the tiny ``simple`` request, built here with
``oipserve.grpc_generated``) with ``content-type: application/grpc`` and ``te: trailers``.
It counts HTTP statuses but cannot see trailers, so every run must be all 2xx, and before the
rounds each server gets one sanity call: ``nghttp -v`` with h2load's very headers (its
``grpc-status`` trailer must be 0), and a grpcio call with the same bytes whose outputs must
match the model's reference. CPU per request is the server tree's (front and workers apart,
the harness's ``cpu_snapshot`` / ``front_and_workers``) over the run, divided by h2load's
count.

    apt-get install -y nghttp2-client          # h2load and nghttp
    python benchmarks/h2load_grpc.py --rounds 3 --seconds 10 --loads 1x1,4x4
    python benchmarks/h2load_grpc.py --no-triton --json out.json

Triton is started as benchmarks/run.py starts it (``start_triton``: tritonserver 2.51 from the
nvidia-pytriton wheel in benchmarks/.venvs/triton, created here on first use); both servers
serve only ``simple`` with 2 instances. Results: benchmarks/results/2026-11-28-h2load-grpc.md.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from oipbench.models import ModelCase, build_models, write_oipserve_repo  # noqa: E402
from oipbench.procs import cpu_snapshot, front_and_workers, machine_cpu_pct  # noqa: E402
from oipbench.servers import Tuning, serve_from, start_triton  # noqa: E402
from oipbench.venvs import ensure_venv, host_onnxruntime_version, requirements  # noqa: E402

from oipserve.grpc_generated import grpc_service_pb2 as pb  # noqa: E402

WORK = BENCH / ".work" / "h2load"
METHOD = "/inference.GRPCInferenceService/ModelInfer"
HEADERS = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
MODEL = "simple"

_FINISHED = re.compile(r"finished in [\d.]+m?s, ([\d.]+) req/s")
_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored, (\d+) timeout"
)
_STATUSES = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")


@dataclass
class Row:
    """One h2load run against one server."""

    server: str
    load: str
    round: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    front_us: float
    workers_us: float
    h2load_cpu_pct: float
    machine_cpu_pct: float


@dataclass
class Target:
    """A started server: its gRPC host:port, the root of its process tree, how to stop it."""

    name: str
    grpc: str
    pid: int
    stop: Callable[[], None]


def canned_body(case: ModelCase, out: Path) -> Path:
    """The gRPC ModelInfer message h2load posts: prefix (uncompressed, length) + protobuf."""
    request = pb.ModelInferRequest(model_name=case.name)
    for name, values in case.inputs.items():
        request.inputs.add(name=name, datatype="INT32", shape=list(values.shape))
        request.raw_input_contents.append(values.astype("<i4").tobytes())
    message = request.SerializeToString()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"\0" + struct.pack(">I", len(message)) + message)
    return out


def sanity_call(target: Target, body: Path, case: ModelCase) -> None:
    """h2load sees statuses, not trailers: one call of the same bytes must end grpc-status 0
    (nghttp, h2load's headers) and answer the reference outputs (grpcio)."""
    url = f"http://{target.grpc}{METHOD}"
    seen = subprocess.run(
        ["nghttp", "-v", *HEADERS, "-d", str(body), url], capture_output=True, timeout=30
    ).stdout.decode(errors="replace")
    for needed in (":status: 200", "grpc-status: 0"):
        if needed not in seen:
            raise RuntimeError(f"{target.name}: no `{needed}` in nghttp's call:\n{seen[-2000:]}")
    with grpc.insecure_channel(target.grpc) as channel:
        raw = channel.unary_unary(METHOD)(body.read_bytes()[5:], timeout=30)
    reply = pb.ModelInferResponse.FromString(raw)
    got = {
        out.name: bytes(data)
        for out, data in zip(reply.outputs, reply.raw_output_contents, strict=True)
    }
    want = {name: values.astype("<i4").tobytes() for name, values in case.expected.items()}
    if got != want:
        raise RuntimeError(f"{target.name}: outputs {got} differ from the reference {want}")


def h2load(target: Target, body: Path, load: str, args: list[str], log: Path) -> dict[str, float]:
    """One h2load run; its counts checked (every request answered 2xx), its figures."""
    clients, streams = load.split("x")
    url = f"http://{target.grpc}{METHOD}"
    argv = ["h2load", "-c", clients, "-m", streams, *HEADERS, "-d", str(body), *args]
    done = subprocess.run(
        [*argv, "--log-file", str(log), url], capture_output=True, text=True, timeout=600
    )
    out = done.stdout
    finished, counts, statuses = (p.search(out) for p in (_FINISHED, _REQUESTS, _STATUSES))
    if done.returncode or not (finished and counts and statuses):
        raise RuntimeError(f"h2load failed ({done.returncode}):\n{out}\n{done.stderr}")
    _, _, answered, succeeded, failed, errored, timeout = map(int, counts.groups())
    ok = int(statuses.group(1))
    if failed or errored or timeout or not answered or ok != succeeded:
        raise RuntimeError(f"{target.name} {load}: not every request answered 2xx:\n{out}")
    durations = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines())
    return {
        "requests": ok,
        "rps": float(finished.group(1)),
        "p50_ms": durations[len(durations) // 2] / 1000,
        "p99_ms": durations[int(len(durations) * 0.99)] / 1000,
    }


def measure(target: Target, body: Path, load: str, rnd: int, seconds: float) -> Row:
    """A warm-up of a few hundred calls, then ``seconds`` of load with the CPU counted."""
    log = WORK / f"{target.name}-{load}.log"
    h2load(target, body, load, ["-n", "500"], log)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = cpu_snapshot(target.pid)
    got = h2load(target, body, load, ["-D", f"{seconds:g}"], log)
    after = cpu_snapshot(target.pid)
    spent = resource.getrusage(resource.RUSAGE_CHILDREN)
    front, workers = front_and_workers(before, after)
    client_s = spent.ru_utime + spent.ru_stime - children.ru_utime - children.ru_stime
    wall = after.at - before.at
    per = 1e6 / got["requests"]
    return Row(target.name, load, rnd, int(got["requests"]), got["rps"], got["p50_ms"],
               got["p99_ms"], front * per, workers * per, 100 * client_s / wall,
               machine_cpu_pct(before, after))  # fmt: skip


def start_oipserve(case: ModelCase, instances: int, http_workers: int) -> Target:
    repo = write_oipserve_repo({MODEL: case}, WORK / "repos" / "oipserve", instances,
                               Tuning(instances=instances).ort_params())  # fmt: skip
    args = ["--model-repository", str(repo), "--host", "127.0.0.1", "--http-port", "0",
            "--grpc-port", "0", "--devices", "cpu", "--instances-per-device", str(instances),
            "--http-workers", str(http_workers)]  # fmt: skip
    server = serve_from(BENCH.parent, args)
    return Target("oipserve", server.grpc, server.proc.pid, server.stop)


def start_triton_peer(case: ModelCase, instances: int) -> Target:
    """Triton as the harness starts it; its venv made (or reused) by the harness's code."""
    reqs = requirements(host_onnxruntime_version())["triton"]
    venv = ensure_venv("triton", reqs, WORK / "logs" / "venv-triton.log").parent.parent
    server = start_triton(venv, {MODEL: case}, WORK, Tuning(instances=instances))
    if server.proc is None or server.error or not server.grpc_target:
        if server.proc is not None:
            server.proc.stop()  # not ready in time: not left running
        raise RuntimeError(f"Triton did not start: {server.error}")
    return Target("triton", server.grpc_target, server.root_pid(), server.proc.stop)


def summary(rows: list[Row], loads: list[str], names: list[str]) -> str:
    """A markdown table of the medians over rounds, one row per load and server."""
    lines = [
        "| load | server | req/s | p50 ms | p99 ms | front µs/req | workers µs/req | "
        "h2load CPU | machine busy |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for load in loads:
        clients, streams = load.split("x")
        for name in names:
            got = [r for r in rows if r.load == load and r.server == name]
            if not got:
                continue
            m = {f: statistics.median(getattr(r, f) for r in got) for f in asdict(got[0])
                 if isinstance(getattr(got[0], f), float)}  # fmt: skip
            lines.append(
                f"| -c {clients} -m {streams} | {name} | {m['rps']:,.0f} | {m['p50_ms']:.2f} | "
                f"{m['p99_ms']:.2f} | {m['front_us']:.0f} | {m['workers_us']:.0f} | "
                f"{m['h2load_cpu_pct']:.0f} % | {m['machine_cpu_pct']:.0f} % |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--loads", default="1x1,4x4", help="CLIENTSxSTREAMS,... (h2load -c, -m)")
    parser.add_argument("--instances", type=int, default=2, help="model instances, both servers")
    parser.add_argument("--http-workers", type=int, default=1, help="oipserve's HTTP fronts")
    parser.add_argument("--no-triton", action="store_true", help="oipserve only")
    parser.add_argument("--json", type=Path, help="write every run here")
    ns = parser.parse_args()
    for tool in ("h2load", "nghttp"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} not found: apt-get install -y nghttp2-client")
    loads = ns.loads.split(",")
    case = build_models(WORK / "models")[MODEL]
    body = canned_body(case, WORK / "simple.grpc")
    targets: list[Target] = []
    rows: list[Row] = []
    try:
        targets.append(start_oipserve(case, ns.instances, ns.http_workers))
        if not ns.no_triton:
            try:
                targets.append(start_triton_peer(case, ns.instances))
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                print(f"Triton not measured: {exc}", flush=True)
        for target in targets:
            sanity_call(target, body, case)
        for rnd in range(ns.rounds):
            for load in loads:
                for target in targets if rnd % 2 == 0 else targets[::-1]:
                    row = measure(target, body, load, rnd, ns.seconds)
                    rows.append(row)
                    print(f"round {rnd} {load} {target.name}: {row.rps:,.0f} req/s, "
                          f"p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms, front "
                          f"{row.front_us:.0f} us, workers {row.workers_us:.0f} us a request, "
                          f"h2load {row.h2load_cpu_pct:.0f} %, machine "
                          f"{row.machine_cpu_pct:.0f} %", flush=True)  # fmt: skip
    finally:
        for target in targets:
            target.stop()
    if ns.json:
        ns.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(f"\nmedians of {ns.rounds} rounds of {ns.seconds:g} s:\n")
    print(summary(rows, loads, [t.name for t in targets]))


if __name__ == "__main__":
    main()
