"""Padded batching against Triton-style batching, mixed-length traffic, one server.

The model is the sample encoder (model-repository/build.py ``build_encoder``: embeddings,
one masked attention step and a projection, width 64), served twice from one repository:

- ``padded``: the sample config, with ``pad_batch`` (input_ids and attention_mask padded
  along the sequence, ``hidden`` cut back, waste bound 2: docs/scheduler.md);
- ``triton``: the same model and ``dynamic_batching``, without ``pad_batch``: requests
  batch only when their lengths agree, as Triton batches them.

Closed-loop clients (tritonclient HTTP, binary tensors, ``--concurrency`` threads) send one
sequence each, of a length drawn uniformly from ``--min-length`` to ``--max-length``, for
``--seconds``; the two ways take turns, the order reversed every other round; medians
over the rounds of answers per second and p50 / p99 latency, and per way the executions'
mean batch size and padding waste (statistics extension, ``/metrics``).

    .venv/bin/python benchmarks/padded_batching.py --rounds 3 --seconds 5 --concurrency 16

Triton itself is not run: the Triton of the harness (``oipbench.servers.start_triton``, the
nvidia-pytriton wheel) has no ONNX Runtime backend, so it cannot serve this ONNX model.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

WAYS = ("padded", "triton")


def _repository(root: Path, delay_us: int) -> Path:
    spec = importlib.util.spec_from_file_location("build", ROOT / "model-repository" / "build.py")
    if spec is None or spec.loader is None:
        raise ImportError("model-repository/build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    build.build_encoder(root, "padded")
    build.build_encoder(root, "triton", None)
    for name in WAYS:
        config = root / name / "config.pbtxt"
        text = config.read_text().replace(
            "max_queue_delay_microseconds: 2000", f"max_queue_delay_microseconds: {delay_us}"
        )
        config.write_text(text)
    return root


def _infer(client: httpclient.InferenceServerClient, model: str, ids: np.ndarray) -> np.ndarray:
    inputs = []
    for name, values in (("input_ids", ids), ("attention_mask", np.ones_like(ids))):
        given = httpclient.InferInput(name, list(values.shape), "INT64")
        given.set_data_from_numpy(values, binary_data=True)
        inputs.append(given)
    return client.infer(model, inputs).as_numpy("pooled")


def _drive(
    url: str, model: str, lengths: tuple[int, int], seconds: float, threads: int
) -> list[float]:
    """Closed-loop clients for ``seconds``: each answer's latency (seconds)."""
    latencies: list[float] = []
    lock = threading.Lock()
    end = time.perf_counter() + seconds

    def loop(seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = httpclient.InferenceServerClient(url)
        mine = []
        while time.perf_counter() < end:
            ids = rng.integers(1, 100, (1, int(rng.integers(lengths[0], lengths[1] + 1))))
            began = time.perf_counter()
            _infer(client, model, ids.astype(np.int64))
            mine.append(time.perf_counter() - began)
        client.close()
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return latencies


def _batches(url: str, model: str) -> tuple[int, int]:
    """(inferences, executions) so far, from the statistics extension."""
    client = httpclient.InferenceServerClient(url)
    (stats,) = client.get_inference_statistics(model)["model_stats"]
    client.close()
    return int(stats["inference_count"]), int(stats["execution_count"])


def _waste(metrics_url: str, model: str) -> float:
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("oipserve_pad_batch_elements", "oipserve_pad_batch_real_elements"):
            if line.startswith(f'{name}{{model="{model}"'):
                values[name] = float(line.split()[-1])
    if len(values) != 2:
        return 1.0
    return values["oipserve_pad_batch_elements"] / values["oipserve_pad_batch_real_elements"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--min-length", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument(
        "--delay-us", type=int, default=0, help="max_queue_delay_microseconds of both"
    )
    args = parser.parse_args()
    lengths = (args.min_length, args.max_length)
    with tempfile.TemporaryDirectory() as scratch:
        repository = _repository(Path(scratch), args.delay_us)
        server = ServerProcess(repository).wait_ready()
        try:
            url = server.host_port
            check = httpclient.InferenceServerClient(url)
            ids = np.arange(1, 20, dtype=np.int64).reshape(1, -1)
            assert _infer(check, "padded", ids).tobytes() == _infer(check, "triton", ids).tobytes()
            check.close()
            for way in WAYS:  # warm-up
                _drive(url, way, lengths, 1.0, args.concurrency)
            rows: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
            counts = {way: _batches(url, way) for way in WAYS}
            for round_ in range(args.rounds):
                order = list(WAYS) if round_ % 2 == 0 else list(reversed(WAYS))
                for way in order:
                    latencies = sorted(_drive(url, way, lengths, args.seconds, args.concurrency))
                    p50 = latencies[len(latencies) // 2]
                    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
                    rows[way].append((len(latencies) / args.seconds, p50, p99))
            sizes = {}
            for way in WAYS:
                inferences, executions = _batches(url, way)
                before = counts[way]
                sizes[way] = (inferences - before[0]) / max(executions - before[1], 1)
            waste = _waste(server.metrics_url, "padded")
        finally:
            server.stop()
    print(
        f"| way (encoder, lengths {lengths[0]}-{lengths[1]}, c={args.concurrency}, "
        f"delay {args.delay_us} us, {args.rounds} rounds x {args.seconds:g} s) | answers/s | "
        "p50 ms | p99 ms | "
        "mean batch |"
    )
    print("|---|---|---|---|---|")
    medians = {}
    for way, measured in rows.items():
        rate = statistics.median(r[0] for r in measured)
        p50 = statistics.median(r[1] for r in measured) * 1e3
        p99 = statistics.median(r[2] for r in measured) * 1e3
        medians[way] = (rate, p99)
        print(f"| {way} | {rate:.0f} | {p50:.2f} | {p99:.2f} | {sizes[way]:.2f} |")
    ratio = medians["padded"][0] / medians["triton"][0]
    p99_ratio = medians["padded"][1] / medians["triton"][1]
    print(
        f"\npadded / triton-style: throughput {ratio:.2f}x, p99 {p99_ratio:.2f}x; "
        f"padding waste (padded elements / real) {waste:.2f}"
    )


if __name__ == "__main__":
    main()
