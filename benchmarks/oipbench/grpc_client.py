"""Multi-process gRPC load generator for ModelInfer (runs in the tools venv).

Python is the only gRPC client at hand (no ghz on Debian or PyPI), so the client keeps its
per-request work minimal: the ModelInferRequest is serialised once and sent as raw bytes
through a generic unary-unary call, replies are not parsed, and load is spread over several
processes each running asyncio tasks on one HTTP/2 channel. Its CPU use is measured inside the
measurement window and reported next to every figure.

    python grpc_client.py load --target 127.0.0.1:P --spec S --concurrency 16 --processes 2 \
        --warmup 1 --duration 3 --max-requests 200000 --result out.json
    python grpc_client.py check --target 127.0.0.1:P --spec S --result out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

METHOD = "/inference.GRPCInferenceService/ModelInfer"
READY_METHOD = "/inference.GRPCInferenceService/ServerReady"
OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
NP_TYPES = {
    "INT32": np.int32,
    "FP32": np.float32,
    "UINT8": np.uint8,
    "INT64": np.int64,
    "FP64": np.float64,
    "INT8": np.int8,
    "INT16": np.int16,
    "FP16": np.float16,
}
CONTENT_FIELDS = {
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "UINT8": "uint_contents",
}


def build_request(spec: dict[str, Any]) -> bytes:
    """Serialise the ModelInferRequest once, inputs in raw_input_contents."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=spec["model_name"])
    for item in spec["inputs"]:
        tensor = req.inputs.add()
        tensor.name = item["name"]
        tensor.datatype = item["datatype"]
        tensor.shape.extend(item["shape"])
        req.raw_input_contents.append(Path(item["file"]).read_bytes())
    for name in spec.get("outputs", []):
        req.outputs.add().name = name
    return req.SerializeToString()


def check(target: str, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One ServerReady + one ModelInfer; decode the outputs for the harness to verify."""
    import grpc
    from tritonclient.grpc import service_pb2

    channel = grpc.insecure_channel(target, options=OPTIONS)
    try:
        ready = channel.unary_unary(READY_METHOD)
        ready(service_pb2.ServerReadyRequest().SerializeToString(), timeout=timeout_s)
        call = channel.unary_unary(METHOD)
        raw = call(build_request(spec), timeout=timeout_s)
    except grpc.RpcError as exc:
        return {"ok": False, "error": f"{exc.code().name}: {exc.details()}"}
    finally:
        channel.close()
    resp = service_pb2.ModelInferResponse.FromString(raw)
    outputs: dict[str, list[float]] = {}
    raw_used = False
    for i, out in enumerate(resp.outputs):
        dtype = NP_TYPES.get(out.datatype, np.float32)
        if i < len(resp.raw_output_contents):
            raw_used = True
            arr = np.frombuffer(resp.raw_output_contents[i], dtype=dtype)
        else:
            field = CONTENT_FIELDS.get(out.datatype, "fp32_contents")
            arr = np.asarray(getattr(out.contents, field), dtype=dtype)
        outputs[out.name] = arr.astype(np.float64).tolist()
    return {"ok": True, "outputs": outputs, "raw_outputs": raw_used}


async def _load_loop(
    target: str,
    payload: bytes,
    tasks: int,
    start_at: float,
    end_at: float,
    cap: int,
    timeout_s: float,
) -> dict[str, Any]:
    import grpc

    latencies: list[int] = []
    errors: dict[str, int] = {}
    state = {"count": 0}
    async with grpc.aio.insecure_channel(target, options=OPTIONS) as channel:
        call = channel.unary_unary(METHOD)

        async def one_task() -> None:
            while True:
                now = time.time()
                if now >= end_at or state["count"] >= cap:
                    return
                t0 = time.perf_counter_ns()
                try:
                    await call(payload, timeout=timeout_s)
                    ok = True
                except grpc.aio.AioRpcError as exc:
                    ok = False
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                t1 = time.perf_counter_ns()
                if time.time() >= start_at:
                    state["count"] += 1
                    if ok:
                        latencies.append(t1 - t0)

        async def cpu_marks() -> tuple[float, float]:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            c0 = time.process_time()
            await asyncio.sleep(max(0.0, end_at - time.time()))
            return c0, time.process_time()

        marks = asyncio.ensure_future(cpu_marks())
        await asyncio.gather(*(one_task() for _ in range(tasks)))
        c0, c1 = await marks
    return {
        "count": state["count"],
        "latencies_ns": latencies,
        "errors": errors,
        "cpu_s": c1 - c0,
    }


def _worker(args: tuple[Any, ...], queue: Any) -> None:
    target, payload, tasks, start_at, end_at, cap, timeout_s = args
    try:
        queue.put(asyncio.run(_load_loop(target, payload, tasks, start_at, end_at, cap, timeout_s)))
    except Exception as exc:  # reported to the harness rather than lost in a child
        queue.put({"fatal": repr(exc)})


def load(ns: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    """Run `processes` processes × (`concurrency`/processes) in-flight calls."""
    payload = build_request(spec)
    procs = max(1, min(ns.processes, ns.concurrency))
    per_proc = [
        ns.concurrency // procs + (1 if i < ns.concurrency % procs else 0) for i in range(procs)
    ]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + ns.startup + ns.warmup
    end_at = start_at + ns.duration
    cap = max(1, ns.max_requests // procs)
    workers = [
        ctx.Process(
            target=_worker,
            args=((ns.target, payload, n, start_at, end_at, cap, ns.timeout), queue),
            daemon=True,
        )
        for n in per_proc
    ]
    for w in workers:
        w.start()
    results = []
    deadline = end_at + ns.timeout + 15
    for _ in workers:
        results.append(queue.get(timeout=max(1.0, deadline - time.time())))
    for w in workers:
        w.join(timeout=5)
    fatal = [r["fatal"] for r in results if "fatal" in r]
    if fatal:
        return {"ok": False, "error": "; ".join(fatal)}
    lat = np.concatenate([np.asarray(r["latencies_ns"], dtype=np.int64) for r in results])
    points = [1, 5, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95, 97.5, 99, 99.5, 99.9]
    pct = np.percentile(lat, points).tolist() if lat.size else [0.0] * len(points)
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "ok": True,
        "requests": int(sum(r["count"] for r in results)),
        "ok_requests": int(lat.size),
        "duration_s": ns.duration,
        "errors": errors,
        "client_cpu_s": float(sum(r["cpu_s"] for r in results)),
        "percentiles_us": [[p, v / 1000.0] for p, v in zip(points, pct, strict=True)],
        "mean_us": float(lat.mean() / 1000.0) if lat.size else 0.0,
        "processes": procs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["load", "check"])
    parser.add_argument("--target", required=True)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--startup", type=float, default=2.0, help="spawn + import allowance")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--max-requests", type=int, default=500_000)
    parser.add_argument("--timeout", type=float, default=5.0)
    ns = parser.parse_args()
    spec = json.loads(ns.spec.read_text())
    if ns.mode == "check":
        result = check(ns.target, spec, ns.timeout)
    else:
        result = load(ns, spec)
    ns.result.write_text(json.dumps(result))
    sys.exit(0 if result.get("ok") else 1)


if __name__ == "__main__":
    main()
