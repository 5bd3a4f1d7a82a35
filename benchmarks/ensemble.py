"""A two-step ensemble against the client calling both steps itself, and against Triton's
ensemble of the same steps.

The steps: ``preprocess`` (``(x - 0.5) / 0.25`` over ``[-1, 1024]`` FP32, a small ONNX graph)
feeding ``matmul_relu`` (the harness's ``[n, 1024] x [1024, 1024]`` MatMul + Relu,
model-repository/build.py). Three ways to get the same answer:

- ``ensemble``: one request to oipserve's ``pre_matmul`` (``platform: "ensemble"``); its
  two steps are a chain (docs/ensembles.md): one worker runs both from one message and feeds
  the intermediate tensor from one to the other in its memory (0 copies of it);
- ``client``: the client calls oipserve's ``preprocess``, gets the intermediate tensor back,
  and sends it to ``matmul_relu`` (two round trips; the intermediate crosses the socket
  twice);
- ``triton``: one request to Triton's ``pre_matmul``, the same ensemble configuration over
  the same two .onnx files, each served as the harness serves ONNX on Triton
  (``start_triton``: ``tritonserver`` 2.51 of the nvidia-pytriton wheel, whose only backend
  is the python one; ``benchmarks/peers/triton_model.py`` runs ONNX Runtime in a python
  stub). Triton's core passes the intermediate tensor from one stub to the next through its
  own memory (stub shared memory -> core -> stub shared memory).

Both servers run at once (two instances of each model, ORT intra-op 1, inter-op 1,
sequential); the three ways are driven in turn by the same closed-loop clients
(tritonclient HTTP, binary tensors, ``--concurrency`` threads), ``--seconds`` each, the order
reversed every other round. Medians over the rounds of answers per second, p50 and p99
latency of a whole answer, and the server's CPU per answer (front: ``oipserve`` /
``tritonserver``; workers: oipserve's workers / Triton's python stubs; from /proc).

    .venv/bin/python benchmarks/ensemble.py --rounds 6 --seconds 3 --rows 8

``--no-triton`` leaves Triton out; ``--oipserve-arg`` adds an argument to oipserve's
command line (e.g. ``--oipserve-arg=--busy-poll-us --oipserve-arg=0``). Triton's venv is
the harness's (benchmarks/.venvs/triton, made by ``benchmarks/run.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from oipbench.models import ModelCase  # noqa: E402
from oipbench.procs import cpu_snapshot, front_and_workers  # noqa: E402
from oipbench.servers import Server, Tuning, start_triton  # noqa: E402

from tests.support.server import ServerProcess  # noqa: E402

TRITON_VENV = BENCH / ".venvs" / "triton"
TUNING = Tuning()  # 2 instances, ORT intra 1 / inter 1: both servers get the same
ORT_PARAMS = "".join(
    f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
    for k, v in TUNING.ort_params().items()
)
PREPROCESS = (
    """name: "preprocess"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "IN" data_type: TYPE_FP32 dims: [ 1024 ] }
output { name: "OUT" data_type: TYPE_FP32 dims: [ 1024 ] }
"""
    + ORT_PARAMS
)
MATMUL = (
    """name: "matmul_relu"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1024 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1024 ] }
"""
    + ORT_PARAMS
)
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


def _write_preprocess(path: Path) -> None:
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
    path.parent.mkdir(parents=True)
    onnx.save(model, path)


def _repository(root: Path) -> Path:
    spec = importlib.util.spec_from_file_location("build", ROOT / "model-repository" / "build.py")
    if spec is None or spec.loader is None:
        raise ImportError("model-repository/build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    build.build_matmul_relu(root)
    (root / "matmul_relu" / "config.pbtxt").write_text(MATMUL)
    _write_preprocess(root / "preprocess" / "1" / "model.onnx")
    (root / "preprocess" / "config.pbtxt").write_text(PREPROCESS)
    (root / "pre_matmul" / "1").mkdir(parents=True)
    (root / "pre_matmul" / "config.pbtxt").write_text(ENSEMBLE)
    return root


def _start_triton(repository: Path, work: Path) -> Server:
    """Triton as the harness starts it, the two steps as python-backend models over the
    same .onnx files, then its ensemble loaded over them (explicit model control: the
    harness writes its repository and starts the server in one call)."""
    if not TRITON_VENV.exists():
        raise RuntimeError(f"{TRITON_VENV} is missing: run benchmarks/run.py once first")
    fp32 = np.zeros((1, 1024), np.float32)
    cases = {
        name: ModelCase(
            name=name,
            onnx_path=repository / name / "1" / "model.onnx",
            inputs={given: fp32},
            output_names=[out],
            expected={out: fp32},
            max_batch_size=8,
            dims={given: [1024], out: [1024]},
        )
        for name, given, out in (("preprocess", "IN", "OUT"), ("matmul_relu", "INPUT0", "OUTPUT0"))
    }
    explicit = ["--model-control-mode", "explicit"]
    for name in cases:
        explicit += ["--load-model", name]
    server = start_triton(TRITON_VENV, cases, work, TUNING, extra_args=explicit)
    if server.error:
        server.stop()
        raise RuntimeError(f"Triton did not start: {server.error}")
    (work / "repos" / "triton" / "pre_matmul" / "1").mkdir(parents=True)
    (work / "repos" / "triton" / "pre_matmul" / "config.pbtxt").write_text(ENSEMBLE)
    client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
    client.load_model("pre_matmul")
    client.close()
    return server


def _tensor(name: str, values: np.ndarray) -> httpclient.InferInput:
    given = httpclient.InferInput(name, list(values.shape), "FP32")
    given.set_data_from_numpy(values)
    return given


def _ensemble(client: httpclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    return client.infer("pre_matmul", [_tensor("X", x)]).as_numpy("Y")


def _by_client(client: httpclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    scaled = client.infer("preprocess", [_tensor("IN", x)]).as_numpy("OUT")
    return client.infer("matmul_relu", [_tensor("INPUT0", scaled)]).as_numpy("OUTPUT0")


@dataclass
class Way:
    """One way to get the answer: the call, and the server (its address, its process)."""

    call: Callable[[httpclient.InferenceServerClient, np.ndarray], np.ndarray]
    url: str = ""
    pid: int = 0


def _drive(way: Way, x: np.ndarray, seconds: float, threads: int) -> list[float]:
    """Closed-loop clients for ``seconds``: each answer's latency (seconds)."""
    latencies: list[float] = []
    lock = threading.Lock()
    end = time.perf_counter() + seconds

    def loop() -> None:
        client = httpclient.InferenceServerClient(way.url)
        mine = []
        while time.perf_counter() < end:
            began = time.perf_counter()
            way.call(client, x)
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


#: Per round: answers/s, p50 s, p99 s, front and workers CPU seconds per answer.
Row = tuple[float, float, float, float, float]


def _measure(way: Way, x: np.ndarray, seconds: float, threads: int) -> Row:
    before = cpu_snapshot(way.pid)
    latencies = sorted(_drive(way, x, seconds, threads))
    front, workers = front_and_workers(before, cpu_snapshot(way.pid))
    count = len(latencies)
    p50 = latencies[count // 2]
    p99 = latencies[min(count - 1, int(count * 0.99))]
    return count / seconds, p50, p99, front / count, workers / count


def _report(rows: dict[str, list[Row]], args: argparse.Namespace) -> None:
    print(
        f"| way ({args.rows}x1024 FP32, c={args.concurrency}, {args.rounds} rounds x "
        f"{args.seconds:g} s) | answers/s | p50 ms | p99 ms | server CPU ms/answer "
        "(front + workers) |"
    )
    print("|---|---|---|---|---|")
    for name, measured in rows.items():
        rate, p50, p99, front, workers = (
            statistics.median(r[k] for r in measured) for k in range(5)
        )
        print(
            f"| {name} | {rate:.0f} | {p50 * 1e3:.2f} | {p99 * 1e3:.2f} | "
            f"{(front + workers) * 1e3:.2f} ({front * 1e3:.2f} + {workers * 1e3:.2f}) |"
        )
    first = next(iter(rows))
    for name, measured in rows.items():
        if name == first:
            continue
        # NOTE: the ways of one round ran seconds apart, under the same load from the
        #   machine's other tenants: their ratio moves less than either rate.
        ratios = [mine[0] / base[0] for mine, base in zip(measured, rows[first], strict=True)]
        print(
            f"{name} / {first}, answers/s, median of per-round ratios: "
            f"{statistics.median(ratios):.2f} (rounds: {min(ratios):.2f} to {max(ratios):.2f})"
        )
    print("rates per round:", {name: [round(r[0]) for r in m] for name, m in rows.items()})


def _run(ways: dict[str, Way], x: np.ndarray, args: argparse.Namespace) -> dict[str, list[Row]]:
    for way in ways.values():  # warm-up
        _drive(way, x, 0.5, args.concurrency)
    rows: dict[str, list[Row]] = {name: [] for name in ways}
    for round_ in range(args.rounds):
        order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
        for name in order:
            rows[name].append(_measure(ways[name], x, args.seconds, args.concurrency))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8, help="rows of X per request (<= 8)")
    parser.add_argument("--no-triton", action="store_true", help="leave Triton out")
    parser.add_argument(
        "--oipserve-arg",
        action="append",
        default=[],
        help="one more argument of `oipserve serve` (repeat: --oipserve-arg=--busy-poll-us "
        "--oipserve-arg=0)",
    )
    args = parser.parse_args()
    x = np.random.default_rng(38).standard_normal((args.rows, 1024)).astype(np.float32)
    with tempfile.TemporaryDirectory() as scratch:
        repository = _repository(Path(scratch) / "oipserve")
        server = ServerProcess(
            repository, ["--instances-per-device", "2", *args.oipserve_arg]
        ).wait_ready()
        triton: Server | None = None
        try:
            ways = {
                "oipserve ensemble": Way(_ensemble, server.host_port, server.process.pid),
                "oipserve, client calls both": Way(
                    _by_client, server.host_port, server.process.pid
                ),
            }
            if not args.no_triton:
                triton = _start_triton(repository, Path(scratch) / "triton")
                url = triton.http_url.removeprefix("http://")
                ways["Triton ensemble"] = Way(_ensemble, url, triton.root_pid())
            expected = _by_client(httpclient.InferenceServerClient(server.host_port), x)
            for name, way in ways.items():
                got = way.call(httpclient.InferenceServerClient(way.url), x)
                np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=name)
            rows = _run(ways, x, args)
        finally:
            server.stop()
            if triton is not None:
                triton.stop()
    _report(rows, args)


if __name__ == "__main__":
    main()
