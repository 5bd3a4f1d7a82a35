"""Requests of a model with ``dynamic_batching``: queued in its batcher, run as one batch.

``strategies.Batched`` checks a request as for any model, then hands it here. ``infer``
puts it in the model version's ``DynamicBatcher`` (oipserve.scheduling.scheduler), which
decides when and with which others it runs; ``_run_batch`` runs a batch on a free
instance: one request alone goes as it is (its data where it lies, as without batching);
several are joined into one segment (``batch_io.assemble``, one copy of each request's
bytes). The batch goes to the worker as any request does (``dispatch``), and the reply is
cut back into one ``InferResult`` per request, each a view of the worker's output segment,
which goes back to the worker once every request has released its part. Requests that
asked for different outputs share a batch, as in Triton: it computes every output any of
them asked for, and each result keeps its own request's (``_outputs``, ``_own_outputs``).

A model with ragged batching (``allow_ragged_batch``, ``batch_input``, ``batch_output``)
gets a ``ragged.RaggedLayout`` with its batcher, one with padded batching (the ``pad_batch``
parameter) a ``padding.PaddedLayout`` and its waste bound as the batcher's admission; both
are chosen once, when the batcher is made: the model's requests are grouped by the
layout's signature and its batches, even of one request, are laid out and cut by it
(``_run_laid_out``). ``batching_policy`` gives such a model
without ``dynamic_batching`` a batcher that runs one request per execution.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic_ns
from typing import Final

from oipserve.dataplane.batch_io import SharedRelease, assemble, batch_size
from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.padding import PaddedLayout
from oipserve.dataplane.ragged import RaggedLayout
from oipserve.errors import (
    DeadlineExceeded,
    InternalError,
    Withdrawn,
    cancelled_by_client,
)
from oipserve.models.config.parse import ModelConfig
from oipserve.models.registry import ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request.checks import rows_of
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import Inference, InferResult, client_outputs
from oipserve.request.placement import Placement, place
from oipserve.scheduling.policy import BatchPolicy
from oipserve.scheduling.scheduler import DynamicBatcher, Entry, QueueRejected
from oipserve.telemetry.stats import FailureReason, ModelStats, failure_reason, refusal_reason
from oipserve.wire.messages import InferDone
from oipserve.wire.shm import BufferPool, Lease

__all__ = ["BatchRunner", "CrossedAnswer", "batching_policy"]

#: Resolution of the loop's timers (libuv counts milliseconds).
_TIMER_GRAIN: Final = 0.001

#: The batcher of a ragged-batching model without ``dynamic_batching``: one request per
#: execution, at once (Triton's default scheduler), so that its batch inputs are made.
_ONE_AT_A_TIME: Final = BatchPolicy(max_batch_size=0)


def batching_policy(config: ModelConfig | None) -> BatchPolicy | None:
    """The batcher's policy of a model: its ``dynamic_batching``, or one request at a time
    for a model with ragged batching (whose requests need the batch's layout), or None."""
    if config is None:
        return None
    if config.dynamic_batching is None and config.batch_io is not None:
        return _ONE_AT_A_TIME
    return config.dynamic_batching


class _Queued:
    """What a batch needs from one queued request."""

    __slots__ = (
        "placements",
        "outputs",
        "owned",
        "rows",
        "taken",
        "start",
        "stats",
        "future",
        "deadline",
        "queue_due",
    )

    def __init__(
        self,
        placements: list[Placement],
        outputs: list[str],
        owned: list[Lease | RegionUse],
        rows: int,
        start: int,
        stats: ModelStats,
    ) -> None:
        self.placements = placements
        self.outputs = outputs
        self.owned = owned
        #: Its inputs' first dimension (1 for a model without a batch dimension).
        self.rows = rows
        #: In a batch: the batch now owns (and frees) its input leases.
        self.taken = False
        #: ``monotonic_ns()`` when the data plane got it; its statistics.
        self.start = start
        self.stats = stats
        #: Where its answer goes, and when (loop time) it fails wherever it is.
        self.future: asyncio.Future[InferResult] | None = None
        self.deadline = 0.0
        #: Its queue timeout (REJECT) falls due with its deadline: the deadline's failure
        #: is the queue's (``_expire``).
        self.queue_due = False

    def release_inputs(self) -> None:
        owned, self.owned = self.owned, []
        for held in owned:
            held.release()


def _signature(placements: list[Placement]) -> tuple[object, ...]:
    """What requests must agree on to share a batch: their inputs, all but each one's first
    dim. Not the outputs they ask for: as in Triton, the batch computes every output any
    of them asked for, and each gets its own (``_outputs``, ``_own_outputs``)."""
    if len(placements) == 1:  # PERF: the usual case; the same value, nothing to sort
        tensor, shape, _, _ = placements[0]
        return ((tensor.name, tensor.datatype, tuple(shape[1:]), tensor.image),)
    return tuple(
        sorted(
            (tensor.name, tensor.datatype, tuple(shape[1:]), tensor.image)
            for tensor, shape, _, _ in placements
        )
    )


def _outputs(requests: list[_Queued]) -> list[str]:
    """The outputs a batch computes: every one that some request asked for ([]: all)."""
    first = requests[0].outputs
    # PERF: a plain loop (no generator): this runs once a batch, in the hot path.
    for request in requests:
        if request.outputs != first:
            break
    else:
        return first  # the usual case: every request asked for the same
    if not all(r.outputs for r in requests):
        return []
    return list(dict.fromkeys(name for r in requests for name in r.outputs))


def _own_outputs(requests: list[_Queued], computed: list[str], results: list[InferResult]) -> None:
    """Each result cut down to the outputs its request asked for, in its order, where the
    batch computed more (requests that asked for different outputs)."""
    for request, result in zip(requests, results, strict=True):
        if request.outputs and request.outputs != computed:
            by_name = {tensor.name: tensor for tensor in result.outputs}
            result.outputs = [by_name[name] for name in request.outputs]


def _queue_due_first(policy: BatchPolicy, entry: Entry, start: int, remaining: float) -> bool:
    """Whether a request's REJECT queue timeout falls due no later than its deadline
    (``remaining`` seconds away; the queue timeout counts from when it was queued, the
    deadline from its arrival at ``start``), give or take the loop timers' grain."""
    if policy.policy(entry.level).timeout_action != "REJECT":
        return False
    queue_timeout = (entry.due_ns - entry.enqueued_ns) / 1e9
    waited = (monotonic_ns() - start) / 1e9
    return queue_timeout <= remaining + waited + _TIMER_GRAIN


class _Deadlines:
    """Fails each request of a ``BatchRunner`` at its deadline, queued or running, with
    one loop timer for all the requests whose deadlines come in arrival order.

    PERF: a timer per request (``call_at`` and its ``cancel``) cost ~4 µs of the front's
    CPU per request (uvloop makes a libuv timer for each). The deadlines are nearly always
    the server's ``--infer-timeout`` from arrival, so they come in the order the requests
    do: those wait here in that order (a dict: removed in O(1) when answered), and one
    timer is set for the oldest. A deadline earlier than one already here (a request's own
    shorter ``timeout``) gets a timer of its own, as before. Either way a request fails
    when the loop's timer for its deadline would have fired it.
    """

    __slots__ = ("_loop", "_due", "_latest", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        #: In deadline order (insertion order: a deadline goes in only if none is later).
        self._due: dict[_Queued, None] = {}
        self._latest = float("-inf")
        #: Set for the oldest's deadline (or earlier: one answered since), or None.
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, queued: _Queued) -> asyncio.TimerHandle | None:
        """Fail ``queued`` at its deadline unless ``forget`` comes first; a request with a
        timer of its own gets it back (the caller cancels it instead)."""
        deadline = queued.deadline
        if deadline < self._latest:
            return self._loop.call_at(deadline, _expire_queued, queued)
        self._latest = deadline
        self._due[queued] = None
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._fire)
        return None

    def forget(self, queued: _Queued) -> None:
        """``queued`` is answered (or failed): its deadline no longer matters."""
        self._due.pop(queued, None)

    def _fire(self) -> None:
        self._timer = None
        due = self._due
        # NOTE: libuv rounds a timer's delay to the millisecond, so a request's own timer
        #   fired up to half of one early; the oldest's deadline is judged the same way.
        horizon = self._loop.time() + _TIMER_GRAIN / 2
        while due:
            queued = next(iter(due))
            if queued.deadline > horizon:
                self._timer = self._loop.call_at(queued.deadline, self._fire)
                return
            del due[queued]
            _expire_queued(queued)


#: How a request another front took is answered: its result, or what failed it.
CrossedAnswer = Callable[[InferResult | None, BaseException | None], None]


class _CrossedWait:
    """A request another front took, waiting for its batcher's answer (``infer_crossed``):
    what ``infer`` does after its ``await``, as its future's done callback."""

    __slots__ = ("runner", "model", "queued", "entry", "batcher", "expiry", "answer")

    def __init__(
        self,
        runner: BatchRunner,
        model: ModelVersion,
        queued: _Queued,
        entry: Entry,
        batcher: DynamicBatcher,
        expiry: asyncio.TimerHandle | None,
        answer: CrossedAnswer,
    ) -> None:
        self.runner = runner
        self.model = model
        self.queued = queued
        self.entry = entry
        self.batcher = batcher
        self.expiry = expiry
        self.answer = answer

    def done(self, future: asyncio.Future[InferResult]) -> None:
        queued = self.queued
        runner = self.runner
        error: BaseException | None = None
        result: InferResult | None = None
        if future.cancelled():  # (only its client cancels it: nothing awaits it)
            error = runner._failed(queued, self.entry, self.batcher, asyncio.CancelledError(), True)
        else:
            exc = future.exception()
            if exc is None:
                result = future.result()
            else:
                error = runner._failed(queued, self.entry, self.batcher, exc, False)
        runner._forget(queued, self.expiry)
        self.model.in_flight -= 1
        self.answer(result, error)


class BatchRunner:
    """Puts requests into their model version's batcher and runs the batches it forms."""

    def __init__(self, inputs: BufferPool, dispatch: Dispatch) -> None:
        self.inputs = inputs
        self.dispatch = dispatch
        # PERF: asyncio.get_running_loop() makes a getpid() system call on each use.
        self._loop = asyncio.get_running_loop()
        self._deadlines = _Deadlines(self._loop)

    async def infer(
        self,
        inference: Inference,
        stats: ModelStats,
        start: int,
        placements: list[Placement],
        deadline: float,
    ) -> InferResult:
        """Queue one checked request and wait for its own part of a batch's answer (a
        ``strategies.CheckedQueue``).

        The request counts in ``stats`` once: as pending while it waits (the batcher
        keeps that count), then as a success (recorded with its batch, in ``_run_batch``)
        or a failure here.
        """
        queued, entry, batcher, expiry = self._queue(
            inference, stats, start, placements, deadline, None
        )
        future: asyncio.Future[InferResult] = entry.future
        try:
            return await future
        except BaseException as exc:
            client_left = isinstance(exc, asyncio.CancelledError) and cancelled_by_client(future)
            failed = self._failed(queued, entry, batcher, exc, client_left)
            if failed is exc:
                raise
            raise failed from None
        finally:
            self._forget(queued, expiry)

    def infer_crossed(
        self,
        inference: Inference,
        stats: ModelStats,
        start: int,
        placements: list[Placement],
        deadline: float,
        answer: CrossedAnswer,
        flush: Callable[[], None],
    ) -> None:
        """``infer`` for a request another front took (``DataPlane.cross_in``), without a
        task: it is queued now (what refuses it is raised), and ``answer(result, error)``
        is called once when it is answered; ``flush`` after its batch's crossed answers,
        before this front's own (``DynamicBatcher._dispatch``). Its version's
        ``in_flight`` counts it meanwhile, so that an unload waits for it.

        PERF: a task a request (``Task.__init__`` alone was 1.4 % of the primary's samples
        on the batched MatMul row, two fronts) and a loop step to start it.
        """
        queued, entry, batcher, expiry = self._queue(
            inference, stats, start, placements, deadline, flush
        )
        model = inference.model
        model.in_flight += 1
        wait = _CrossedWait(self, model, queued, entry, batcher, expiry, answer)
        entry.future.add_done_callback(wait.done)

    def _queue(
        self,
        inference: Inference,
        stats: ModelStats,
        start: int,
        placements: list[Placement],
        deadline: float,
        crossed: Callable[[], None] | None,
    ) -> tuple[_Queued, Entry, DynamicBatcher, asyncio.TimerHandle | None]:
        """Queue one checked request in its version's batcher, its deadline watched (the
        timer of its own, if it has one). (PERF: a tuple of mypyc's, not an object.)"""
        model, output_names, owned = inference.model, inference.output_names, inference.owned
        priority, timeout_us, watch = inference.priority, inference.timeout_us, inference.watch
        try:
            # (they agree: check_request; a request of no inputs: a model without batching)
            rows = rows_of(model, placements[0][0].shape if placements else ())
            queued = _Queued(placements, output_names, owned, rows, start, stats)
            batcher = self._batcher(model, stats)
            layout = batcher.layout
            signature = _signature(placements) if layout is None else layout.signature(placements)
            entry = batcher.enqueue(queued, max(rows, 1), signature, priority, timeout_us, crossed)
        except BaseException as exc:
            for held in owned:
                held.release()
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        future = entry.future
        if watch is not None:
            watch(future.cancel)
        queued.future = future
        queued.deadline = deadline
        # NOTE: past the deadline the request fails, wherever it is: a queued one leaves
        #   the queue, a running one's part of the answer is released when it arrives.
        #   A request's own `timeout` is often both its queue timeout and its deadline;
        #   libuv's millisecond timers then fire the two in either order, and a request
        #   still queued must fail as the queue policy says (Triton's message).
        if entry.due_ns:
            remaining = deadline - self._loop.time()
            queued.queue_due = _queue_due_first(batcher.policy, entry, start, remaining)
        return queued, entry, batcher, self._deadlines.watch(queued)

    def _failed(
        self,
        queued: _Queued,
        entry: Entry,
        batcher: DynamicBatcher,
        exc: BaseException,
        client_left: bool,
    ) -> BaseException:
        """A queued request failed with ``exc``: it leaves the queue and counts as failed;
        what its caller raises (``Withdrawn`` when its client went away)."""
        batcher.withdraw(entry)
        if queued.taken:
            reason = failure_reason(exc)
        else:
            queued.release_inputs()
            withdrawn = isinstance(exc, asyncio.CancelledError)
            reason = FailureReason.CANCELED if withdrawn else refusal_reason(exc)
        queued.stats.request_failed(reason, monotonic_ns() - queued.start)
        return Withdrawn() if client_left else exc

    def _forget(self, queued: _Queued, expiry: asyncio.TimerHandle | None) -> None:
        """A queued request is answered: its deadline no longer matters."""
        if expiry is None:
            self._deadlines.forget(queued)
        else:
            expiry.cancel()

    def _batcher(self, model: ModelVersion, stats: ModelStats) -> DynamicBatcher:
        """The version's batcher, made at its first request with its policy
        (``batching_policy``) and its layout."""
        batcher = model.batcher
        if batcher is None:
            config = model.config
            policy = batching_policy(config)
            if policy is None:
                raise InternalError(f"model '{model.name}' does not batch")
            layout: RaggedLayout | PaddedLayout | None = None
            if config is not None and config.batch_io is not None:
                layout = RaggedLayout(config.batch_io)
            elif config is not None and config.pad_batch is not None:
                layout = PaddedLayout(config.pad_batch)
            if layout is None:
                batcher = DynamicBatcher(
                    model.key,
                    policy,
                    model.instances,
                    lambda entries, worker: self._run_batch(model, entries, worker),
                    InferResult.release,
                    stats,
                )
            else:
                laid_out = layout
                batcher = DynamicBatcher(
                    model.key,
                    policy,
                    model.instances,
                    lambda entries, worker: self._run_laid_out(model, laid_out, entries, worker),
                    InferResult.release,
                    stats,
                    layout,
                    layout.gate() if isinstance(layout, PaddedLayout) else None,
                )
            model.batcher = batcher
        return batcher

    async def _run_batch(
        self, model: ModelVersion, entries: list[Entry], worker: WorkerLink
    ) -> list[InferResult]:
        requests: list[_Queued] = []
        for entry in entries:
            request = entry.request
            request.taken = True
            requests.append(request)
        owned: list[Lease | RegionUse] = []
        lease: Lease | None = None
        try:
            if len(requests) == 1:
                descs, lease = await place(requests[0].placements, self.inputs)
                owned = requests[0].owned
            else:
                # NOTE: a large new segment is made in a thread, not on the loop.
                placements = [r.placements for r in requests]
                lease = await self.inputs.acquire_async(batch_size(placements))
                descs = assemble(placements, lease)
                for request in requests:  # their bytes are in the batch's segment now
                    request.release_inputs()
        except BaseException:
            for request in requests:
                request.release_inputs()
            if lease is not None:
                lease.release()
            raise
        if lease is not None:
            owned.append(lease)
        computed = _outputs(requests)
        done = await self.dispatch.send(worker, model, descs, owned, computed)
        # (requests of one batch give the same inputs, the required ones among them)
        left_out = len(requests[0].placements) < len(model.input_map)
        results = self.dispatch.results(worker, model, done, [r.rows for r in requests], left_out)
        if computed is not requests[0].outputs:
            _own_outputs(requests, computed, results)
        _record(requests, entries, done)
        return results

    async def _run_laid_out(
        self,
        model: ModelVersion,
        layout: RaggedLayout | PaddedLayout,
        entries: list[Entry],
        worker: WorkerLink,
    ) -> list[InferResult]:
        """A batch of a ragged or padded model: always laid out by ``layout`` (ragged inputs
        flat and batch inputs made; padded inputs padded, masks made), even a batch of one,
        and its outputs cut by it."""
        requests: list[_Queued] = [entry.request for entry in entries]
        placements = [r.placements for r in requests]
        lease: Lease | None = None
        try:
            for request in requests:
                request.taken = True
            lease = await self.inputs.acquire_async(layout.size(placements))
            descs = layout.assemble(placements, lease)
            if isinstance(layout, PaddedLayout):
                requests[0].stats.padded_batch(*layout.elements(placements))
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        finally:
            for request in requests:  # their bytes are in the batch's segment now
                request.release_inputs()
        computed = _outputs(requests)
        done = await self.dispatch.send(worker, model, descs, [lease], computed)
        rows = [r.rows for r in requests]
        segment = done.segment
        shared = SharedRelease(len(rows), lambda: worker.release_outputs(segment))
        try:
            buf = self.dispatch.outputs.get(segment).buf
            parts = layout.split(done.outputs, buf, placements, rows)
            results = [
                InferResult(model, client_outputs(model, part), shared.part()) for part in parts
            ]
        except BaseException:
            worker.release_outputs(segment)
            raise
        if computed is not requests[0].outputs:
            _own_outputs(requests, computed, results)
        _record(requests, entries, done)
        return results


def _record(requests: list[_Queued], entries: list[Entry], done: InferDone) -> None:
    """Statistics of one execution and of each request in it (its share of the phases)."""
    stats = requests[0].stats
    rows = 0
    one_row_each = True
    answered = False
    for request in requests:
        rows += request.rows
        one_row_each = one_row_each and request.rows == 1
        future = request.future
        answered = answered or (future is not None and future.done())
    input_ns, infer_ns, output_ns = done.input_ns, done.infer_ns, done.output_ns
    stats.executed(rows, input_ns, infer_ns, output_ns)
    if stats.per_request or not one_row_each or answered:
        _record_each(requests, entries, done, rows)
        return
    # PERF: the usual batch, of one-row requests with neither histograms nor a summary
    #   window: counted in at once (one request's share of a phase is the same for all),
    #   the same sums as request by request.
    now = monotonic_ns()
    started_ns = done.started_ns
    total_ns = queue_ns = 0
    for request, entry in zip(requests, entries, strict=True):
        total_ns += now - request.start
        queue_ns += max(0, started_ns - entry.enqueued_ns)
    share = 1 / rows
    stats.requests_succeeded(
        rows,
        rows,
        total_ns,
        queue_ns,
        int(input_ns * share) * rows,
        int(infer_ns * share) * rows,
        int(output_ns * share) * rows,
    )


def _record_each(requests: list[_Queued], entries: list[Entry], done: InferDone, rows: int) -> None:
    """Each request's statistics on its own: its share of the execution's phases. One
    already answered (its deadline passed while it ran, or its client went away) was
    counted as a failure then (``infer``), not again as a success (found by fuzzing)."""
    now = monotonic_ns()
    for request, entry in zip(requests, entries, strict=True):
        future = request.future
        if future is not None and future.done():
            continue
        # (a batch of zero-row requests, [0, ...] each, shares the phases evenly)
        share = request.rows / rows if rows else 1 / len(requests)
        request.stats.request_succeeded(
            request.rows,
            now - request.start,
            max(0, done.started_ns - entry.enqueued_ns),
            int(done.input_ns * share),
            int(done.infer_ns * share),
            int(done.output_ns * share),
        )


def _expire_queued(queued: _Queued) -> None:
    """``queued``'s deadline has come (``_Deadlines``)."""
    if queued.future is not None:
        _expire(queued.future, queued if queued.queue_due else None)


def _expire(future: asyncio.Future[InferResult], queue_due: _Queued | None) -> None:
    """The deadline: ``queue_due`` is the request when its queue timeout is due as well."""
    if future.done():
        return
    if queue_due is not None and not queue_due.taken:
        future.set_exception(QueueRejected("Request timeout expired"))
    else:
        future.set_exception(DeadlineExceeded())
