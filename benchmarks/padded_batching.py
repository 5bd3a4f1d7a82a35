"""Padded batching against Triton-style batching (ours and Triton's), mixed-length traffic.

The model is the sample encoder (model-repository/build.py ``build_encoder``: embeddings,
one masked attention step and a projection, width 64), served three ways per queue delay:

- ``padded``: oipserve, the sample config with ``pad_batch`` (input_ids and attention_mask
  padded along the sequence, ``hidden`` cut back, waste bound 2: docs/scheduler.md);
- ``ours, Triton-style``: oipserve, the same model and ``dynamic_batching`` without
  ``pad_batch``: requests batch only when their lengths agree, as Triton batches them;
- ``Triton``: ``tritonserver`` 2.51 of the harness (``oipbench.servers.start_triton``: the
  nvidia-pytriton wheel's binary, python backend, ``benchmarks/peers/triton_model.py``
  running the same .onnx in ONNX Runtime) with Triton's own ``dynamic_batching``.

Every config gets the same ``max_batch_size`` (16), ``max_queue_delay_microseconds`` and
``--instances`` CPU instances (default 2, the harness's: Triton's instance_group count and
oipserve's ``--instances-per-device``, so that on 2 cores each session has one ORT intra-op
thread on both servers; with 1 instance oipserve's session takes both cores' threads, its
own rule, while Triton's stub reads intra_op_thread_count 1). One oipserve serves both of
its ways for every delay, one Triton its model for every delay; all of them take turns in
one run (the order reversed every other round). Closed-loop clients (tritonclient HTTP,
binary tensors, ``--concurrency`` threads) send one sequence each, of a length drawn
uniformly from ``--min-length`` to ``--max-length``, for ``--seconds``. Per way: medians
over the rounds of answers per second, p50 / p99 latency and the server's CPU per answer
(its process tree, psutil: the front, and the model runners, oipserve's workers or Triton's
python-backend stubs); the batch sizes executed (statistics extension ``batch_stats``) and,
for padded, the padding waste (``/metrics``); and how busy the rest of the machine was
(``/proc/stat`` less the server and this client process).

    .venv/bin/python benchmarks/padded_batching.py --rounds 5 --seconds 4 --concurrency 16

Triton comes from the harness's venv (benchmarks/.venvs/triton, made on first use).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from oipbench import models as harness_models  # noqa: E402
from oipbench import procs, venvs  # noqa: E402
from oipbench.servers import Server, Tuning, start_triton  # noqa: E402

from tests.support.server import ServerProcess  # noqa: E402

MAX_BATCH = 16


@dataclass
class Way:
    """One way of serving the encoder, and what was measured of it."""

    label: str
    delay_us: int
    url: str
    model: str
    root_pid: int
    #: Per window: answers/s, p50 s, p99 s, front and model-runner CPU µs an answer, the
    #: rest of the machine's CPU % of one core.
    rows: list[tuple[float, float, float, float, float, float]] = field(default_factory=list)
    batches: Counter[int] = field(default_factory=Counter)


def _oipserve_repository(root: Path, delays: list[int], tuning: Tuning) -> Path:
    """``padded_<delay>`` and ``plain_<delay>`` per delay, with the instances and threads of
    ``tuning`` (the thread keys are Triton's onnxruntime backend's, as the harness writes
    them; oipserve's sessions take their threads from ``--instances-per-device``)."""
    build = harness_models.load_build_module()
    extra = f"instance_group [ {{ count: {tuning.instances} kind: KIND_CPU }} ]\n" + "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in tuning.ort_params().items()
    )
    for delay in delays:
        for name, pad in ((f"padded_{delay}", build.ENCODER_PAD_BATCH), (f"plain_{delay}", None)):
            build.build_encoder(root, name, pad)
            config = root / name / "config.pbtxt"
            text = config.read_text().replace(
                "max_queue_delay_microseconds: 2000", f"max_queue_delay_microseconds: {delay}"
            )
            config.write_text(text + extra)
    return root


def _triton_cases(models: Path, delays: list[int]) -> dict[str, harness_models.ModelCase]:
    """The encoder once per delay, as the harness's Triton repository writer wants it."""
    build = harness_models.load_build_module()
    build.build_encoder(models, "encoder")
    # The harness's pbtxt type table stops at its own models' types; the encoder's ids are
    # INT64 (a dict entry added in this process only).
    harness_models.TRITON_TYPES.setdefault("INT64", "TYPE_INT64")
    ids = np.ones((1, 4), np.int64)
    width = build.ENCODER_WIDTH
    return {
        f"encoder_{delay}": harness_models.ModelCase(
            name=f"encoder_{delay}",
            onnx_path=models / "encoder" / "1" / "model.onnx",
            inputs={"input_ids": ids, "attention_mask": ids},
            output_names=["hidden", "pooled"],
            expected={
                "hidden": np.zeros((1, 4, width), np.float32),
                "pooled": np.zeros((1, width), np.float32),
            },
            max_batch_size=MAX_BATCH,
            dims={
                "input_ids": [-1],
                "attention_mask": [-1],
                "hidden": [-1, width],
                "pooled": [width],
            },
            dynamic_batching=f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}",
        )
        for delay in delays
    }


def _infer(client: httpclient.InferenceServerClient, model: str, ids: np.ndarray) -> np.ndarray:
    inputs = []
    for name, values in (("input_ids", ids), ("attention_mask", np.ones_like(ids))):
        given = httpclient.InferInput(name, list(values.shape), "INT64")
        given.set_data_from_numpy(values, binary_data=True)
        inputs.append(given)
    return client.infer(model, inputs).as_numpy("pooled")


def _drive(way: Way, lengths: tuple[int, int], seconds: float, threads: int) -> list[float]:
    """Closed-loop clients for ``seconds``: each answer's latency (seconds)."""
    latencies: list[float] = []
    lock = threading.Lock()
    end = time.perf_counter() + seconds

    def loop(seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = httpclient.InferenceServerClient(way.url)
        mine = []
        while time.perf_counter() < end:
            ids = rng.integers(1, 100, (1, int(rng.integers(lengths[0], lengths[1] + 1))))
            began = time.perf_counter()
            _infer(client, way.model, ids.astype(np.int64))
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


def _measure(way: Way, lengths: tuple[int, int], seconds: float, threads: int) -> None:
    """One window of ``way``: a row of :attr:`Way.rows`."""
    server0, client0 = procs.cpu_snapshot(way.root_pid), time.process_time()
    latencies = sorted(_drive(way, lengths, seconds, threads))
    server1, client1 = procs.cpu_snapshot(way.root_pid), time.process_time()
    server_pct, _ = procs.cpu_delta(server0, server1)
    front_s, runner_s = procs.front_and_workers(server0, server1)
    wall = server1.at - server0.at
    others = procs.machine_cpu_pct(server0, server1) - server_pct - 100 * (client1 - client0) / wall
    count = len(latencies)
    p50 = latencies[count // 2]
    p99 = latencies[min(count - 1, int(count * 0.99))]
    per_answer = 1e6 / max(count, 1)
    way.rows.append(
        (count / seconds, p50, p99, front_s * per_answer, runner_s * per_answer, others)
    )


def _batch_counts(way: Way) -> Counter[int]:
    """Executions per batch size so far (statistics extension ``batch_stats``)."""
    client = httpclient.InferenceServerClient(way.url)
    (stats,) = client.get_inference_statistics(way.model)["model_stats"]
    client.close()
    return Counter(
        {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    )


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


def _start_triton(scratch: Path, delays: list[int], tuning: Tuning) -> Server:
    venv = venvs.ensure_venv(
        "triton",
        venvs.requirements(venvs.host_onnxruntime_version())["triton"],
        scratch / "logs" / "venv-triton.log",
    )
    cases = _triton_cases(scratch / "models", delays)
    return start_triton(venv.parent.parent, cases, scratch, tuning)


def _check_same(ways: list[Way]) -> None:
    """Every way answers one request with the same bytes (the encoder is exact)."""
    ids = np.arange(1, 20, dtype=np.int64).reshape(1, -1)
    answers = set()
    for way in ways:
        client = httpclient.InferenceServerClient(way.url)
        answers.add(_infer(client, way.model, ids).tobytes())
        client.close()
    if len(answers) != 1:
        raise SystemExit("the ways disagree on one request's output")


def _run(ways: list[Way], args: argparse.Namespace) -> None:
    lengths = (args.min_length, args.max_length)
    for way in ways:  # warm-up
        _drive(way, lengths, 1.0, args.concurrency)
    before = {way.label + str(way.delay_us): _batch_counts(way) for way in ways}
    for round_ in range(args.rounds):
        order = ways if round_ % 2 == 0 else list(reversed(ways))
        for way in order:
            _measure(way, lengths, args.seconds, args.concurrency)
    for way in ways:
        way.batches = _batch_counts(way) - before[way.label + str(way.delay_us)]


def _batch_text(batches: Counter[int]) -> str:
    executions = sum(batches.values())
    mean = sum(size * n for size, n in batches.items()) / max(executions, 1)
    shares = ", ".join(
        f"{size}: {100 * n / executions:.1f} %" for size, n in sorted(batches.items())[:4]
    )
    more = " …" if len(batches) > 4 else ""
    return f"{mean:.2f} of {executions} executions ({shares}{more})"


def _report(ways: list[Way], args: argparse.Namespace, waste: dict[int, float]) -> None:
    print(
        f"encoder, lengths {args.min_length}-{args.max_length}, c={args.concurrency}, "
        f"{args.rounds} rounds x {args.seconds:g} s, {args.instances} instance(s); "
        "load average at the end " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    print(
        "| way | delay µs | answers/s | p50 ms | p99 ms | server CPU µs/answer (front + "
        "model runner) | rest of machine % of 1 core | mean batch (executions by size) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    medians: dict[tuple[str, int], tuple[float, float]] = {}
    for way in ways:
        med = [statistics.median(r[i] for r in way.rows) for i in range(6)]
        cpu = statistics.median(r[3] + r[4] for r in way.rows)
        medians[(way.label, way.delay_us)] = (med[0], med[2])
        print(
            f"| {way.label} | {way.delay_us} | {med[0]:.0f} | {med[1] * 1e3:.2f} | "
            f"{med[2] * 1e3:.2f} | {cpu:.0f} ({med[3]:.0f} + {med[4]:.0f}) | "
            f"{med[5]:.0f} | {_batch_text(way.batches)} |"
        )
    for delay in args.delays:
        rate, p99 = medians[("padded", delay)]
        for other in ("ours, Triton-style", "Triton"):
            o_rate, o_p99 = medians[(other, delay)]
            print(
                f"delay {delay} µs: padded / {other}: throughput {rate / o_rate:.2f}x, "
                f"p99 {p99 / o_p99:.2f}x"
            )
        print(f"delay {delay} µs: padding waste (padded elements / real) {waste[delay]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--min-length", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument(
        "--delays",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[0, 2000],
        help="max_queue_delay_microseconds values, comma-separated (2000: the build's)",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=Tuning().instances,
        help="model instances (Triton's instance_group count, oipserve's "
        "--instances-per-device), each with one ORT thread when the machine's cores allow",
    )
    args = parser.parse_args()
    print("load average at the start " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        tuning = Tuning(instances=args.instances)
        ours = ServerProcess(
            _oipserve_repository(scratch / "oip", args.delays, tuning),
            ["--instances-per-device", str(args.instances)],
        ).wait_ready()
        triton = _start_triton(scratch, args.delays, tuning)
        try:
            if triton.error:
                raise SystemExit("Triton did not start: " + triton.error)
            ways = []
            for delay in args.delays:
                ways += [
                    Way("padded", delay, ours.host_port, f"padded_{delay}", ours.process.pid),
                    Way(
                        "ours, Triton-style",
                        delay,
                        ours.host_port,
                        f"plain_{delay}",
                        ours.process.pid,
                    ),
                    Way(
                        "Triton",
                        delay,
                        triton.http_url.removeprefix("http://"),
                        f"encoder_{delay}",
                        triton.root_pid(),
                    ),
                ]
            _check_same(ways)
            _run(ways, args)
            waste = {d: _waste(ours.metrics_url, f"padded_{d}") for d in args.delays}
        finally:
            triton.stop()
            ours.stop()
    _report(ways, args, waste)


if __name__ == "__main__":
    main()
