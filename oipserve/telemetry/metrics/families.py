"""What ``/metrics`` reports, built at scrape time from the statistics and the hardware.

The per-model families read ``oipserve.telemetry.stats.ModelStats`` directly (a request
costs nothing extra for metrics): Triton's names, types, help texts and labels
(``model``, ``version``; ``reason`` on failures, all four present from the
version's first appearance). Durations are the statistics' nanoseconds in whole
microseconds, so ``/metrics`` and the statistics extension agree.

The host families are Triton's CPU and GPU gauges, from the same hardware
inventory that ``/v2/hardware`` shows (the fake one under ``--hardware-inventory``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import psutil

from hardware import Inventory
from oipserve.telemetry.latency import HISTOGRAM_FAMILIES, SUMMARY_FAMILIES, LatencyMetrics
from oipserve.telemetry.metrics.exposition import Family, Labels, MetricType, format_bound
from oipserve.telemetry.stats import FailureReason, ModelStats

if TYPE_CHECKING:
    from oipserve.models.registry import ModelVersion

#: (name, type, help) of the per-model families, in the order they are rendered.
_MODEL_FAMILIES: tuple[tuple[str, MetricType, str], ...] = (
    (
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
    ),
    (
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
    ),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (does not include cached requests)",
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds "
        "(does not include cached requests)",
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
)


#: The five ``*_duration_us`` counters (``--metrics-config counter_latencies=false`` drops them).
_DURATION_COUNTERS = frozenset(name for name, _, _ in _MODEL_FAMILIES if name.endswith("_us"))

#: Help texts of the histograms (core PR #474's) and summaries (Triton's), by phase.
_HISTOGRAM_HELP = (
    "Histogram of end-to-end inference request duration in microseconds",
    "Histogram of inference queuing duration in microseconds",
    "Histogram of compute input duration in microseconds",
    "Histogram of compute inference duration in microseconds",
    "Histogram of compute output duration in microseconds",
)
_SUMMARY_HELP = (
    "Summary of inference request duration in microseconds (includes cached requests)",
    "Summary of inference queuing duration in microseconds (includes cached requests)",
    "Summary of compute input duration in microseconds (does not include cached requests)",
    "Summary of compute inference duration in microseconds (does not include cached requests)",
    "Summary of compute output duration in microseconds (does not include cached requests)",
)


def model_families(versions: Iterable[ModelStats], counters: bool = True) -> list[Family]:
    """Triton's per-model counters and pending gauge for every version given (without
    the ``*_duration_us`` counters when ``counters`` is false)."""
    families = [Family(name, kind, text) for name, kind, text in _MODEL_FAMILIES]
    (
        success,
        failure,
        count,
        executions,
        request_us,
        queue_us,
        input_us,
        infer_us,
        output_us,
        pending,
    ) = families
    for stats in versions:
        labels: Labels = (("model", stats.name), ("version", stats.version))
        success.add(labels, stats.success_count)
        for reason in FailureReason:
            failure.add((*labels, ("reason", reason.value)), stats.failures[reason])
        count.add(labels, stats.inference_count)
        executions.add(labels, stats.execution_count)
        request_us.add(labels, stats.success_ns // 1000)
        queue_us.add(labels, stats.queue_ns // 1000)
        input_us.add(labels, stats.input_ns // 1000)
        infer_us.add(labels, stats.infer_ns // 1000)
        output_us.add(labels, stats.output_ns // 1000)
        pending.add(labels, stats.pending)
    if not counters:
        return [f for f in families if f.name not in _DURATION_COUNTERS]
    return families


#: Triton's response cache counters (name, help), in the order they are rendered.
_CACHE_FAMILIES: tuple[tuple[str, str], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
    ),
)


def cache_families(versions: Iterable[ModelStats]) -> list[Family]:
    """Triton's four response cache counters of the versions whose cache is on; no family
    when none is (Triton shows them only with a cache configured)."""
    cached = [stats for stats in versions if stats.cached]
    if not cached:
        return []
    hits, misses, hit_us, miss_us = (
        Family(name, "counter", text) for name, text in _CACHE_FAMILIES
    )
    for stats in cached:
        labels: Labels = (("model", stats.name), ("version", stats.version))
        hits.add(labels, stats.cache_hit_count)
        misses.add(labels, stats.cache_miss_count)
        hit_us.add(labels, stats.cache_hit_ns // 1000)
        miss_us.add(labels, stats.cache_miss_ns // 1000)
    return [hits, misses, hit_us, miss_us]


def padding_families(versions: Iterable[ModelStats]) -> list[Family]:
    """Padded batching's elements (docs/scheduler.md, "Padded batching") of the versions
    that ran padded batches: with the padding and without; their ratio is the waste."""
    padded = [stats for stats in versions if stats.padded]
    if not padded:
        return []
    with_pad = Family(
        "oipserve_pad_batch_elements",
        "counter",
        "Elements of the padded inputs in padded batches, padding included",
    )
    real = Family(
        "oipserve_pad_batch_real_elements",
        "counter",
        "Elements of the padded inputs the requests of padded batches really held",
    )
    for stats in padded:
        labels: Labels = (("model", stats.name), ("version", stats.version))
        with_pad.add(labels, stats.padded)
        real.add(labels, stats.padded_real)
    return [with_pad, real]


def _sums(stats: ModelStats) -> tuple[int, ...]:
    """Cumulative ns of the five phases, in ``HISTOGRAM_FAMILIES`` order."""
    return (stats.success_ns, stats.queue_ns, stats.input_ns, stats.infer_ns, stats.output_ns)


def histogram_families(versions: Iterable[ModelStats]) -> list[Family]:
    """The five latency histograms of the versions that record them (cumulative buckets;
    ``_sum`` and ``_count`` are the counters': every success is observed)."""
    families = [
        Family(name, "histogram", text)
        for name, text in zip(HISTOGRAM_FAMILIES, _HISTOGRAM_HELP, strict=True)
    ]
    for stats in versions:
        if stats.histograms is None:
            continue
        labels: Labels = (("model", stats.name), ("version", stats.version))
        histograms = stats.histograms
        for family, bounds, counts, total_ns in zip(
            families, histograms.bounds, histograms.counts, _sums(stats), strict=True
        ):
            running = 0
            for bound, count in zip((*bounds, float("inf")), counts, strict=True):
                running += count
                family.add((*labels, ("le", format_bound(bound))), running, "_bucket")
            family.add(labels, total_ns // 1000, "_sum")
            family.add(labels, stats.success_count, "_count")
    return families


def summary_families(
    versions: Iterable[ModelStats], latency: LatencyMetrics, now: int
) -> list[Family]:
    """The five latency summaries of the versions that record them: the configured
    quantiles over the window ending at ``now`` (``monotonic_ns``), cumulative sum, count."""
    families = [
        Family(name, "summary", text)
        for name, text in zip(SUMMARY_FAMILIES, _SUMMARY_HELP, strict=True)
    ]
    for stats in versions:
        if stats.window is None:
            continue
        labels: Labels = (("model", stats.name), ("version", stats.version))
        found = stats.window.quantiles(now, latency.quantiles)
        for family, values, total_ns in zip(families, found, _sums(stats), strict=True):
            for quantile, value in zip(latency.quantiles, values, strict=True):
                family.add((*labels, ("quantile", format_bound(quantile))), value)
            family.add(labels, total_ns // 1000, "_sum")
            family.add(labels, stats.success_count, "_count")
    return families


def load_duration_family(models: Iterable[ModelVersion]) -> Family:
    """``nv_model_load_duration_secs``: how long each version took to load (Triton's gauge)."""
    family = Family("nv_model_load_duration_secs", "gauge", "Model load time in seconds")
    for model in models:
        family.add((("model", model.name), ("version", model.version)), model.load_seconds)
    return family


def host_families(inventory: Inventory, cpu_utilization: float) -> list[Family]:
    """Triton's CPU gauges, and its GPU gauges (label ``gpu_uuid``) when there are GPUs."""
    cpu = inventory.cpu
    families = [
        Family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]"),
        Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes"),
        Family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes"),
    ]
    families[0].add((), cpu_utilization)
    families[1].add((), cpu.memory_total)
    families[2].add((), max(0, cpu.memory_total - cpu.memory_available))
    if not inventory.gpus:
        return families
    utilization = Family("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)")
    total = Family("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes")
    used = Family("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes")
    for gpu in inventory.gpus:
        labels: Labels = (("gpu_uuid", gpu.uuid),)
        if gpu.utilization is not None:  # None where the device does not say (MIG)
            utilization.add(labels, gpu.utilization / 100)
        total.add(labels, gpu.memory_total)
        used.add(labels, max(0, gpu.memory_total - gpu.memory_free))
    return [*families, utilization, total, used]


def cpu_utilization() -> float:
    """System-wide CPU use since the previous call, 0.0 to 1.0 (0.0 on the first call).

    Like Triton's, measured over the interval between two readings of /proc/stat
    (here: between two scrapes); it never blocks.
    """
    return psutil.cpu_percent(interval=None) / 100
