"""What recording statistics costs one request, measured in-process (no server).

Times, best of several repeats, per call:
- the data plane's recording for one successful unbatched request (``ModelStats``
  lookup, three clock reads, the pending gauge, ``executed`` and
  ``request_succeeded``), against the same control flow without it;
- encoding and decoding one ``InferDone`` with and without its four timing fields;
- one ``time.monotonic_ns()`` (the worker adds three per request);
- the same recording with ``--metrics-config histogram_latencies=true``, with
  ``summary_latencies=true`` and with both, against it off: the variants are timed in
  turn within each repeat (interleaved), so a noisy neighbour slows them alike.

    python benchmarks/stats_overhead.py

The figures are in docs/metrics.md. ``/metrics`` adds nothing per request: it reads
these counters when scraped.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path
from time import monotonic_ns

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402

from oipserve.config.metrics_config import parse_metrics_config  # noqa: E402
from oipserve.models.registry import ModelRegistry, ModelVersion  # noqa: E402
from oipserve.telemetry.latency import LatencyMetrics  # noqa: E402
from oipserve.telemetry.stats import StatsRegistry  # noqa: E402
from oipserve.wire.messages import FromWorker, InferDone, TensorDesc  # noqa: E402

CALLS = 1_000_000
REPEATS = 7
#: Rounds of the ``--metrics-config`` variants, each timed once per round (best kept).
INTERLEAVED_REPEATS = 51


class _Done:
    """The timing fields of a reply, as the data plane reads them."""

    started_ns = 5
    input_ns = 10
    infer_ns = 20
    output_ns = 30


class _Input:
    shape = [1, 16]


def _best_ns(func: object, number: int = CALLS) -> float:
    return min(timeit.repeat(func, number=number, repeat=REPEATS)) / number * 1e9  # type: ignore[arg-type]


def main() -> None:
    registry = ModelRegistry()
    model = ModelVersion("simple", "1", "/nowhere", None)
    model.state = "READY"
    model.max_batch_size = 8
    registry.models["simple"] = {"1": model}
    stats_registry = StatsRegistry(registry)
    done = _Done()
    inputs = [_Input()]

    def recorded() -> None:  # the lines DataPlane.infer adds, in its order
        stats = stats_registry.of(model)
        start = monotonic_ns()
        batch = inputs[0].shape[0] if model.max_batch_size > 0 and inputs[0].shape else 1
        stats.pending += 1
        sent = monotonic_ns()
        try:
            pass  # the await of the worker's reply
        finally:
            stats.pending -= 1
        stats.ran_alone(batch, start, sent, done)

    def bare() -> None:
        try:
            pass
        finally:
            pass

    with_stats, without = _best_ns(recorded), _best_ns(bare)
    print(f"front, per request: {with_stats - without:.0f} ns ({with_stats:.0f} - {without:.0f})")

    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(FromWorker)
    descs = [
        TensorDesc("OUTPUT0", "INT32", [1, 16], "oipserve-1-w1-3", 0, 64),
        TensorDesc("OUTPUT1", "INT32", [1, 16], "oipserve-1-w1-3", 64, 64),
    ]
    plain = InferDone(1, "oipserve-1-w1-3", descs, [])
    timed = InferDone(1, "oipserve-1-w1-3", descs, [], monotonic_ns(), 12_345, 67_890, 23_456)
    costs = []
    for message in (plain, timed):
        size = len(encoder.encode(message))
        cost = _best_ns(lambda m=message: decoder.decode(encoder.encode(m)), 200_000)
        costs.append(cost)
        print(f"InferDone: {size} bytes, {cost:.0f} ns to encode and decode")
    print(f"InferDone timing fields: {costs[1] - costs[0]:.0f} ns")
    print(f"time.monotonic_ns(): {_best_ns(monotonic_ns):.0f} ns")
    _latency_metrics(model, done, inputs)


#: ``--metrics-config`` of each variant timed by ``_latency_metrics``.
VARIANTS = {
    "off": [],
    "histograms": ["histogram_latencies=true"],
    "summaries": ["summary_latencies=true"],
    "both": ["histogram_latencies=true", "summary_latencies=true"],
}


def _latency_metrics(model: ModelVersion, done: _Done, inputs: list[_Input]) -> None:
    """Per request, the recording with each ``VARIANTS`` entry; interleaved repeats."""
    calls: dict[str, object] = {}
    for name, items in VARIANTS.items():
        stats_registry = StatsRegistry(model_registry(model))
        stats_registry.latency = LatencyMetrics(parse_metrics_config(items))

        def recorded(stats_registry: StatsRegistry = stats_registry) -> None:
            stats = stats_registry.of(model)
            start = monotonic_ns()
            batch = inputs[0].shape[0] if model.max_batch_size > 0 and inputs[0].shape else 1
            stats.pending += 1
            sent = monotonic_ns()
            try:
                pass
            finally:
                stats.pending -= 1
            stats.ran_alone(batch, start, sent, done)

        calls[name] = recorded
    best = dict.fromkeys(VARIANTS, float("inf"))
    number = CALLS // 50
    for _ in range(INTERLEAVED_REPEATS):
        for name, call in calls.items():
            took = timeit.timeit(call, number=number) / number * 1e9  # type: ignore[arg-type]
            best[name] = min(best[name], took)
    for name in VARIANTS:
        extra = best[name] - best["off"]
        print(f"front, per request, --metrics-config {name}: {best[name]:.0f} ns ({extra:+.0f} ns)")


def model_registry(model: ModelVersion) -> ModelRegistry:
    registry = ModelRegistry()
    registry.models[model.name] = {model.version: model}
    return registry


if __name__ == "__main__":
    main()
