"""``--metrics-config KEY=VALUE``: Triton's switches for the latency metrics.

Triton's flag is repeatable and takes one ``key=value`` each; these are its keys
(docs/metrics.md):

- ``counter_latencies`` (default true): the five cumulative ``*_duration_us`` counters;
- ``histogram_latencies`` (default false): the five ``*_duration_histogram_us`` histograms;
- ``summary_latencies`` (default false): the five ``*_summary_us`` summaries;
- ``summary_quantiles``: ``q:error,q:error,...`` (Triton's default below);
- ``summary_max_age``: seconds the summaries' sliding window covers. Triton has no key for
  it (prometheus-cpp's fixed 60 s); ours takes the same default.

Unlike Triton, which logs and ignores what it cannot read, an unknown key or a bad
value stops start-up with the reason (exit 2): a dashboard that silently gets no
histogram is worse than a refused flag.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

__all__ = ["DEFAULT_QUANTILES", "MetricsConfig", "MetricsConfigError", "parse_metrics_config"]

#: Triton's default summary quantiles, (quantile, allowed error) pairs.
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.000001),
)
#: Seconds of the summaries' sliding window (prometheus-cpp's default, which Triton uses).
DEFAULT_MAX_AGE = 60.0
#: Longest window accepted: one day (the window's slots are rotated, never scanned).
MAX_AGE_LIMIT = 86_400.0
#: Most quantiles a summary may report (each is a line per family and version per scrape).
MAX_QUANTILES = 32


class MetricsConfigError(ValueError):
    """A ``--metrics-config`` item that cannot be used; the message says why."""


class MetricsConfig(msgspec.Struct, frozen=True):
    """What the latency metrics record and report."""

    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    summary_max_age: float = DEFAULT_MAX_AGE


def _bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise MetricsConfigError(f"{key} must be true or false, got {value!r}")


def _number(text: str, what: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise MetricsConfigError(f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(number):
        raise MetricsConfigError(f"{what} must be a finite number, got {text!r}")
    return number


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    """``0.5:0.05,0.9:0.01``: each quantile in (0, 1), each error in [0, 1), no repeats."""
    pairs: list[tuple[float, float]] = []
    for item in value.strip().strip('"').split(","):
        quantile, colon, error = item.strip().partition(":")
        if not colon:
            raise MetricsConfigError(
                f"summary_quantiles: {item.strip()!r} is not <quantile>:<error> (e.g. 0.99:0.001)"
            )
        q = _number(quantile, "summary_quantiles: a quantile")
        e = _number(error, "summary_quantiles: an error")
        if not 0 < q < 1 or not 0 <= e < 1:
            raise MetricsConfigError(
                f"summary_quantiles: {item.strip()!r}: the quantile must be between 0 and 1 "
                "(exclusive), the error at least 0 and below 1"
            )
        if any(q == seen for seen, _ in pairs):
            raise MetricsConfigError(f"summary_quantiles: quantile {q:g} is given twice")
        pairs.append((q, e))
    if len(pairs) > MAX_QUANTILES:
        raise MetricsConfigError(f"summary_quantiles: at most {MAX_QUANTILES} quantiles")
    return tuple(sorted(pairs))


def _max_age(value: str) -> float:
    seconds = _number(value, "summary_max_age")
    if not 1 <= seconds <= MAX_AGE_LIMIT:
        raise MetricsConfigError(
            f"summary_max_age must be between 1 and {MAX_AGE_LIMIT:g} seconds, got {value!r}"
        )
    return seconds


_BOOLEANS = ("counter_latencies", "histogram_latencies", "summary_latencies")


def parse_metrics_config(items: Iterable[str]) -> MetricsConfig:
    """The ``key=value`` items of ``--metrics-config``, later ones winning, checked."""
    values: dict[str, object] = {}
    for item in items:
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key:
            raise MetricsConfigError(f"{item!r} is not <key>=<value>")
        if key in _BOOLEANS:
            values[key] = _bool(key, value)
        elif key == "summary_quantiles":
            values[key] = _quantiles(value)
        elif key == "summary_max_age":
            values[key] = _max_age(value)
        else:
            known = ", ".join((*_BOOLEANS, "summary_quantiles", "summary_max_age"))
            raise MetricsConfigError(f"unknown key {key!r} (known: {known})")
    return msgspec.convert(values, MetricsConfig)
