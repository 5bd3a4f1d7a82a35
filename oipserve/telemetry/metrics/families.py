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

import psutil

from hardware import Inventory
from oipserve.telemetry.metrics.exposition import Family, Labels, MetricType
from oipserve.telemetry.stats import FailureReason, ModelStats

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


def model_families(versions: Iterable[ModelStats]) -> list[Family]:
    """Triton's per-model counters and pending gauge for every version given."""
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
    return families


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
