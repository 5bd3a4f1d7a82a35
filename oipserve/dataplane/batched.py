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
from time import monotonic_ns

from oipserve.dataplane.batch_io import SharedRelease, assemble, batch_size
from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.padding import PaddedLayout
from oipserve.dataplane.ragged import RaggedLayout
from oipserve.errors import DeadlineExceeded, InvalidInput, ServerError
from oipserve.models.config.parse import ModelConfig
from oipserve.models.registry import ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import Inference, InferResult, client_outputs
from oipserve.request.placement import Placement, place
from oipserve.scheduling.policy import BatchPolicy
from oipserve.scheduling.scheduler import DynamicBatcher, Entry, QueueRejected
from oipserve.telemetry.stats import FailureReason, ModelStats, failure_reason, refusal_reason
from oipserve.wire.messages import ErrorKind, InferDone
from oipserve.wire.shm import BufferPool, Lease

__all__ = ["BatchRunner", "Withdrawn", "batching_policy"]

#: Resolution of the loop's timers (libuv counts milliseconds).
_TIMER_GRAIN = 0.001

#: The batcher of a ragged-batching model without ``dynamic_batching``: one request per
#: execution, at once (Triton's default scheduler), so that its batch inputs are made.
_ONE_AT_A_TIME = BatchPolicy(max_batch_size=0)


def batching_policy(config: ModelConfig | None) -> BatchPolicy | None:
    """The batcher's policy of a model: its ``dynamic_batching``, or one request at a time
    for a model with ragged batching (whose requests need the batch's layout), or None."""
    if config is None:
        return None
    if config.dynamic_batching is None and config.batch_io is not None:
        return _ONE_AT_A_TIME
    return config.dynamic_batching


class Withdrawn(ServerError):
    """The client went away while its request was queued; it never ran."""

    kind = ErrorKind.INVALID_INPUT


class _Queued:
    """What a batch needs from one queued request."""

    __slots__ = ("placements", "outputs", "owned", "rows", "taken", "start", "stats")

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

    def release_inputs(self) -> None:
        owned, self.owned = self.owned, []
        for held in owned:
            held.release()


def batch_rows(model: ModelVersion, placements: list[Placement]) -> int:
    """The request's batch size: its inputs' common first dimension (1 without batching)."""
    if model.max_batch_size == 0:
        return 1
    rows = {tensor.shape[0] for tensor, _, _, _ in placements if tensor.shape}
    if len(rows) != 1:
        sizes = ", ".join(f"'{t.name}' {t.shape[:1]}" for t, _, _, _ in placements)
        raise InvalidInput(
            f"the inputs of model '{model.name}' must share their first dimension, the batch "
            f"size: {sizes}"
        )
    return rows.pop()


def _signature(placements: list[Placement]) -> tuple[object, ...]:
    """What requests must agree on to share a batch: their inputs, all but each one's first
    dim. Not the outputs they ask for: as in Triton, the batch computes every output any
    of them asked for, and each gets its own (``_outputs``, ``_own_outputs``)."""
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


class BatchRunner:
    """Puts requests into their model version's batcher and runs the batches it forms."""

    def __init__(self, inputs: BufferPool, dispatch: Dispatch) -> None:
        self.inputs = inputs
        self.dispatch = dispatch
        # PERF: asyncio.get_running_loop() makes a getpid() system call on each use.
        self._loop = asyncio.get_running_loop()

    async def infer(
        self,
        inference: Inference,
        policy: BatchPolicy,
        stats: ModelStats,
        start: int,
        placements: list[Placement],
        deadline: float,
    ) -> InferResult:
        """Queue one checked request and wait for its own part of a batch's answer.

        The request counts in ``stats`` once: as pending while it waits (the batcher
        keeps that count), then as a success (recorded with its batch, in ``_run_batch``)
        or a failure here.
        """
        model, output_names, owned = inference.model, inference.output_names, inference.owned
        priority, timeout_us, watch = inference.priority, inference.timeout_us, inference.watch
        try:
            rows = batch_rows(model, placements)
            queued = _Queued(placements, output_names, owned, rows, start, stats)
            batcher = self._batcher(model, policy, stats)
            layout = batcher.layout
            signature = _signature(placements) if layout is None else layout.signature(placements)
            future = batcher.submit(queued, max(rows, 1), signature, priority, timeout_us)
        except BaseException as exc:
            for held in owned:
                held.release()
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        if watch is not None:
            watch(future.cancel)
        # NOTE: past the deadline the request fails, wherever it is: a queued one leaves
        #   the queue, a running one's part of the answer is released when it arrives.
        #   A request's own `timeout` is often both its queue timeout and its deadline;
        #   libuv's millisecond timers then fire the two in either order, and a request
        #   still queued must fail as the queue policy says (Triton's message).
        queue_policy = policy.policy(policy.level(priority))
        queue_timeout = queue_policy.timeout_ns(timeout_us) / 1e9
        # The deadline counts from the request's arrival, the queue timeout from now.
        waited = (monotonic_ns() - start) / 1e9
        queue_due_first = (
            queue_policy.timeout_action == "REJECT"
            and 0 < queue_timeout <= deadline - self._loop.time() + waited + _TIMER_GRAIN
        )
        expiry = self._loop.call_at(deadline, _expire, future, queued if queue_due_first else None)
        try:
            return await future
        except BaseException as exc:
            failed: BaseException = exc
            task = asyncio.current_task()
            if (
                isinstance(exc, asyncio.CancelledError)
                and future.cancelled()
                and (task is None or not task.cancelling())
            ):
                failed = Withdrawn("the client went away before its request ran")
            if queued.taken:
                reason = failure_reason(exc)
            else:
                queued.release_inputs()
                withdrawn = isinstance(exc, asyncio.CancelledError)
                reason = FailureReason.CANCELED if withdrawn else refusal_reason(exc)
            stats.request_failed(reason, monotonic_ns() - start)
            if failed is exc:
                raise
            raise failed from None
        finally:
            expiry.cancel()

    def _batcher(
        self, model: ModelVersion, policy: BatchPolicy, stats: ModelStats
    ) -> DynamicBatcher:
        batcher = model.batcher
        if batcher is None:
            config = model.config
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
        requests: list[_Queued] = [entry.request for entry in entries]
        for request in requests:
            request.taken = True
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
        results = self.dispatch.results(worker, model, done, [r.rows for r in requests])
        if computed is not requests[0].outputs:
            _own_outputs(requests, computed, results)
        _record(requests, [entry.enqueued_ns for entry in entries], done)
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
        _record(requests, [entry.enqueued_ns for entry in entries], done)
        return results


def _record(requests: list[_Queued], enqueued: list[int], done: InferDone) -> None:
    """Statistics of one execution and of each request in it (its share of the phases)."""
    stats = requests[0].stats
    rows = sum(r.rows for r in requests) or 1
    stats.executed(rows, done.input_ns, done.infer_ns, done.output_ns)
    now = monotonic_ns()
    for request, queued_at in zip(requests, enqueued, strict=True):
        share = request.rows / rows
        request.stats.request_succeeded(
            request.rows,
            now - request.start,
            max(0, done.started_ns - queued_at),
            int(done.input_ns * share),
            int(done.infer_ns * share),
            int(done.output_ns * share),
        )


def _expire(future: asyncio.Future[InferResult], queue_due: _Queued | None) -> None:
    """The deadline: ``queue_due`` is the request when its queue timeout is due as well."""
    if future.done():
        return
    if queue_due is not None and not queue_due.taken:
        future.set_exception(QueueRejected("Request timeout expired"))
    else:
        future.set_exception(DeadlineExceeded())
