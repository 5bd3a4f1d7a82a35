"""Latency histograms and summaries per model version (``--metrics-config``, docs/metrics.md).

Both are off by default; a version's ``ModelStats`` then holds ``None`` for each and a
request pays two ``is not None`` tests. When on, ``ModelStats.request_succeeded`` hands
them the five durations it already has (end to end, queue, the three compute phases).

**Histograms** (``histogram_latencies=true``): per family, the bucket a duration falls in
is one ``bisect`` on a tuple of bounds precomputed in nanoseconds, and one integer
added to a list made at the version's first request: no allocation, no division, no
clock read. Counts are kept per bucket and made cumulative when rendered. A histogram's
``_count`` and ``_sum`` are the success count and the cumulative duration the counters
already keep (every success is observed), so they agree with ``*_duration_us`` exactly.
Bucket counts add across ``--http-workers`` fronts like the counters.

**Summaries** (``summary_latencies=true``): quantiles over a sliding window of
``summary_max_age`` seconds. prometheus_client's Python Summary reports no quantiles,
and a CKMS stream (prometheus-cpp's, Triton's) costs a sorted insert and compression
per observation. Here the window is ``SLOTS`` time slots, each a fixed reservoir of
``CAPACITY`` observations of the five durations, allocated once (``array('q')``):
while a slot holds fewer than ``CAPACITY``, every observation is kept (quantiles are
exact); past that, each new one replaces a random kept one with probability
``CAPACITY / seen`` (Vitter's algorithm R: a uniform sample of the slot). A request
costs a division for its slot, five array stores, and past ``CAPACITY`` one
``random()``. The slot of the current ``max_age / SLOTS`` seconds is reused when its
time comes round (rotation: its count is reset, nothing is freed or allocated). A
scrape sorts the live slots' samples, each weighted by ``seen / kept`` of its slot.
The window therefore covers between ``(SLOTS - 1) / SLOTS`` and all of ``max_age``.
Memory: 5 families x SLOTS x CAPACITY x 8 bytes = 100 KiB per version, only when on.
``_count`` and ``_sum`` are cumulative (the counters), as in Prometheus and Triton.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Mapping
from fractions import Fraction
from random import random

import numpy as np

from oipserve.config.metrics_config import MetricsConfig
from oipserve.models.config.model_metrics import HISTOGRAM_FAMILIES

__all__ = [
    "CAPACITY",
    "DEFAULT_BUCKETS",
    "HISTOGRAM_FAMILIES",
    "SLOTS",
    "SUMMARY_FAMILIES",
    "Histograms",
    "LatencyMetrics",
    "SummaryWindow",
]

#: Triton's default upper bounds (microseconds) of each histogram family (core PR #474).
DEFAULT_BUCKETS: dict[str, tuple[float, ...]] = dict(
    zip(
        HISTOGRAM_FAMILIES,
        (
            (1000, 5000, 25000, 50000, 100000),
            (100, 1000, 5000, 10000, 50000),
            (100, 500, 1000, 5000, 10000),
            (1000, 5000, 25000, 50000, 100000),
            (100, 500, 1000, 5000, 10000),
        ),
        strict=True,
    )
)

#: Triton's summary families, in the same order of phases.
SUMMARY_FAMILIES = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)

#: Time slots of a summary's window, and observations kept per slot (and per phase).
SLOTS = 5
CAPACITY = 512


class Histograms:
    """The five latency histograms of one model version: counts per bucket."""

    __slots__ = ("bounds", "_bounds_ns", "counts")

    def __init__(self, bounds: tuple[tuple[float, ...], ...]) -> None:
        #: Upper bounds in microseconds, per family (``HISTOGRAM_FAMILIES`` order).
        self.bounds = bounds
        # PERF: compared with the nanoseconds as they come: no division per request, and
        #   int with int (an int-float comparison costs more). For whole nanoseconds,
        #   ns <= us * 1000 exactly when ns <= floor(us * 1000), the product taken exactly
        #   (in floats it may round below: a bound of 9223372036854774 us to ...3760 ns).
        self._bounds_ns = tuple(
            tuple(math.floor(Fraction(b) * 1000) for b in family) for family in bounds
        )
        #: Per family: observations per bucket, the last one past every bound (+Inf).
        self.counts = [[0] * (len(family) + 1) for family in bounds]

    def observe(self, total: int, queue: int, input_ns: int, infer: int, output: int) -> None:
        """One request's five durations (ns), each counted in the first bucket it fits."""
        bounds = self._bounds_ns
        counts = self.counts
        counts[0][bisect_left(bounds[0], total)] += 1
        counts[1][bisect_left(bounds[1], queue)] += 1
        counts[2][bisect_left(bounds[2], input_ns)] += 1
        counts[3][bisect_left(bounds[3], infer)] += 1
        counts[4][bisect_left(bounds[4], output)] += 1

    def empty(self) -> Histograms:
        """Histograms with the same bounds and no counts (to sum the fronts' into)."""
        return Histograms(self.bounds)

    def add(self, counts: list[list[int]]) -> None:
        """Another front's counts of the same version (same bounds) added in."""
        for mine, theirs in zip(self.counts, counts, strict=False):
            if len(mine) == len(theirs):
                for i, value in enumerate(theirs):
                    mine[i] += value

    def snapshot(self) -> list[list[int]]:
        return [list(family) for family in self.counts]


class SummaryWindow:
    """The recent durations of one model version, for the summaries' quantiles."""

    __slots__ = ("_slot_ns", "_index", "_seen", "_current", "_epochs", "_counts", "_samples")

    def __init__(self, max_age: float) -> None:
        self._slot_ns = max(1, int(max_age * 1e9 / SLOTS))
        #: Per slot: its time slot number (``now // slot_ns``), observations seen, samples.
        self._epochs = [-SLOTS] * SLOTS
        self._counts = [0] * SLOTS
        self._samples = [
            tuple(array("q", bytes(8 * CAPACITY)) for _ in SUMMARY_FAMILIES) for _ in range(SLOTS)
        ]
        self._index = 0
        #: Observations of the current slot (written back to ``_counts`` when read).
        self._seen = 0
        self._current = self._samples[0]

    def observe(
        self, now: int, total: int, queue: int, input_ns: int, infer: int, output: int
    ) -> None:
        """One request's durations (ns) at ``now`` (``monotonic_ns``)."""
        epoch = now // self._slot_ns
        if epoch != self._epochs[self._index]:
            self._rotate(epoch)
        seen = self._seen
        self._seen = seen + 1
        if seen >= CAPACITY:
            # Algorithm R: the slot stays a uniform sample of everything it has seen.
            seen = int(random() * (seen + 1))
            if seen >= CAPACITY:
                return
        current = self._current
        current[0][seen] = total
        current[1][seen] = queue
        current[2][seen] = input_ns
        current[3][seen] = infer
        current[4][seen] = output

    def _rotate(self, epoch: int) -> None:
        self._counts[self._index] = self._seen
        self._index = epoch % SLOTS
        self._epochs[self._index] = epoch
        self._counts[self._index] = 0
        self._seen = 0
        self._current = self._samples[self._index]

    def quantiles(self, now: int, wanted: tuple[float, ...]) -> list[list[float]]:
        """Per family, the ``wanted`` quantiles (microseconds) of the last ``max_age``
        seconds; NaN each when nothing was observed in it (Prometheus' convention)."""
        self._counts[self._index] = self._seen
        oldest = now // self._slot_ns - SLOTS
        live = [i for i in range(SLOTS) if self._epochs[i] > oldest and self._counts[i] > 0]
        return [self._family_quantiles(family, live, wanted) for family in range(5)]

    def _family_quantiles(
        self, family: int, live: list[int], wanted: tuple[float, ...]
    ) -> list[float]:
        if not live:
            return [math.nan] * len(wanted)
        # PERF: numpy, not tuples in a list: a full window (2,560 values a phase) sorts in
        #   tens of microseconds instead of milliseconds on the event loop.
        kept = [min(self._counts[slot], CAPACITY) for slot in live]
        values = np.concatenate(
            [
                np.frombuffer(self._samples[slot][family], dtype=np.int64, count=count)
                for slot, count in zip(live, kept, strict=True)
            ]
        )
        weights = np.concatenate(
            [
                np.full(count, self._counts[slot] / count)
                for slot, count in zip(live, kept, strict=True)
            ]
        )
        order = np.argsort(values, kind="stable")
        running = np.cumsum(weights[order])
        targets = np.asarray(wanted) * running[-1]
        # The first value whose running weight reaches q of the total (clipped: rounding).
        found = np.minimum(np.searchsorted(running, targets, side="left"), len(values) - 1)
        return [float(v) / 1000 for v in values[order[found]]]


class LatencyMetrics:
    """What ``--metrics-config`` asks for, and the recorders it gives each version."""

    def __init__(self, config: MetricsConfig | None = None) -> None:
        self.config = config or MetricsConfig()
        self.quantiles = tuple(q for q, _ in self.config.summary_quantiles)

    def histograms(self, custom: Mapping[str, tuple[float, ...]] | None) -> Histograms | None:
        """A version's histograms (its ``model_metrics`` buckets over the defaults), or None."""
        if not self.config.histogram_latencies:
            return None
        custom = custom or {}
        return Histograms(tuple(custom.get(f) or DEFAULT_BUCKETS[f] for f in HISTOGRAM_FAMILIES))

    def window(self) -> SummaryWindow | None:
        """A version's summary window, or None."""
        if not self.config.summary_latencies:
            return None
        return SummaryWindow(self.config.summary_max_age)
