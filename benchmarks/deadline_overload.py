"""Answers in time under an overload whose clients give up: gRPC calls with deadlines.

A model of one worker (``instance_group`` count 1: a chain of 16 1024 x 1024 MatMuls on 256
rows made from a one-row input, ~20-40 ms a run here) gets ModelInfer calls at a fixed rate
(open loop: a call every 1/rate s, whatever the answers), each with a ``--deadline``. Past
the worker's pace the queue grows; what counts is how many calls a second are still
answered in time (*goodput*, over the second half of the run, when the queue has built).
Each build (a source tree) is started afresh for each rate and round, in turn.

    python benchmarks/deadline_overload.py BASE_TREE NEW_TREE --rates 20,60 --rounds 2

Where the worker runs every request it was given, an overload collapses: the queue grows
until every request reaches the worker at its deadline and ends after it, and goodput falls
to 0 (``docs/scheduler.md``, "Timeouts, full queues, clients that go away").
The client is the harness's venv's grpcio (``grpc.aio``), in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import service_pb2, service_pb2_grpc

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.servers import serve_from  # noqa: E402

REPOSITORY = BENCH / ".work" / "repos" / "deadline-overload"
MODEL = "heavy"
LAYERS = 16
ROWS = 256
CHANNELS = 4


def write_repository() -> None:
    """The one-worker model: its input expanded to ``ROWS`` rows, then ``LAYERS`` MatMuls."""
    path = REPOSITORY / MODEL / "1" / "model.onnx"
    if path.exists():
        return
    path.parent.mkdir(parents=True)
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Expand", ["INPUT0", "rows"], ["x"])]
    weights = [
        numpy_helper.from_array(np.array([ROWS, 1024], np.int64), "rows"),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
    ]
    previous = "x"
    for i in range(LAYERS):
        scale = np.float32(0.03)
        weight = (rng.standard_normal((1024, 1024)).astype(np.float32) * scale, f"w{i}")
        weights.append(numpy_helper.from_array(*weight))
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [f"t{i}"]))
        previous = f"t{i}"
    nodes.append(helper.make_node("ReduceSum", [previous, "axes"], ["OUTPUT0"], keepdims=1))
    graph = helper.make_graph(
        nodes,
        MODEL,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [1, 1024])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    (REPOSITORY / MODEL / "config.pbtxt").write_text(
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


async def drive(target: str, rate: float, deadline: float, seconds: float) -> dict[str, float]:
    """Calls at ``rate`` a second for ``seconds``; goodput over the second half, and more."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1024])
    request.raw_input_contents.append(np.ones((1, 1024), np.float32).tobytes())
    channels = [grpc.aio.insecure_channel(target) for _ in range(CHANNELS)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
    await stubs[0].ModelInfer(request, timeout=60)  # warm
    outcomes: Counter[str] = Counter()
    in_time: list[float] = []
    start = time.monotonic()
    half = start + seconds / 2

    async def call(number: int) -> None:
        sent = time.monotonic()
        try:
            await stubs[number % CHANNELS].ModelInfer(request, timeout=deadline)
        except grpc.aio.AioRpcError as error:
            outcomes[error.code().name] += 1
            return
        outcomes["OK"] += 1
        if sent >= half:
            in_time.append(time.monotonic() - sent)

    calls = []
    number = 0
    while time.monotonic() - start < seconds:
        calls.append(asyncio.ensure_future(call(number)))
        number += 1
        await asyncio.sleep(max(0.0, start + number / rate - time.monotonic()))
    await asyncio.gather(*calls)
    for channel in channels:
        await channel.close()
    return {
        "goodput": len(in_time) / (seconds / 2),
        "ok": outcomes["OK"],
        "deadline_exceeded": outcomes["DEADLINE_EXCEEDED"],
        "other_errors": sum(outcomes.values()) - outcomes["OK"] - outcomes["DEADLINE_EXCEEDED"],
        "p50_ms": statistics.median(in_time) * 1000 if in_time else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", type=Path, help="source trees to compare")
    parser.add_argument("--rates", default="20,60", help="calls a second, comma-separated")
    parser.add_argument("--deadline", type=float, default=0.3, help="each call's, seconds")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    ns = parser.parse_args()
    write_repository()
    args = ["--model-repository", str(REPOSITORY), "--http-port", "0", "--grpc-port", "0",
            "--devices", "cpu", "--http-workers", "1"]  # fmt: skip
    print(f"deadline {ns.deadline * 1000:.0f} ms, {ns.seconds:.0f} s a run; goodput: calls a "
          "second answered in time over the run's second half")  # fmt: skip
    for rate in (float(r) for r in ns.rates.split(",")):
        for round_ in range(ns.rounds):
            for build in ns.builds:
                server = serve_from(build, args)
                try:
                    row = asyncio.run(drive(server.grpc, rate, ns.deadline, ns.seconds))
                finally:
                    server.stop()
                print(
                    f"rate {rate:5.0f}/s  round {round_}  {str(build):30s} goodput "
                    f"{row['goodput']:6.1f}/s  ok {row['ok']:5.0f}  deadline exceeded "
                    f"{row['deadline_exceeded']:5.0f}  other errors {row['other_errors']:4.0f}  "
                    f"p50 of those in time {row['p50_ms']:6.1f} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
