"""The places of a sequence model's sequences, their answers and their timers.

``SequenceSlots`` is the state of a version's sequence batcher (``sequenced.Sequenced``
derives from it, through ``sequence_batches.SequenceBatches``) and what happens to a
sequence's place between its requests (docs/sequences.md): the live sequences by id, a lane
per worker with its slots (``scheduling.sequence``), the backlog of started sequences
waiting for a slot, the sequences lost with their worker; a request's answer, counted once
and, for ``oldest`` with ``preserve_ordering``, in arrival order; the timers: a request's
deadline, a sequence's idle expiry (``max_sequence_idle_microseconds``); and the version
leaving service (``close``).

NOTE: base classes rather than objects of their own, so that every method kept its body
and its calls (``self._finish``, ``self._after``): no layer between a request and its answer.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Hashable, Iterable
from time import monotonic_ns
from typing import TYPE_CHECKING

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.intake import Intake
from oipserve.errors import DeadlineExceeded, Unavailable
from oipserve.models.config.sequence import SequencePolicy
from oipserve.pool.link import WorkerLink
from oipserve.request.inference import Inference, InferResult
from oipserve.request.placement import Placement
from oipserve.scheduling.sequence import Lane, Sequence, Step
from oipserve.telemetry.stats import ModelStats, failure_reason, refusal_reason
from oipserve.wire.messages import EndSequences, SequenceState

if TYPE_CHECKING:
    from oipserve.models.registry import ModelVersion
    from oipserve.request.sequence_params import SequenceTag

__all__ = [
    "BACKLOG_BYTES",
    "BACKLOG_MAX",
    "BACKLOG_TIMEOUT",
    "LOST_MAX",
    "Seq",
    "SeqLane",
    "SequenceSlots",
    "SequenceStep",
]

#: The message of a request still waiting for a slot at its timeout (Triton's).
BACKLOG_TIMEOUT = "timeout of the corresponding sequence has been expired"
#: Requests that may wait in the backlog at once, per model version (STARTs waiting for a
#: slot and the later requests of their sequences), and their inputs' bytes (at least one
#: request, however large): past either a request that would wait there is refused (503)
#: rather than kept without bound. A stream does not count them against what it may hold
#: unanswered (``Inference.parked``): this is their bound.
BACKLOG_MAX = 10_000
BACKLOG_BYTES = 256 << 20
#: Sequences remembered as lost with their worker, so that their next request is told
#: why (503) rather than "must specify the START flag"; the oldest are forgotten past it.
LOST_MAX = 4096
#: Seconds between looks for a place for the backlog while no instance of the version
#: runs (its worker stopped and its replacement has not loaded it yet).
BACKLOG_RETRY_S = 0.1


class SequenceStep(Step):
    """A request of a sequence: what its batch needs, and its answer."""

    __slots__ = (
        "placements", "outputs", "owned", "tag", "start_ns", "stats", "future", "expiry",
        "ordered", "slot_deadline", "nbytes", "on_parked", "parked",
    )  # fmt: skip

    def __init__(
        self,
        placements: list[Placement],
        inference: Inference,
        tag: SequenceTag,
        start_ns: int,
        stats: ModelStats,
        future: asyncio.Future[InferResult],
    ) -> None:
        super().__init__(start_ns, _signature(placements))
        self.placements = placements
        self.outputs = inference.output_names
        self.owned = inference.owned
        self.tag = tag
        self.start_ns = start_ns
        self.stats = stats
        self.future = future
        self.expiry: asyncio.TimerHandle | None = None
        #: When (loop time) it fails while its sequence holds a slot (``_expire_step``).
        self.slot_deadline = 0.0
        #: In the answers' arrival order (oldest ``preserve_ordering``): from when its
        #: sequence holds a place, as Triton orders what its batcher holds.
        self.ordered = False
        #: Its inputs' bytes, counted in the backlog's bound while it waits there.
        self.nbytes = sum(nbytes for _, _, nbytes, _ in placements)
        #: Told while it waits in the backlog (``Inference.parked``: a stream's request).
        self.on_parked = inference.parked
        #: Waiting in the backlog: its sequence has no place yet (``SequenceSlots._park``).
        self.parked = False

    def release_inputs(self) -> None:
        owned, self.owned = self.owned, []
        for held in owned:
            held.release()


#: A sequence and a lane of this batcher: its requests, on worker links.
Seq = Sequence[SequenceStep, WorkerLink]
SeqLane = Lane[SequenceStep, WorkerLink]


class SequenceSlots:
    """The sequences of one model version, their places on the lanes and their timers."""

    def __init__(
        self, intake: Intake, dispatch: Dispatch, model: ModelVersion, policy: SequencePolicy
    ) -> None:
        self.intake = intake
        self.dispatch = dispatch
        self.model = model
        self.policy = policy
        self._loop = asyncio.get_running_loop()
        self.batched = model.max_batch_size > 0
        #: Live sequences by id (an ended one leaves at its END request).
        self.sequences: dict[int | str, Seq] = {}
        #: Started sequences waiting for a place on a lane, in order.
        self.backlog: deque[Seq] = deque()
        #: Requests waiting in the backlog (of the sequences there), and their inputs' bytes.
        self.parked = 0
        self.parked_bytes = 0
        self.lanes: dict[int, SeqLane] = {}
        #: Ids of sequences whose worker stopped, until they START again.
        self.lost: dict[int | str, str] = {}
        # NOTE: handles name sequences in the workers' state, which every front of the
        #   server (--http-workers) shares: each front numbers its own from its pid up.
        self._handles = os.getpid() << 32
        self._idle: dict[int, asyncio.TimerHandle] = {}
        self._wakeups: dict[int, asyncio.TimerHandle] = {}
        #: The next look for a place for the backlog, while no instance runs.
        self._backlog_retry: asyncio.TimerHandle | None = None
        self._states = [
            SequenceState(
                s.input_name,
                s.output_name,
                s.datatype,
                list(s.initial_dims or [1 if d == -1 else d for d in s.dims]),
                s.initial_data,
            )
            for s in policy.states
        ]
        self._places = (
            max(model.max_batch_size, 1)
            if policy.strategy == "direct"
            else max(policy.max_candidate_sequences, model.max_batch_size, 1)
        )
        #: Answers held back to leave in arrival order (oldest ``preserve_ordering``).
        self._order: deque[SequenceStep] | None = (
            deque() if policy.strategy == "oldest" and policy.preserve_ordering else None
        )
        self._outcomes: dict[int, InferResult | BaseException] = {}
        #: Set when the version leaves service (``close``): no batch starts any more.
        self._closed = False
        model.sequencer_close = self.close

    def close(self, error: Unavailable) -> None:
        """The version leaves service (unloaded, replaced): every request still waiting,
        in the backlog for a slot or on its lane for the next batch, is answered ``error``
        (503) now rather than at its deadline, as the dynamic batcher answers its queue;
        batches already running finish. Its sequences are forgotten: the workers drop the
        version, and its state with it."""
        self._closed = True
        if self._backlog_retry is not None:
            self._backlog_retry.cancel()
            self._backlog_retry = None
        for timer in (*self._wakeups.values(), *self._idle.values()):
            timer.cancel()
        self._wakeups.clear()
        self._idle.clear()
        held = [s for lane in self.lanes.values() for s in lane.slots if s is not None]
        for sequence in (*self.backlog, *held):
            sequence.ending = True
            for step in list(sequence.queue):
                if not step.taken:
                    self._finish(sequence, step, error)
        self.backlog.clear()
        self.sequences.clear()
        self.lost.clear()

    # ---- lanes, the backlog ------------------------------------------------------

    def _alive(self, lane: SeqLane) -> bool:
        worker = lane.worker
        return (
            not lane.dead
            and worker.alive
            and (worker.pid or 0) == lane.pid
            and self.model.key in worker.models
        )

    def _free_lane(self) -> SeqLane | None:
        """The running lane with a free place and the fewest sequences (lanes made for
        the version's workers as they come, and for a restarted worker anew)."""
        best: SeqLane | None = None
        for worker in self.model.instances():
            lane = self.lanes.get(id(worker))
            if lane is None or lane.pid != (worker.pid or 0):
                if lane is not None:
                    self._lane_lost(lane)
                lane = self.lanes[id(worker)] = Lane(worker, worker.pid or 0, self._places)
            if not self._alive(lane) or lane.free_slot() < 0:
                continue
            if best is None or lane.used < best.used:
                best = lane
        return best

    def worker_gone(self, worker: WorkerLink) -> None:
        """A worker stopped: its lane's sequences fail now (503), not at their next
        request, and the backlog looks for places on its replacement (a START waiting for
        a place that a sequence of that worker held was never answered, found by fuzzing)."""
        lane = self.lanes.get(id(worker))
        if lane is not None:
            self._lane_lost(lane)

    def _lane_lost(self, lane: SeqLane) -> None:
        """The lane's worker stopped: its sequences fail (503) and are forgotten."""
        if lane.dead:
            return
        lane.dead = True
        if self.lanes.get(id(lane.worker)) is lane:
            del self.lanes[id(lane.worker)]
        for held in lane.slots:
            if held is None:
                continue
            held.ending = True
            message = self._lost_message(held)
            if self.sequences.get(held.sequence_id) is held:
                del self.sequences[held.sequence_id]
                self.lost[held.sequence_id] = message
            self._drop_idle(held)
            for step in list(held.queue):
                if not step.taken:
                    self._finish(held, step, Unavailable(message, retry_after=1))
            lane.release(held)
        while len(self.lost) > LOST_MAX:
            del self.lost[next(iter(self.lost))]
        self._assign_backlog()

    def _lost_message(self, sequence: Seq) -> str:
        return (
            f"the instance of model '{self.model.name}' that held sequence "
            f"{sequence.sequence_id} stopped; the sequence must start again (sequence_start)"
        )

    def _assign_backlog(self) -> None:
        """Places for the started sequences waiting, first come first placed. While no
        instance of the version runs (its worker stopped, the replacement not there yet)
        nothing else would free one: look again in ``BACKLOG_RETRY_S`` (a START waiting
        then was never answered, found by fuzzing)."""
        while self.backlog:
            lane = self._free_lane()
            if lane is None:
                if not any(self._alive(held) for held in self.lanes.values()):
                    self._retry_backlog_later()
                return
            sequence = self.backlog.popleft()
            lane.take(sequence, lane.free_slot())
            self._now_ordered(sequence.queue)
            for step in sequence.queue:
                self._unpark(step)

    def _retry_backlog_later(self) -> None:
        if self._backlog_retry is None and not self._closed:
            self._backlog_retry = self._loop.call_later(BACKLOG_RETRY_S, self._retry_backlog)

    def _retry_backlog(self) -> None:
        self._backlog_retry = None
        self._assign_backlog()
        self._pump_all()

    def _now_ordered(self, steps: Iterable[SequenceStep]) -> None:
        """``steps`` join the answers' arrival order (oldest ``preserve_ordering``) as
        their sequence gets its place: one waiting in the backlog held back every later
        answer of the version (found by fuzzing)."""
        order = self._order
        if order is not None:
            for step in steps:
                step.ordered = True
                order.append(step)

    def _start(self, sequence_id: int | str, nbytes: int) -> Seq:
        """A new sequence for a START of ``nbytes``: on a free place, else in the backlog
        (503 when the backlog is full)."""
        if self.backlog:  # those waiting are placed first (a place may have come since)
            self._assign_backlog()
        lane = None if self.backlog else self._free_lane()
        if lane is None:
            self._check_backlog_room(nbytes)
        self._handles += 1
        sequence: Seq = Sequence(self._handles, sequence_id)
        self.sequences[sequence_id] = sequence
        if lane is None:
            self.backlog.append(sequence)
        else:
            lane.take(sequence, lane.free_slot())
        return sequence

    def _check_backlog_room(self, nbytes: int) -> None:
        """Unavailable (503) when a request of ``nbytes`` would pass the backlog's bound."""
        if self.parked < BACKLOG_MAX and (
            self.parked_bytes + nbytes <= BACKLOG_BYTES or not self.parked
        ):
            return
        raise Unavailable(
            f"model '{self.model.name}': {self.parked} requests ({self.parked_bytes} bytes) "
            f"already wait for a sequence slot (at most {BACKLOG_MAX}, {BACKLOG_BYTES} "
            "bytes); retry",
            retry_after=1,
        )

    def _park(self, step: SequenceStep) -> None:
        """``step`` waits in the backlog: counted in its bound, its stream told."""
        if step.parked:
            return
        step.parked = True
        self.parked += 1
        self.parked_bytes += step.nbytes
        if step.on_parked is not None:
            step.on_parked(True, step.nbytes)

    def _unpark(self, step: SequenceStep) -> None:
        """``step`` no longer waits in the backlog (placed, or answered)."""
        if not step.parked:
            return
        step.parked = False
        self.parked -= 1
        self.parked_bytes -= step.nbytes
        if step.on_parked is not None:
            step.on_parked(False, step.nbytes)

    def _pump_all(self) -> None:
        """Start each lane's batch that is due (``sequence_batches.SequenceBatches``)."""
        raise NotImplementedError

    # ---- answers, expiry ---------------------------------------------------------

    def _finish(
        self,
        sequence: Seq,
        step: SequenceStep,
        outcome: InferResult | BaseException,
        ran: bool = False,
    ) -> None:
        """The step's answer (or failure), counted once, in arrival order if asked."""
        self._unpark(step)
        if not step.taken:
            try:
                sequence.queue.remove(step)
            except ValueError:
                pass
            step.release_inputs()
        if step.expiry is not None:
            step.expiry.cancel()
        step.stats.pending -= 1
        if isinstance(outcome, BaseException):
            reason = failure_reason(outcome) if ran else refusal_reason(outcome)
            step.stats.request_failed(reason, monotonic_ns() - step.start_ns)
        order = self._order
        if order is None or not step.ordered:
            _settle(step.future, outcome)
            return
        self._outcomes[id(step)] = outcome
        while order and id(order[0]) in self._outcomes:
            head = order.popleft()
            _settle(head.future, self._outcomes.pop(id(head)))

    def _expire_step(self, sequence: Seq, step: SequenceStep) -> None:
        """The request's deadline: one still waiting leaves its sequence's queue. One
        running is answered when it ends, as Triton answers it: its state changes with it,
        so a step answered as failed still moved the sequence on (found by fuzzing).

        A request's ``timeout`` bounds only its wait for a slot (Triton's backlog): once its
        sequence holds one, it waits on to its ``slot_deadline``. It failed, and the sequence
        went on without its input (found by fuzzing).
        """
        if step.taken or step.future.done():
            return
        if sequence.lane is not None and step.slot_deadline > self._loop.time():
            step.expiry = self._loop.call_at(step.slot_deadline, self._expire_step, sequence, step)
            return
        exc: BaseException = (
            Unavailable(BACKLOG_TIMEOUT) if sequence.lane is None else DeadlineExceeded()
        )
        self._finish(sequence, step, exc)
        self._after(sequence)

    def _after(self, sequence: Seq) -> None:
        """A sequence with nothing left to run: ended, or idle until its expiry."""
        if not sequence.idle:
            return
        if sequence.ending:
            # (an END that never ran, failed or expired or withdrawn in the queue, told the
            #   worker nothing: its state stayed there, 4 MiB a sequence of one model, for
            #   good; found by fuzzing)
            self._release(sequence, told=sequence.end_taken)
            return
        if sequence.lane is None:  # in the backlog with nothing left: it never ran
            if self.sequences.get(sequence.sequence_id) is sequence:
                del self.sequences[sequence.sequence_id]
            self._release(sequence, told=True)
            return
        self._drop_idle(sequence)
        self._idle[sequence.handle] = self._loop.call_later(
            self.policy.idle_ns / 1e9, self._expire_idle, sequence
        )

    def _drop_idle(self, sequence: Seq) -> None:
        idle = self._idle.pop(sequence.handle, None)
        if idle is not None:
            idle.cancel()

    def _expire_idle(self, sequence: Seq) -> None:
        """Idle past ``max_sequence_idle_microseconds``: it loses its place and state."""
        self._idle.pop(sequence.handle, None)
        if not sequence.idle:
            return
        if self.sequences.get(sequence.sequence_id) is sequence:
            del self.sequences[sequence.sequence_id]
        self._release(sequence, told=False)

    def _release(self, sequence: Seq, told: bool) -> None:
        """The sequence is over: its place goes to the backlog; the worker frees its
        state unless its END request already told it."""
        self._drop_idle(sequence)
        lane = sequence.lane
        if lane is not None:
            if not told and self._states and self._alive(lane):
                lane.worker.send(EndSequences(self.model.key, [sequence.handle]))
            lane.release(sequence)
        elif sequence in self.backlog:
            self.backlog.remove(sequence)
        self._assign_backlog()
        self._pump_all()


# ---- helpers ------------------------------------------------------------------------


def _signature(placements: list[Placement]) -> Hashable:
    return tuple(
        (tensor.name, tensor.datatype, tuple(shape[1:]), tensor.image)
        for tensor, shape, _, _ in placements
    )


def _settle(future: asyncio.Future[InferResult], outcome: InferResult | BaseException) -> None:
    if future.done():
        if isinstance(outcome, InferResult):
            outcome.release()  # its client went away, or its deadline passed
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
