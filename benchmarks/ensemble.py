"""A two-step ensemble against the client calling both steps itself, in one server.

The steps: ``preprocess`` (``(x - 0.5) / 0.25`` over ``[-1, 1024]`` FP32, a small ONNX graph)
feeding ``matmul_relu`` (the harness's ``[n, 1024] x [1024, 1024]`` MatMul + Relu,
model-repository/build.py). Two ways to get the same answer:

- ``ensemble``: one request to ``pre_matmul`` (``platform: "ensemble"``); the intermediate
  tensor stays in the workers' shared memory (docs/ensembles.md: 1 copy of it, by the
  first step's worker);
- ``client``: the client calls ``preprocess``, gets the intermediate tensor back, and sends
  it to ``matmul_relu`` (two round trips; the intermediate crosses the socket twice).

One server (``--instances-per-device 2``), both ways driven in turn by the same closed-loop
clients (tritonclient HTTP, binary tensors, ``--concurrency`` threads), ``--seconds`` each,
the order reversed every other round; medians over the rounds of requests per second, p50
and p99 latency of a whole answer.

    .venv/bin/python benchmarks/ensemble.py --rounds 6 --seconds 3 --rows 8

Triton's ensemble of the same steps is not run: the Triton of the harness (``start_triton``,
the nvidia-pytriton wheel) has no ONNX Runtime backend, so it cannot serve these two ONNX
steps as an ensemble.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

PREPROCESS = """name: "preprocess"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "IN" data_type: TYPE_FP32 dims: [ 1024 ] }
output { name: "OUT" data_type: TYPE_FP32 dims: [ 1024 ] }
"""
MATMUL = """name: "matmul_relu"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1024 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1024 ] }
"""
ENSEMBLE = """name: "pre_matmul"
platform: "ensemble"
max_batch_size: 8
input { name: "X" data_type: TYPE_FP32 dims: [ 1024 ] }
output { name: "Y" data_type: TYPE_FP32 dims: [ 1024 ] }
ensemble_scheduling {
  step { model_name: "preprocess" model_version: -1
         input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "scaled" } }
  step { model_name: "matmul_relu" model_version: -1
         input_map { key: "INPUT0" value: "scaled" } output_map { key: "OUTPUT0" value: "Y" } }
}
"""


def _repository(root: Path) -> Path:
    spec = importlib.util.spec_from_file_location("build", ROOT / "model-repository" / "build.py")
    if spec is None or spec.loader is None:
        raise ImportError("model-repository/build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    build.build_matmul_relu(root)
    (root / "matmul_relu" / "config.pbtxt").write_text(MATMUL)
    nodes = [
        helper.make_node("Sub", ["IN", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "scale"], ["OUT"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([0.5], np.float32), "mean"),
        numpy_helper.from_array(np.array([0.25], np.float32), "scale"),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 1024]) for n in ("IN", "OUT")]
    graph = helper.make_graph(nodes, "preprocess", [io[0]], [io[1]], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / "preprocess" / "1").mkdir(parents=True)
    onnx.save(model, root / "preprocess" / "1" / "model.onnx")
    (root / "preprocess" / "config.pbtxt").write_text(PREPROCESS)
    (root / "pre_matmul" / "1").mkdir(parents=True)
    (root / "pre_matmul" / "config.pbtxt").write_text(ENSEMBLE)
    return root


def _tensor(name: str, values: np.ndarray) -> httpclient.InferInput:
    given = httpclient.InferInput(name, list(values.shape), "FP32")
    given.set_data_from_numpy(values)
    return given


def _ensemble(client: httpclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    return client.infer("pre_matmul", [_tensor("X", x)]).as_numpy("Y")


def _by_client(client: httpclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    scaled = client.infer("preprocess", [_tensor("IN", x)]).as_numpy("OUT")
    return client.infer("matmul_relu", [_tensor("INPUT0", scaled)]).as_numpy("OUTPUT0")


WAYS = {"ensemble": _ensemble, "client": _by_client}


def _drive(url: str, way: str, x: np.ndarray, seconds: float, threads: int) -> list[float]:
    """Closed-loop clients for ``seconds``: each answer's latency (seconds)."""
    latencies: list[float] = []
    lock = threading.Lock()
    end = time.perf_counter() + seconds

    def loop() -> None:
        client = httpclient.InferenceServerClient(url)
        mine = []
        while time.perf_counter() < end:
            began = time.perf_counter()
            WAYS[way](client, x)
            mine.append(time.perf_counter() - began)
        client.close()
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8, help="rows of X per request (<= 8)")
    args = parser.parse_args()
    x = np.random.default_rng(38).standard_normal((args.rows, 1024)).astype(np.float32)
    with tempfile.TemporaryDirectory() as scratch:
        repository = _repository(Path(scratch))
        server = ServerProcess(repository, ["--instances-per-device", "2"]).wait_ready()
        try:
            url = server.host_port
            check = httpclient.InferenceServerClient(url)
            np.testing.assert_allclose(_ensemble(check, x), _by_client(check, x), rtol=1e-5)
            check.close()
            for way in WAYS:  # warm-up
                _drive(url, way, x, 0.5, args.concurrency)
            rows: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
            for round_ in range(args.rounds):
                order = list(WAYS) if round_ % 2 == 0 else list(reversed(WAYS))
                for way in order:
                    latencies = sorted(_drive(url, way, x, args.seconds, args.concurrency))
                    p50 = latencies[len(latencies) // 2]
                    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
                    rows[way].append((len(latencies) / args.seconds, p50, p99))
        finally:
            server.stop()
    print(
        f"| way ({args.rows}x1024 FP32, c={args.concurrency}, {args.rounds} rounds x "
        f"{args.seconds:g} s) | answers/s | p50 ms | p99 ms |"
    )
    print("|---|---|---|---|")
    for way, measured in rows.items():
        rate = statistics.median(r[0] for r in measured)
        p50 = statistics.median(r[1] for r in measured) * 1e3
        p99 = statistics.median(r[2] for r in measured) * 1e3
        print(f"| {way} | {rate:.0f} | {p50:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    main()
