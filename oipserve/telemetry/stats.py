"""Per-model-version inference statistics: the recorder the inference path calls.

One ``ModelStats`` per model version counts what Triton's statistics extension and
its ``nv_inference_*`` metrics report: successful and failed requests with their
end-to-end time, queue time, the three compute phases, inferences (batch
elements) and executions (model runs, per batch size). Both views read these same
numbers (``oipserve.telemetry.stats_report`` as JSON/protobuf in ns, ``oipserve.telemetry.metrics``
as Prometheus counters in µs), so they never disagree.

Recording is plain integer arithmetic on attributes: the event loop is
single-threaded, so there are no locks, and a request allocates nothing here
(a batch size seen for the first time allocates its row once).

``StatsRegistry`` attaches one ``ModelStats`` to each ``ModelVersion`` object
without touching the model code: a dict keyed by the version object itself
(identity hash, one lookup, no key to build). A reload creates new
``ModelVersion`` objects, so its statistics start at zero, as in Triton; entries
of versions no longer in the model registry are dropped when the registry is
read or grows.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Iterator
from time import monotonic_ns
from typing import TYPE_CHECKING

from oipserve.config.metrics_config import parse_metrics_config
from oipserve.errors import DeadlineExceeded, Unavailable
from oipserve.telemetry.latency import Histograms, LatencyMetrics, SummaryWindow
from oipserve.telemetry.stats_row import StatsRow

if TYPE_CHECKING:
    from oipserve.config.settings import Settings
    from oipserve.models.registry import ModelRegistry, ModelVersion
    from oipserve.wire.messages import InferDone


class FailureReason(enum.StrEnum):
    """Why a request failed: the values of Triton's ``reason`` label."""

    #: Refused before running: overloaded (queue full), no running instance.
    REJECTED = "REJECTED"
    #: The client went away (its call was cancelled) before the answer.
    CANCELED = "CANCELED"
    #: The model (its worker) failed or refused while running the request.
    BACKEND = "BACKEND"
    #: Anything else, mostly a request that does not fit the model (validation).
    OTHER = "OTHER"


def refusal_reason(exc: BaseException) -> FailureReason:
    """Why a request failed before any worker saw it."""
    if isinstance(exc, asyncio.CancelledError):
        return FailureReason.CANCELED
    # overloaded, no running instance, out of shared memory, past its deadline
    if isinstance(exc, Unavailable | DeadlineExceeded):
        return FailureReason.REJECTED
    return FailureReason.OTHER


def failure_reason(exc: BaseException) -> FailureReason:
    """Why a request failed once sent: its worker failed it (or died), or the client left."""
    if isinstance(exc, asyncio.CancelledError):
        return FailureReason.CANCELED
    if isinstance(exc, DeadlineExceeded):
        return FailureReason.REJECTED
    return FailureReason.BACKEND


class BatchCounts:
    """Executions at one batch size and their summed step times (ns).

    PERF: attributes of a compiled class hold an int unboxed; the four-int list it
    replaced made three new int objects every model run (a ns sum is past the small-int
    cache)."""

    __slots__ = ("executions", "input_ns", "infer_ns", "output_ns")

    def __init__(self) -> None:
        self.executions = 0
        self.input_ns = 0
        self.infer_ns = 0
        self.output_ns = 0

    def as_list(self) -> list[int]:
        """[executions, input ns, infer ns, output ns] (``StatsRow.batches``' form)."""
        return [self.executions, self.input_ns, self.infer_ns, self.output_ns]


class ModelStats:
    """Cumulative counters of one model version; times in nanoseconds.

    Per request (``request_succeeded`` / ``request_failed``): success and fail
    counts and their end-to-end ns, queue ns, each request's share of its
    execution's compute ns, and inferences (the request's batch size). Per
    execution (``executed``): the execution count and, per batch size, the
    compute ns of those executions. The counts of queue and the compute phases are the
    success count less the response cache's hits (``answered_from_cache``), as in Triton.
    """

    __slots__ = (
        "name",
        "version",
        "last_success_ns",
        "success_count",
        "success_ns",
        "fail_count",
        "fail_ns",
        "failures",
        "queue_ns",
        "input_ns",
        "infer_ns",
        "output_ns",
        "inference_count",
        "execution_count",
        "batches",
        "pending",
        "histograms",
        "window",
        "cached",
        "cache_hit_count",
        "cache_hit_ns",
        "cache_miss_count",
        "cache_miss_ns",
        "padded",
        "padded_real",
    )

    def __init__(
        self,
        name: str,
        version: str,
        histograms: Histograms | None = None,
        window: SummaryWindow | None = None,
    ) -> None:
        self.name = name
        self.version = version
        #: The latency histograms and summary window (``--metrics-config``); None when off.
        self.histograms = histograms
        self.window = window
        #: ``monotonic_ns()`` of the last success; 0 before the first.
        self.last_success_ns = 0
        self.success_count = 0
        self.success_ns = 0
        self.fail_count = 0
        self.fail_ns = 0
        #: Failed requests by reason; every reason is present (Triton pre-creates all four).
        self.failures: dict[FailureReason, int] = dict.fromkeys(FailureReason, 0)
        self.queue_ns = 0
        self.input_ns = 0
        self.infer_ns = 0
        self.output_ns = 0
        #: Batch elements of successful requests (a batch-8 request adds 8).
        self.inference_count = 0
        #: Model executions; one batch of many requests adds 1.
        self.execution_count = 0
        #: Batch size -> executions and step times at that size.
        self.batches: dict[int, BatchCounts] = {}
        #: Requests accepted and not yet executing (a gauge; the caller adds and subtracts).
        self.pending = 0
        #: Whether the version's requests go through the response cache (its metrics shown).
        self.cached = False
        #: Response cache lookups that hit (ns: the lookups) and that missed (ns: the
        #: lookups and the stores of their answers), as Triton counts them.
        self.cache_hit_count = 0
        self.cache_hit_ns = 0
        self.cache_miss_count = 0
        self.cache_miss_ns = 0
        #: Padded batching (``pad_batch``): the padded inputs' elements its batches held,
        #: padding included, and those the requests really had (waste: their ratio).
        self.padded = 0
        self.padded_real = 0

    def request_succeeded(
        self,
        batch_size: int,
        total_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        """One request answered; compute ns are its share of the execution it was part of."""
        self.requests_succeeded(1, batch_size, total_ns, queue_ns, input_ns, infer_ns, output_ns)
        # PERF: off (the default), two tests; on, see oipserve.telemetry.latency.
        if self.histograms is not None:
            self.histograms.observe(total_ns, queue_ns, input_ns, infer_ns, output_ns)
        if self.window is not None:
            self.window.observe(
                self.last_success_ns, total_ns, queue_ns, input_ns, infer_ns, output_ns
            )

    @property
    def per_request(self) -> bool:
        """Whether each success must be observed on its own (``request_succeeded``):
        latency histograms or a summary window are on; otherwise a batch's successes
        may be counted in at once (``requests_succeeded``)."""
        return self.histograms is not None or self.window is not None

    def requests_succeeded(
        self,
        count: int,
        batch_size: int,
        total_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        """``count`` requests of one execution answered, the ns summed over them: the same
        counters as ``count`` calls of ``request_succeeded``, when not ``per_request``.
        PERF: one call a batch, not one a request (dynamic batching)."""
        self.success_count += count
        self.success_ns += total_ns
        self.queue_ns += queue_ns
        self.input_ns += input_ns
        self.infer_ns += infer_ns
        self.output_ns += output_ns
        self.inference_count += batch_size
        # PERF: the monotonic clock costs half of time.time_ns() // 10**6 per request;
        #   last_inference_ms converts once, when read.
        self.last_success_ns = monotonic_ns()

    def answered_from_cache(self, total_ns: int) -> None:
        """A request the response cache answered: a success, neither an inference nor an
        execution (Triton's counts); observed in the latency families with no queue or
        compute time, so their ``_count`` stays the success count."""
        self.success_count += 1
        self.success_ns += total_ns
        self.last_success_ns = now = monotonic_ns()
        if self.histograms is not None:
            self.histograms.observe(total_ns, 0, 0, 0, 0)
        if self.window is not None:
            self.window.observe(now, total_ns, 0, 0, 0, 0)

    @property
    def last_inference_ms(self) -> int:
        """Milliseconds since the epoch of the last success; 0 before the first."""
        if not self.last_success_ns:
            return 0
        return (time.time_ns() - monotonic_ns() + self.last_success_ns) // 1_000_000

    def request_failed(self, reason: FailureReason, total_ns: int) -> None:
        """One request failed, counted once, whatever failed."""
        self.fail_count += 1
        self.fail_ns += total_ns
        self.failures[reason] += 1

    def ran_alone(self, batch_size: int, start_ns: int, sent_ns: int, done: InferDone) -> None:
        """A request that was an execution of its own (no dynamic batching): both counts.

        ``start_ns`` is when the data plane got it, ``sent_ns`` when it went to the worker
        (queue time runs from there to the worker's start).
        """
        self.executed(batch_size, done.input_ns, done.infer_ns, done.output_ns)
        self.request_succeeded(
            batch_size,
            monotonic_ns() - start_ns,
            max(0, done.started_ns - sent_ns),
            done.input_ns,
            done.infer_ns,
            done.output_ns,
        )

    def ran_late(self, batch_size: int, done: InferDone) -> None:
        """A request failed at its deadline that its worker ran all the same: an execution
        (Triton counts every model run), not a success."""
        self.executed(batch_size, done.input_ns, done.infer_ns, done.output_ns)

    def padded_batch(self, elements: int, real: int) -> None:
        """One padded batch's padded inputs: ``elements`` with the padding, ``real`` without."""
        self.padded += elements
        self.padded_real += real

    def executed(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One model execution (one batch of ``batch_size`` elements) finished."""
        self.execution_count += 1
        counts = self.batches.get(batch_size)
        if counts is None:
            counts = self.batches[batch_size] = BatchCounts()
        counts.executions += 1
        counts.input_ns += input_ns
        counts.infer_ns += infer_ns
        counts.output_ns += output_ns

    def add(self, row: StatsRow) -> None:
        """Count another process's row of the same version in (``--http-workers``)."""
        self.success_count += row.success_count
        self.success_ns += row.success_ns
        self.fail_count += row.fail_count
        self.fail_ns += row.fail_ns
        for reason, count in row.failures.items():
            self.failures[FailureReason(reason)] += count
        self.queue_ns += row.queue_ns
        self.input_ns += row.input_ns
        self.infer_ns += row.infer_ns
        self.output_ns += row.output_ns
        self.inference_count += row.inference_count
        self.execution_count += row.execution_count
        for size, (executions, input_ns, infer_ns, output_ns) in row.batches.items():
            mine = self.batches.get(size)
            if mine is None:
                mine = self.batches[size] = BatchCounts()
            mine.executions += executions
            mine.input_ns += input_ns
            mine.infer_ns += infer_ns
            mine.output_ns += output_ns
        self.pending += row.pending
        self.cache_hit_count += row.cache[0]
        self.cache_hit_ns += row.cache[1]
        self.cache_miss_count += row.cache[2]
        self.cache_miss_ns += row.cache[3]
        self.padded += row.padding[0]
        self.padded_real += row.padding[1]
        if self.histograms is not None and row.histograms:
            self.histograms.add(row.histograms)
        # NOTE: CLOCK_MONOTONIC is one clock for every process of the machine.
        self.last_success_ns = max(self.last_success_ns, row.last_success_ns)

    def row(self, serial: int) -> StatsRow:
        """These counters, to send to the process that reports them (``--http-workers``)."""
        return StatsRow(
            serial,
            self.success_count,
            self.success_ns,
            self.fail_count,
            self.fail_ns,
            {str(reason): count for reason, count in self.failures.items() if count},
            self.queue_ns,
            self.input_ns,
            self.infer_ns,
            self.output_ns,
            self.inference_count,
            self.execution_count,
            {size: counts.as_list() for size, counts in self.batches.items()},
            self.pending,
            self.last_success_ns,
            self.histograms.snapshot() if self.histograms is not None else [],
            [self.cache_hit_count, self.cache_hit_ns, self.cache_miss_count, self.cache_miss_ns],
            [self.padded, self.padded_real],
        )


class StatsRegistry:
    """The ``ModelStats`` of every model version the model registry holds.

    With ``--http-workers``, the other fronts count the requests they answer themselves;
    ``collect`` (set by ``oipserve.scaleout``) fetches their rows, and the readers
    (``ready``, ``totals``) report this process's counters with theirs added.
    """

    def __init__(self, models: ModelRegistry) -> None:
        self._models = models
        self._stats: dict[ModelVersion, ModelStats] = {}
        #: Fetches the other fronts' rows; None when this process is the only front.
        self.collect: Callable[[], Awaitable[list[StatsRow]]] | None = None
        #: The rows of the last ``refresh``, by version serial.
        self._others: dict[int, list[StatsRow]] = {}
        #: Which latency histograms and summaries versions record (``configure``).
        self.latency = LatencyMetrics()
        #: Whether the server has a response cache (``--cache-config``): the versions whose
        #: config enables it then report its counters.
        self.cache_on = False

    def configure(self, settings: Settings) -> None:
        """Record what ``--metrics-config`` asks for (before the first request)."""
        self.latency = LatencyMetrics(parse_metrics_config(settings.metrics_config))

    async def refresh(self) -> None:
        """Before reading: the other fronts' counters as they are now."""
        if self.collect is None:
            return
        others: dict[int, list[StatsRow]] = {}
        for row in await self.collect():
            others.setdefault(row.serial, []).append(row)
        self._others = others

    def totals(self, model: ModelVersion) -> ModelStats:
        """What to report of a version: its counters here plus the other fronts' rows."""
        mine = self.of(model)
        rows = self._others.get(model.serial)
        if not rows:
            return mine
        # Bucket counts add up; the summaries' quantiles are this front's own window.
        histograms = mine.histograms.empty() if mine.histograms is not None else None
        total = ModelStats(model.name, model.version, histograms, mine.window)
        total.cached = mine.cached
        total.add(mine.row(model.serial))
        for row in rows:
            total.add(row)
        return total

    def of(self, model: ModelVersion) -> ModelStats:
        """The version's statistics, created at its first use."""
        stats = self._stats.get(model)
        if stats is None:
            self.prune()
            custom = model.config.histogram_buckets if model.config is not None else None
            stats = self._stats[model] = ModelStats(
                model.name,
                model.version,
                self.latency.histograms(custom),
                self.latency.window(),
            )
            config = model.config
            stats.cached = self.cache_on and config is not None and config.response_cache
        return stats

    def rows(self) -> list[StatsRow]:
        """Every counted version's counters, by serial (what another front reports)."""
        self.prune()
        return [stats.row(model.serial) for model, stats in self._stats.items()]

    def prune(self) -> None:
        """Forget versions that left the model registry (unloaded or replaced by a reload)."""
        models = self._models.models
        gone = [m for m in self._stats if models.get(m.name, {}).get(m.version) is not m]
        for model in gone:
            del self._stats[model]

    def ready(self, name: str | None = None) -> Iterator[tuple[ModelVersion, ModelStats]]:
        """Every READY version (of ``name``, or of all models) with its statistics
        (``totals``: what to report).

        Ordered by model name, then version number, so listings are stable.
        """
        self.prune()
        models = self._models.models
        names = sorted(models) if name is None else [name]
        for model_name in names:
            versions = models.get(model_name, {})
            for version in sorted(versions, key=_version_order):
                model = versions[version]
                if model.state == "READY":
                    yield model, self.totals(model)


def _version_order(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (0, version)
