"""How the requests of one model version are served: one of three strategies.

``DataPlane`` chooses a version's strategy once, at its first request:

- ``answer_in_front``: an ``echo`` endpoint; the front copies the inputs to the outputs
  (no worker, no shared memory);
- ``Unbatched``: each request checked, placed in shared memory and sent on its own to the
  least busy worker that holds the version (``dispatch``);
- ``Batched``: a version with ``dynamic_batching``: each request checked, then queued in
  the version's batcher; ``batched.BatchRunner`` places and sends the batches it forms
  through the same ``dispatch``. In a front other than the primary the batcher is the
  primary's (``CheckedQueue``, ``scaleout.batch_link``): the checked request crosses there.

A strategy is called with the request, its version's statistics and ``monotonic_ns()`` at
its arrival. It counts the request there once (a success with its phase times, or a failure
with its reason), releases the request's ``owned`` once nothing reads it, and answers with
the request's ``InferResult`` or raises. ``refused`` and ``sending`` are the steps around
placing that ``Unbatched`` shares with an ensemble's chain (``ensemble_chains.run_chain``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from time import monotonic_ns

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.intake import Intake, has_deferred
from oipserve.dataplane.response_cache import Entry, Probe, ResponseCache, answer
from oipserve.errors import InvalidInput
from oipserve.request.checks import output_targets, rows_of
from oipserve.request.classification import check_classification
from oipserve.request.client_regions import RegionUse
from oipserve.request.echo import answer_echo
from oipserve.request.inference import Inference, InferResult
from oipserve.request.placement import Placement, place
from oipserve.runtime.worker_share import WORKER_SHARE, WorkerShare
from oipserve.telemetry.stats import ModelStats, failure_reason, refusal_reason
from oipserve.wire.shm import Lease

__all__ = [
    "Batched",
    "CheckedQueue",
    "Strategy",
    "Unbatched",
    "answer_in_front",
    "refused",
    "sending",
    "waited_for_share",
]

#: Serves one request: (the request, its version's statistics, its arrival) -> its result.
Strategy = Callable[[Inference, ModelStats, int], Awaitable[InferResult]]


#: Where a batching strategy hands a checked request: (the request, its statistics, its
#: arrival, its placements, its deadline) -> its result. This front's batchers
#: (``batched.BatchRunner.infer``), or in a front other than the primary the primary's
#: (``scaleout.batch_link.PrimaryBatches.cross``, for sequences too). It counts the request
#: in ``stats`` (or has it counted where it runs) and releases its ``owned``, whatever
#: happens.
CheckedQueue = Callable[
    [Inference, ModelStats, int, list[Placement], float], Awaitable[InferResult]
]


async def answer_in_front(inference: Inference, stats: ModelStats, start: int) -> InferResult:
    """An ``echo`` endpoint's answer: its inputs back as outputs, made here."""
    try:
        result = _checked_echo(inference)
    except BaseException as exc:
        stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
        raise
    stats.executed(1, 0, 0, 0)  # answered here: no queue, no compute phases
    stats.request_succeeded(1, monotonic_ns() - start, 0, 0, 0, 0)
    return result


def _checked_echo(inference: Inference) -> InferResult:
    """``answer_echo``, which releases ``owned``, once the request is one it can answer."""
    model, into = inference.model, inference.into_regions
    try:
        if into or any(tensor.region is not None for tensor in inference.inputs):
            raise InvalidInput(
                f"model '{model.name}' is answered by the front (echo) and takes no "
                "shared memory regions"
            )
        check_classification(model, inference.classification, into)
    except BaseException:
        _release(inference.owned)
        raise
    return answer_echo(model, inference.inputs, inference.output_names, inference.owned)


class Unbatched:
    """Each request on its own: check, place, send to the least busy worker, its result.

    With ``cache`` (the version's ``response_cache``), a checked request is looked up
    before it is placed: a hit answers at once, a miss's answer is stored.
    """

    __slots__ = ("intake", "dispatch", "cache")

    def __init__(
        self, intake: Intake, dispatch: Dispatch, cache: ResponseCache | None = None
    ) -> None:
        self.intake = intake
        self.dispatch = dispatch
        self.cache = cache

    async def run(self, inference: Inference, stats: ModelStats, start: int) -> InferResult:
        model, owned, into = inference.model, inference.owned, inference.into_regions
        intake, dispatch = self.intake, self.dispatch
        deadline = intake.deadline(inference)
        lease: Lease | None = None
        probe: Probe | None = None
        share: WorkerShare | None = None  # (its connection's, once it has a place in it)
        waited = 0
        try:
            placements = intake.check(inference)
            if self.cache is not None:
                probe = self.cache.lookup(inference, placements, stats)
                if probe is not None and probe.entry is not None:
                    return _answered(probe.entry, inference, stats, start)
            if has_deferred(placements):
                placements = await intake.decode_in_worker(model, placements, owned, deadline)
            targets = output_targets(model, inference.inputs, into) if into else None
            inputs, lease = await place(placements, intake.inputs)
            connection = WORKER_SHARE.get()
            if connection is not None:
                if not connection.take(dispatch.max_share):
                    limit, bounded = dispatch.max_share, dispatch.share_bounded
                    waited = await waited_for_share(connection, deadline, stats, limit, bounded)
                share = connection
            worker = dispatch.pick(model)
        except BaseException as exc:
            if share is not None:
                share.back()
            refused(exc, owned, lease, stats, start)
            raise
        sent = sending(owned, lease, stats)
        if waited:  # (its queue time runs from when it began to wait for its place)
            sent = waited
        batch = rows_of(model, inference.inputs[0].shape if inference.inputs else ())
        try:
            # (``stats``, ``batch``: a run the worker makes after the request failed at its
            #  deadline is an execution all the same, as a batched one is; it went uncounted,
            #  found by fuzzing)
            done = await dispatch.send(
                worker, model, inputs, owned, inference.output_names, deadline, targets,
                inference.text_outputs, stats, batch, share,
            )  # fmt: skip
            result = dispatch.result(worker, model, done, into, batch)
        except BaseException as exc:
            stats.request_failed(failure_reason(exc), monotonic_ns() - start)
            raise
        finally:
            stats.pending -= 1
        stats.ran_alone(batch, start, sent, done)
        if probe is not None and self.cache is not None:
            self.cache.store(probe, result, stats)
        return result


class Batched:
    """A version with ``dynamic_batching``: each request checked, then queued in its batcher
    to run in a batch (``batched.BatchRunner``)."""

    __slots__ = ("intake", "queue", "cache")

    def __init__(
        self, intake: Intake, queue: CheckedQueue, cache: ResponseCache | None = None
    ) -> None:
        self.intake = intake
        #: Where the checked request goes: the version's batcher, here or in the primary.
        self.queue = queue
        #: The response cache, as ``Unbatched``'s.
        self.cache = cache

    async def run(self, inference: Inference, stats: ModelStats, start: int) -> InferResult:
        model, owned, into = inference.model, inference.owned, inference.into_regions
        intake = self.intake
        deadline = intake.deadline(inference)
        probe: Probe | None = None
        try:
            placements = intake.check(inference)
            if self.cache is not None:
                probe = self.cache.lookup(inference, placements, stats)
                if probe is not None and probe.entry is not None:
                    return _answered(probe.entry, inference, stats, start)
            if has_deferred(placements):
                placements = await intake.decode_in_worker(model, placements, owned, deadline)
            if into:  # NOTE: checked only: the front writes a batched request's outputs there
                output_targets(model, inference.inputs, into)
            model.check_serving()  # the batcher would otherwise queue it
            intake.copy_regions(inference, placements, owned)
        except BaseException as exc:
            _release(owned)
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        result = await self.queue(inference, stats, start, placements, deadline)
        if probe is not None and self.cache is not None:
            self.cache.store(probe, result, stats)
        return result


def _answered(entry: Entry, inference: Inference, stats: ModelStats, start: int) -> InferResult:
    """A cache hit's answer; the request's inputs released (no worker reads them)."""
    _release(inference.owned)
    result = answer(entry, inference)
    stats.answered_from_cache(monotonic_ns() - start)
    return result


def refused(
    exc: BaseException,
    owned: list[Lease | RegionUse],
    lease: Lease | None,
    stats: ModelStats,
    start: int,
) -> None:
    """A request sent alone (``Unbatched``, an ensemble's chain) that failed before it was
    sent: what it holds let go, its failure counted once with its reason."""
    _release(owned)
    if lease is not None:
        lease.release()
    stats.request_failed(refusal_reason(exc), monotonic_ns() - start)


def sending(owned: list[Lease | RegionUse], lease: Lease | None, stats: ModelStats) -> int:
    """A request placed to be sent alone: its segment joins what it holds (released once
    the worker has read it), pending until the worker answers; the time it is sent.

    A plain function, not a coroutine: one more coroutine per request costs on this path.
    """
    if lease is not None:
        owned.append(lease)
    # NOTE: pending until the worker answers: the front cannot see when a pipelined
    #   worker starts a request (docs/metrics.md).
    stats.pending += 1
    return monotonic_ns()


async def waited_for_share(
    share: WorkerShare, deadline: float, stats: ModelStats, limit: int, bounded: bool = True
) -> int:
    """A place in its connection's share (``limit``) of the workers' queues, for a request
    sent alone that has to wait for one (``runtime.worker_share``; 503 with ``limit``
    waiting already, unless not ``bounded``: an ensemble's step); when it began to wait
    (``monotonic_ns``). Pending meanwhile, as a request queued in a batcher is."""
    began = monotonic_ns()
    stats.pending += 1
    try:
        await share.wait(deadline, limit, bounded)
    finally:
        stats.pending -= 1
    return began


def _release(owned: list[Lease | RegionUse]) -> None:
    for held in owned:
        held.release()
