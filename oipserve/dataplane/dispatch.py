"""The one way a request, or a batch of them, goes to a worker and comes back.

Both the requests that run alone (``strategies.Unbatched``) and the batches of the dynamic
batcher (``batched.BatchRunner``) go through here:

- ``pick``: the least busy worker that holds the model version (503 when none can take it);
- ``send``: an ``Infer`` descriptor to that worker, and its reply awaited until the deadline.
  What holds the inputs (segment leases, uses of clients' regions) is released once the
  worker is done reading them, on every path: its reply, its death, or no send at all;
  ``infer_on`` is that send-and-await, for every ``Infer`` (ensemble chains and sequence
  batches too);
- ``result`` / ``results``: the reply's outputs as clients see them, views of the worker's
  output segment that go back to it once every result is released (on any error, at once).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

from mypy_extensions import mypyc_attr

from oipserve.dataplane.batch_io import SharedRelease, split
from oipserve.errors import DeadlineExceeded
from oipserve.models.registry import ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import InferResult, client_outputs
from oipserve.runtime.abandoned_work import ABANDONED_WORK
from oipserve.runtime.busy_poll import BusyPoll
from oipserve.runtime.colocation import FrontAffinity
from oipserve.runtime.off_loop import nothing_to_release
from oipserve.runtime.worker_share import WorkerShare, share_of
from oipserve.telemetry.stats import ModelStats
from oipserve.wire.messages import Failed, Infer, InferDone, OutputTarget, TensorDesc
from oipserve.wire.shm import Lease, SegmentCache

__all__ = ["Dispatch", "drop_reply", "infer_on"]

_EMPTY: Final = memoryview(b"")
# NOTE: shared, never changed: only encoded into Infer messages (no list per request).
_NO_TARGETS: Final[list[OutputTarget]] = []
_NO_NAMES: Final[list[str]] = []
_NO_REGIONS: Final[dict[str, RegionUse]] = {}


# NOTE: compiled (mypyc), and extended by ``ensemble_run.StepDispatch``, which is not.
@mypyc_attr(allow_interpreted_subclasses=True)
class Dispatch:
    """Sends checked, placed requests to workers and maps their replies back."""

    __slots__ = ("outputs", "max_queue", "max_share", "share_bounded", "busy_poll", "affinity")

    def __init__(self, outputs: SegmentCache, max_queue: int) -> None:
        #: The workers' output segments, mapped once each.
        self.outputs = outputs
        #: Requests in flight on one worker past which its model answers 503 (overloaded).
        self.max_queue = max_queue
        #: Requests one client connection may have at the workers (``runtime.worker_share``).
        self.max_share = share_of(max_queue)
        #: Whether a request waiting for its place may be refused when its connection's
        #: waiting is full (``WorkerShare.wait``): not an ensemble's step (``StepDispatch``).
        self.share_bounded = True
        #: The front's busy polling, whose requests in flight say whether an Infer goes out
        #: at light load (``Infer.light``: the worker then does not poll for the next, and
        #: with ``--low-load-colocation`` pins itself beside the front). None: never light.
        self.busy_poll: BusyPoll | None = None
        #: With ``--low-load-colocation`` (``DataPlane.colocate``; None without): where
        #: this front's loop runs, beside a worker pinned for it (``affinity.follow``).
        self.affinity: FrontAffinity | None = None

    def pick(self, model: ModelVersion) -> WorkerLink:
        """The worker with the fewest requests in flight that holds ``model``, or 503."""
        return model.pick(self.max_queue)

    async def send(
        self,
        worker: WorkerLink,
        model: ModelVersion,
        inputs: list[TensorDesc],
        owned: Sequence[Lease | RegionUse],
        output_names: list[str],
        deadline: float | None = None,
        targets: list[OutputTarget] | None = None,
        text_outputs: list[str] | None = None,
        late: ModelStats | None = None,
        rows: int = 1,
        share: WorkerShare | None = None,
    ) -> InferDone:
        """Run ``inputs`` on ``worker``; its reply (or the error it answered).

        ``owned`` is released when the worker is done reading the inputs: at its reply,
        when it dies, or here when the request cannot be sent; so is the place the request
        took in its connection's ``share`` of the workers' queues. Past ``deadline`` (loop
        time) the call fails with DeadlineExceeded while the worker may still read the
        inputs: they stay held until it answers, which a worker that comes to the request
        too late to end it by its deadline does without running it (``Infer.expires``).
        The reply's output segment is the caller's to release (``result``, ``results``).
        """
        try:
            sendable(model, owned)
        except BaseException:
            if share is not None:
                share.back()
            raise
        key = model.key
        output_names = output_names or model.run_outputs
        into = targets or _NO_TARGETS
        texts = text_outputs or _NO_NAMES
        light = self.light()
        expires = 0 if deadline is None else worker.expires(deadline)

        def inputs_free() -> None:
            for held in owned:
                held.release()
            if share is not None:
                share.back()

        answer = await infer_on(
            worker,
            lambda rid: Infer(
                rid, key, inputs, output_names, into, texts, light=light, expires=expires
            ),
            inputs_free,
            self.outputs,
            deadline,
            late,
            rows,
        )
        return self.answered(worker, answer)

    def light(self) -> bool:
        """Whether an ``Infer`` sent now goes out at light load (``Infer.light``): its
        front has no other request in flight. Every ``Infer`` asks here (a request alone,
        a batch, an ensemble's chain or step, a sequence's batch)."""
        polling = self.busy_poll
        return polling is not None and polling.in_flight <= 1

    def answered(self, worker: WorkerLink, answer: object) -> InferDone:
        """``worker``'s answer to an ``Infer``: its reply, or the error it answered raised.

        Every reply says which output segments the worker unlinked since its last one
        (``InferDone.dropped``): their mappings are let go of here, whatever sent the
        ``Infer`` (a mapping kept would pin the segment's memory until the worker dies).
        Co-located (``--low-load-colocation``), the loop follows the worker's CPU.
        """
        # PERF: type(), not isinstance: see messages.REPLIES (an object a call otherwise).
        if type(answer) is Failed:  # (it says what was dropped too)
            self.forget(answer.dropped)
        reply = worker.inferred(answer)
        self.forget(reply.dropped)
        if self.affinity is not None:
            self.affinity.follow(reply.colocated_cpu)
        return reply

    def forget(self, dropped: list[str]) -> None:
        """Let go of the mappings of output segments their worker unlinked."""
        for name in dropped:
            self.outputs.forget(name)

    def result(
        self,
        worker: WorkerLink,
        model: ModelVersion,
        done: InferDone,
        into: Mapping[str, RegionUse],
        rows: int = 1,
    ) -> InferResult:
        """The outputs of one request that ran alone; ``into`` holds the clients' regions
        the worker was asked to write outputs into (``send``'s ``targets``); ``rows``: its
        batch size."""
        segment = done.segment
        try:
            # NOTE: no segment when every output went into clients' regions.
            buf = self.outputs.get(segment).buf if segment else _EMPTY
            outputs = client_outputs(
                model,
                [
                    (d, _EMPTY if d.region is not None else buf[d.offset : d.offset + d.nbytes])
                    for d in done.outputs
                ],
                rows,
            )
            # PERF: no zip (its strict= keyword is a new str a call, the zip and its
            #   iterators three objects more); one tensor a desc, in order.
            for i, desc in enumerate(done.outputs):
                if desc.region is not None:
                    tensor = outputs[i]
                    tensor.put_in_region(into[tensor.name], desc.nbytes)
        except BaseException:
            if segment:
                worker.release_outputs(segment)
            raise
        if not segment:
            return InferResult(model, outputs, nothing_to_release)
        return InferResult(model, outputs, lambda: worker.release_outputs(segment))

    def results(
        self,
        worker: WorkerLink,
        model: ModelVersion,
        done: InferDone,
        rows: list[int],
        left_out: bool = False,
    ) -> list[InferResult]:
        """The outputs of a batch cut back into one result per request (``rows``: each
        request's batch size, in the order of its inputs; ``left_out``: the requests leave
        out an optional input, ``batch_io.split``); the segment goes back once every result
        is released."""
        if len(rows) == 1:  # as it came: nothing to cut
            return [self.result(worker, model, done, _NO_REGIONS, rows[0])]
        segment = done.segment
        shared = SharedRelease(len(rows), lambda: worker.release_outputs(segment))
        try:
            parts = split(done.outputs, self.outputs.get(segment).buf, rows, left_out)
            return [
                InferResult(model, client_outputs(model, part), shared.part()) for part in parts
            ]
        except BaseException:
            worker.release_outputs(segment)
            raise


def sendable(model: ModelVersion, owned: Sequence[Lease | RegionUse]) -> None:
    """Nothing more is sent for a version taken out of service (``owned`` let go, a
    retryable 503): its Unload may already be ahead on the worker's socket. A batch formed
    before a reload and sent after it was refused by the worker as "model 'm/1#<id>' is
    not loaded here" (found by fuzzing). In the loop step of the send: nothing can come
    between."""
    try:
        model.check_not_unloaded()
    except BaseException:
        for held in owned:
            held.release()
        raise


async def infer_on(
    worker: WorkerLink,
    make: Callable[[int], Infer],
    inputs_free: Callable[[], None],
    mapped: SegmentCache,
    deadline: float | None = None,
    late: ModelStats | None = None,
    rows: int = 1,
) -> object:
    """The worker's answer to the ``Infer`` that ``make`` builds (given the request id).

    ``inputs_free`` lets go of what holds the inputs: when the worker is done reading them
    (the link calls it at the reply or the worker's death), or here at once when the
    request cannot be sent. A caller cancelled once the reply has come gives its outputs
    back (``drop_reply``; ``mapped``: the front's mappings of the output segments). Past
    ``deadline``, or cancelled, a run the worker makes all the same counts in ``late`` as
    an execution of ``rows`` (``ModelStats.ran_late``: Triton counts every model run; a
    cancelled one went uncounted, found by fuzzing).
    """
    try:
        waiting = worker.call(make, inputs_free, deadline)
    except BaseException:
        inputs_free()  # never sent (the worker is gone): nothing will read the inputs
        raise
    try:
        return await waiting
    except DeadlineExceeded:
        if late is not None:  # (made only now: nothing is allocated for it per request)
            worker.on_late_reply(waiting, functools.partial(late.ran_late, rows))
        raise
    except asyncio.CancelledError:
        ran = None if late is None else functools.partial(late.ran_late, rows)
        drop_reply(worker, waiting, mapped, ran)
        abandoned = ABANDONED_WORK.get()
        if abandoned is not None:  # counted against its client while the worker has it
            worker.while_pending(waiting, abandoned.abandoned)
        raise


def drop_reply(
    worker: WorkerLink,
    waiting: Awaitable[object],
    mapped: SegmentCache,
    ran: Callable[[InferDone], None] | None = None,
) -> None:
    """A request cancelled: hand its output segment back once its reply comes, or now if
    it came already (``infer_on`` calls this on CancelledError); ``ran(reply)`` if the
    worker ran it, then or now.

    The reply and the cancel can land in one loop iteration (a stream reset while its
    worker answers): the reply is then in ``waiting`` but the task wakes to
    CancelledError, and the link, seeing a future already done, released nothing; each
    such reply kept a worker's output segment leased for good (a flow-control reset
    attack grew /dev/shm ~20 MiB a second, for ever).
    """
    if not isinstance(waiting, asyncio.Future) or not waiting.done() or waiting.cancelled():
        # Still waiting: the link releases the outputs when the reply comes.
        if ran is not None:
            worker.on_late_reply(waiting, ran)
        return
    if waiting.exception() is None:
        reply = waiting.result()
        if isinstance(reply, InferDone):
            if ran is not None:
                ran(reply)
            for name in reply.dropped:  # unlinked by the worker: let go of their mappings
                mapped.forget(name)
            if reply.segment:
                worker.release_outputs(reply.segment)
