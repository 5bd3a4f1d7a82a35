"""Front CPU per gRPC call: our HTTP/2 (``oipserve.front.grpc.h2``) against python-hyper's
``h2`` under the same interface (``benchmarks/h2_base/connection.py``), in one
interleaved run (issue 37, item 1: the base decision).

Every server is the front's gRPC listener and call layer (``H2Server``, ``call.Call``)
with a method table answering ``ModelInfer`` with a canned reply (no model, no data
plane), as ``grpc_server_shapes.py``'s ``h2`` shape: the figures are the gRPC machinery
alone, and the servers differ only in the connection class:

- ``ours``: ``oipserve.front.grpc.h2.connection.Connection``.
- ``h2lib``: ``H2LibConnection``, h2 as configured by default (inbound and outbound
  header validation, header_encoding None).
- ``h2tuned``: the same without h2's checks of the headers we send.
- ``h2best``: ``h2tuned`` with h2's per-frame ``repr`` patched out (``skip_frame_reprs``).

Cases:

- ``tiny-c1`` / ``tiny-c16``: the ``simple`` request (two 64-byte inputs), the tiny reply.
- ``mib-c4``: a 1 MiB input in, a 1 MiB output back.

Each case drives each server in turn with ``oipbench/grpc_client.py`` (the harness's gRPC
client), the order alternating by round. The server counts its calls and reads its own
CPU time (``time.process_time``) at the start and end of a window inside the client's
load, so a client slow to start on a busy machine cannot skew the figure. The table gives
the medians over rounds and the median of the per-round ratios to ``ours``.

    python benchmarks/h2_base/compare.py --rounds 5 --seconds 3
    python benchmarks/h2_base/compare.py --profile h2lib --case tiny-c16   # cProfile top

Results and the decision: ``benchmarks/results/2026-11-28-h2-base.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

from grpc_server_shapes import REPLY, _free_port, _start  # noqa: E402

SHAPES = ("ours", "h2lib", "h2tuned", "h2best")
MIB = 1024 * 1024
#: A ModelInferResponse with one 1 MiB raw output (field 6, length-delimited).
BIG_REPLY = b"\x0a\x0didentity_fp32\x32\x80\x80\x40" + bytes(MIB)
#: case -> (inputs: name, datatype, shape, bytes), concurrency.
CASES: dict[str, tuple[list[tuple[str, str, list[int], int]], int]] = {
    "tiny-c1": ([("INPUT0", "INT32", [1, 16], 64), ("INPUT1", "INT32", [1, 16], 64)], 1),
    "tiny-c16": ([("INPUT0", "INT32", [1, 16], 64), ("INPUT1", "INT32", [1, 16], 64)], 16),
    "mib-c4": ([("INPUT0", "FP32", [1, MIB // 4], MIB)], 4),
}


async def _serve(shape: str, port: int, profiler: cProfile.Profile | None = None) -> None:
    from oipserve.config.settings import Settings
    from oipserve.front.grpc import listener
    from oipserve.front.grpc.call_table import CallTable
    from oipserve.front.grpc.rpcs import Method

    if shape == "h2lib":
        from benchmarks.h2_base.connection import H2LibConnection

        listener.Connection = H2LibConnection  # type: ignore[misc,assignment]
    elif shape in ("h2tuned", "h2best"):
        from benchmarks.h2_base.connection import H2LibTunedConnection, skip_frame_reprs

        listener.Connection = H2LibTunedConnection  # type: ignore[misc,assignment]
        if shape == "h2best":
            skip_frame_reprs()

    calls = [0]

    async def answer(request: bytes) -> bytes:
        calls[0] += 1
        return BIG_REPLY if len(request) >= MIB else REPLY

    def report() -> None:
        print(f"{calls[0]} {time.process_time()} {time.monotonic()}", flush=True)

    async def no_stream(request: object) -> bytes:
        raise NotImplementedError

    methods = {"ModelInfer": Method(bytes, answer, bytes)}
    table = CallTable(
        Settings(model_repository="."), methods, no_stream, deque(), asyncio.Event(), None
    )
    await listener.H2Server(table).serve("127.0.0.1", port, reuse_port=False)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, report)
    print("ready", flush=True)
    if profiler is not None:
        profiler.enable()
    await stop.wait()


def serve(shape: str, port: int, profile: str | None) -> None:
    import uvloop

    if not profile:
        uvloop.run(_serve(shape, port))
        return
    # NOTE: cProfile does not see the callbacks uvloop's C loop runs: profiled on asyncio's,
    #   from "ready" on (imports and start-up are not the calls' cost).
    profiler = cProfile.Profile()
    asyncio.run(_serve(shape, port, profiler))
    profiler.disable()
    profiler.dump_stats(profile)


def _spec(work: Path, case: str) -> Path:
    inputs = []
    for name, datatype, shape, size in CASES[case][0]:
        path = work / f"{case}-{name}"
        path.write_bytes(bytes(size))
        inputs.append({"name": name, "datatype": datatype, "shape": shape, "file": str(path)})
    spec = work / f"{case}.json"
    spec.write_text(json.dumps({"model_name": "m", "inputs": inputs, "outputs": []}))
    return spec


def _drive(port: int, spec: Path, concurrency: int, seconds: float, work: Path) -> Path:
    result = work / "result.json"
    subprocess.run(
        [sys.executable, str(BENCH / "oipbench" / "grpc_client.py"), "load",
         "--target", f"127.0.0.1:{port}", "--spec", str(spec), "--concurrency",
         str(concurrency), "--warmup", "1", "--startup", "1.5", "--duration",
         str(seconds), "--result", str(result)],
        check=True,
    )  # fmt: skip
    return result


def _snapshot(proc: subprocess.Popen[str]) -> tuple[int, float, float]:
    """The server's calls answered, its CPU seconds and its clock, now."""
    proc.send_signal(signal.SIGUSR1)
    assert proc.stdout is not None
    count, cpu, at = proc.stdout.readline().split()
    return int(count), float(cpu), float(at)


def _window(
    proc: subprocess.Popen[str], port: int, spec: Path, concurrency: int, seconds: float, work: Path
) -> tuple[float, float]:
    """Calls/s and the server's CPU us per call over ``seconds`` inside one client's load
    (counted by the server: independent of how long the client takes to start)."""
    client = subprocess.Popen(
        [sys.executable, str(BENCH / "oipbench" / "grpc_client.py"), "load",
         "--target", f"127.0.0.1:{port}", "--spec", str(spec), "--concurrency",
         str(concurrency), "--warmup", "0", "--startup", "0.5", "--duration",
         str(seconds + 60), "--result", str(work / "result.json")],
        start_new_session=True,
    )  # fmt: skip
    try:
        first = _snapshot(proc)[0]
        give_up = time.monotonic() + 60
        while _snapshot(proc)[0] - first < 20:  # the client is calling
            if time.monotonic() > give_up or client.poll() is not None:
                raise RuntimeError(f"the client did not call {port} (exit {client.poll()})")
            time.sleep(0.1)
        time.sleep(1.0)  # warm-up
        calls0, cpu0, at0 = _snapshot(proc)
        time.sleep(seconds)
        calls1, cpu1, at1 = _snapshot(proc)
    finally:
        os.killpg(client.pid, signal.SIGKILL)
        client.wait()
    calls = max(calls1 - calls0, 1)
    return calls / (at1 - at0), (cpu1 - cpu0) / calls * 1e6


def measure(ns: argparse.Namespace, work: Path) -> None:
    me = [sys.executable, str(Path(__file__).resolve())]
    procs = {}
    try:
        for shape in SHAPES:
            port = _free_port()
            procs[shape] = (port, _start([*me, "--serve", shape, "--port", str(port)]))
        cases = ns.cases.split(",")
        figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for rnd in range(ns.rounds):
            for case in cases:
                spec = _spec(work, case)
                concurrency = CASES[case][1]
                for shape in SHAPES if rnd % 2 == 0 else SHAPES[::-1]:
                    port, proc = procs[shape]
                    try:
                        rate, cpu = _window(proc, port, spec, concurrency, ns.seconds, work)
                    except RuntimeError as exc:
                        print(f"round {rnd} {case} {shape}: skipped ({exc})", flush=True)
                        continue
                    figures.setdefault((case, shape), []).append((rate, cpu))
                    print(f"round {rnd} {case:9s} {shape:6s} {rate:7.0f} calls/s "
                          f"{cpu:7.1f} us CPU/call", flush=True)  # fmt: skip
        print("\n| case | server | calls/s | CPU per call | vs ours (per-round median) |")
        print("|---|---|---:|---:|---:|")
        for case in cases:
            ours = figures.get((case, "ours"), [])
            for shape in SHAPES:
                got = figures.get((case, shape), [])
                if not got or not ours:
                    continue
                rate = statistics.median(r for r, _ in got)
                cpu = statistics.median(c for _, c in got)
                # The ratio per round (each pair ran back to back), then its median.
                ratio = statistics.median(g[1] / o[1] for o, g in zip(ours, got, strict=False))
                print(f"| {case} | {shape} | {rate:,.0f} | {cpu:.1f} us | {ratio:.2f}x |")
    finally:
        for _, proc in procs.values():
            proc.terminate()
            proc.wait()


def profile(ns: argparse.Namespace, work: Path) -> None:
    port = _free_port()
    out = work / f"{ns.profile}.prof"
    proc = _start(
        [sys.executable, str(Path(__file__).resolve()), "--serve", ns.profile, "--port",
         str(port), "--profile-to", str(out)]
    )  # fmt: skip
    try:
        _drive(port, _spec(work, ns.case), CASES[ns.case][1], ns.seconds, work)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    stats = pstats.Stats(str(out))
    stats.sort_stats("tottime").print_stats(ns.top)
    stats.sort_stats("cumulative").print_stats(ns.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=SHAPES, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--profile", choices=SHAPES, help="cProfile one server instead")
    parser.add_argument("--case", choices=list(CASES), default="tiny-c16")
    parser.add_argument("--top", type=int, default=25)
    ns = parser.parse_args()
    if ns.serve:
        serve(ns.serve, ns.port, ns.profile_to)
        return
    work = Path(tempfile.mkdtemp(prefix="h2-base-"))
    if ns.profile:
        profile(ns, work)
    else:
        measure(ns, work)


if __name__ == "__main__":
    main()
