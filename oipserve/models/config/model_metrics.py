"""``model_metrics`` of a config.pbtxt: a model's own histogram buckets, Triton's syntax.

    model_metrics { metric_control [ {
        metric_identifier { family: "nv_inference_request_duration_histogram_us" }
        histogram_options { buckets: [ 100, 1000, 10000 ] }
    } ] }

Each entry names one latency histogram family (``HISTOGRAM_FAMILIES``) and gives its
upper bounds, in the family's unit (microseconds). They replace the default buckets
of that family for this model (``oipserve.telemetry.latency``); they only matter with
``--metrics-config histogram_latencies=true``, as in Triton. A malformed entry refuses
the model with the reason; an entry for Triton's first-response histogram (decoupled
models only, which oipserve does not serve) is ignored with a warning.
"""

from __future__ import annotations

import math
from typing import Any

from oipserve.models.config.field_values import MAX_MICROSECONDS

__all__ = ["HISTOGRAM_FAMILIES", "MAX_BUCKETS", "histogram_buckets"]

#: The latency histograms, in the order of their phases (``histogram_latencies=true``).
HISTOGRAM_FAMILIES = (
    "nv_inference_request_duration_histogram_us",
    "nv_inference_queue_duration_histogram_us",
    "nv_inference_compute_input_duration_histogram_us",
    "nv_inference_compute_infer_duration_histogram_us",
    "nv_inference_compute_output_duration_histogram_us",
)
#: Triton's histogram of decoupled models' first responses: valid there, never exported here.
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
#: Most buckets of one family (each is a line per version per scrape; a lookup is a bisect).
MAX_BUCKETS = 64
#: The largest bound: the largest double (Triton's bounds are doubles) not past
#: ``MAX_MICROSECONDS``, which itself is no double (it rounds up, past an int64 of ns: the
#: limit the docs gave was refused, found by fuzzing).
MAX_BOUND = float(MAX_MICROSECONDS)
if MAX_BOUND > MAX_MICROSECONDS:
    MAX_BOUND = math.nextafter(MAX_BOUND, 0.0)


def _bounds(buckets: Any, where: str) -> tuple[float, ...]:
    bounds = tuple(float(b) for b in buckets)
    if not bounds:
        raise ValueError(f"{where}.histogram_options.buckets must list at least one bound")
    if len(bounds) > MAX_BUCKETS:
        raise ValueError(
            f"{where}.histogram_options.buckets: {len(bounds)} bounds, at most {MAX_BUCKETS}"
        )
    for bound in bounds:
        if not math.isfinite(bound) or bound < 0 or bound > MAX_BOUND:
            raise ValueError(
                f"{where}.histogram_options.buckets: {bound!r} is not a duration "
                f"(a finite number of microseconds, 0 to {int(MAX_BOUND)}; +Inf is "
                "always the last bucket)"
            )
    if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise ValueError(
            f"{where}.histogram_options.buckets must increase strictly, got {list(bounds)}"
        )
    return bounds


def histogram_buckets(metrics: Any) -> tuple[dict[str, tuple[float, ...]], list[str]]:
    """(family -> upper bounds, ignored entries) of a parsed ``inference.ModelMetrics``.

    ValueError with the entry's path when an entry is malformed: no family, a family
    that is not a latency histogram, a family given twice, no ``histogram_options``,
    bounds that are empty, negative, not finite or not increasing.
    """
    buckets: dict[str, tuple[float, ...]] = {}
    ignored: list[str] = []
    for index, control in enumerate(metrics.metric_control):
        where = f"model_metrics.metric_control[{index}]"
        family = control.metric_identifier.family
        if not family:
            raise ValueError(f"{where}.metric_identifier.family is required")
        if family == FIRST_RESPONSE:
            ignored.append(f"{where} ({family}: decoupled models only)")
            continue
        if family not in HISTOGRAM_FAMILIES:
            raise ValueError(
                f"{where}.metric_identifier.family {family!r} is not a histogram family "
                f"(one of {', '.join(HISTOGRAM_FAMILIES)})"
            )
        if family in buckets:
            raise ValueError(f"{where}: family {family!r} is given twice")
        if not control.HasField("histogram_options"):
            raise ValueError(f"{where}.histogram_options is required (its buckets)")
        buckets[family] = _bounds(control.histogram_options.buckets, where)
    return buckets, ignored
