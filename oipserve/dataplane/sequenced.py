"""Requests of a model with ``sequence_batching``: the sequence batcher (docs/sequences.md).

``DataPlane._choose`` gives such a version a ``Sequenced`` strategy. Each request names
its sequence (``sequence_id``, ``sequence_start``, ``sequence_end``: the fronts read them
into ``Inference.sequence``). A sequence sticks to one instance (worker, a *lane*) and a
place there from its START to its END (``oipserve.scheduling.sequence``); a lane runs one
batch at a time, at most one request of each sequence in it, so a sequence's requests run
in order. A batch goes to its worker as any does: its rows' inputs joined into one segment
(``batch_io.assemble``), with the control inputs the configuration names (START, END,
READY, CORRID, one [1, 1] row each, [1] without batching) added per row, and the
sequences of its rows (``SequenceRows``) so that the worker feeds and keeps their implicit
state. Empty slots of a direct batch repeat another row's inputs with READY false (what
Triton calls their undefined contents).

Failures, in Triton's words: no sequence id, a non-START request for a sequence that is not
live (never started, ended, idle past ``max_sequence_idle_microseconds``), a batch size
other than 1 (400); a request still waiting for a slot at its timeout (503). When the
worker of a lane stops, its sequences fail with 503 and their next request must START
again (it gets a place on a running worker).
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections import deque
from collections.abc import Hashable
from time import monotonic_ns
from typing import TYPE_CHECKING

import numpy as np

from oipserve.dataplane.batch_io import assemble, batch_size
from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.intake import Intake, has_deferred
from oipserve.errors import DeadlineExceeded, InvalidInput, Unavailable
from oipserve.models.config.sequence import Control, SequencePolicy
from oipserve.pool.link import WorkerLink
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import Inference, InferResult, InputTensor
from oipserve.request.placement import Placement
from oipserve.scheduling.sequence import (
    Lane,
    Sequence,
    Step,
    direct_due,
    direct_rows,
    oldest_due,
    oldest_rows,
)
from oipserve.telemetry.stats import ModelStats, failure_reason, refusal_reason
from oipserve.wire.datatypes import NUMPY_DTYPES
from oipserve.wire.messages import EndSequences, Infer, InferDone, SequenceRows, SequenceState
from oipserve.wire.shm import Lease

if TYPE_CHECKING:
    from oipserve.models.registry import ModelVersion
    from oipserve.request.sequence_params import SequenceTag

__all__ = ["Sequenced", "control_value"]

log = logging.getLogger("oipserve.dataplane")

#: The message of a request still waiting for a slot at its timeout (Triton's).
BACKLOG_TIMEOUT = "timeout of the corresponding sequence has been expired"
#: Started sequences that may wait for a slot at once, per model version: past it a START
#: is refused (503) rather than kept without bound.
BACKLOG_MAX = 10_000
#: Sequences remembered as lost with their worker, so that their next request is told
#: why (503) rather than "must specify the START flag"; the oldest are forgotten past it.
LOST_MAX = 4096


class _Step(Step):
    """A request of a sequence: what its batch needs, and its answer."""

    __slots__ = (
        "placements", "outputs", "owned", "tag", "start_ns", "stats", "future", "expiry",
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

    def release_inputs(self) -> None:
        owned, self.owned = self.owned, []
        for held in owned:
            held.release()


_Seq = Sequence[_Step, WorkerLink]
_Lane = Lane[_Step, WorkerLink]


class Sequenced:
    """The sequence batcher of one model version."""

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
        self.sequences: dict[int | str, _Seq] = {}
        #: Started sequences waiting for a place on a lane, in order.
        self.backlog: deque[_Seq] = deque()
        self.lanes: dict[int, _Lane] = {}
        #: Ids of sequences whose worker stopped, until they START again.
        self.lost: dict[int | str, str] = {}
        # NOTE: handles name sequences in the workers' state, which every front of the
        #   server (--http-workers) shares: each front numbers its own from its pid up.
        self._handles = os.getpid() << 32
        self._idle: dict[int, asyncio.TimerHandle] = {}
        self._wakeups: dict[int, asyncio.TimerHandle] = {}
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
        self._order: deque[_Step] | None = (
            deque() if policy.strategy == "oldest" and policy.preserve_ordering else None
        )
        self._outcomes: dict[int, InferResult | BaseException] = {}
        #: Set when the version leaves service (``close``): no batch starts any more.
        self._closed = False
        model.sequencer_close = self.close

    # ---- one request -----------------------------------------------------------

    async def run(self, inference: Inference, stats: ModelStats, start: int) -> InferResult:
        """Check the request, queue it on its sequence, and await its answer."""
        try:
            tag = self._tag(inference)
            placements = self.intake.check(inference)
            self._check_batch_size(placements)
            self.model.check_serving()
            sequence = self._sequence_of(tag)
        except BaseException as exc:
            _release(inference.owned)
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        future: asyncio.Future[InferResult] = self._loop.create_future()
        step = _Step(placements, inference, tag, start, stats, future)
        deadline = self.intake.deadline(inference)
        self._enqueue(sequence, step, deadline)
        if has_deferred(placements) or any(t.region is not None for t, _, _, _ in placements):
            step.ready = False
            try:
                step.placements = await self._ready_inputs(step, deadline)
            except BaseException as exc:
                self._withdraw(sequence, step, exc)
            step.ready = True
        self._pump_all()
        if inference.watch is not None:
            inference.watch(future.cancel)
        try:
            return await future
        finally:
            if future.cancelled() and not step.taken:  # its client went away
                self._finish(sequence, step, asyncio.CancelledError())
                self._after(sequence)
            if step.expiry is not None:
                step.expiry.cancel()

    def _tag(self, inference: Inference) -> SequenceTag:
        tag = inference.sequence
        if tag is None or not tag.sequence_id:
            raise InvalidInput(
                f"inference request to model '{self.model.name}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        corrid = self.policy.control("CORRID")
        if isinstance(tag.sequence_id, str) and corrid is not None and corrid.datatype != "BYTES":
            raise InvalidInput(
                f"inference request to model '{self.model.name}' has a string sequence id, "
                f"but its CONTROL_SEQUENCE_CORRID input '{corrid.name}' is {corrid.datatype}"
            )
        return tag

    def _check_batch_size(self, placements: list[Placement]) -> None:
        if not self.batched:
            return
        if any(shape[:1] != [1] for _, shape, _, _ in placements):
            raise InvalidInput(
                f"inference request to model '{self.model.name}' must specify batch-size 1 "
                "due to requirements of sequence batcher"
            )

    async def _ready_inputs(self, step: _Step, deadline: float) -> list[Placement]:
        """Large JSON data decoded by a worker, clients' regions read into segments."""
        placements = step.placements
        if has_deferred(placements):
            made: list[Lease | RegionUse] = []
            placements = await self.intake.decode_in_worker(self.model, placements, made, deadline)
            if step.future.done():  # failed while decoding (its deadline): nothing reads it
                _release(made)
                return placements
            step.owned.extend(made)
        self.intake.copy_regions(placements, step.owned)
        return placements

    def _sequence_of(self, tag: SequenceTag) -> _Seq:
        """The live sequence the request joins (a new one at START); 400 / 503 otherwise."""
        sequence = self.sequences.get(tag.sequence_id)
        if sequence is not None and sequence.lane is not None and not self._alive(sequence.lane):
            self._lane_lost(sequence.lane)
            sequence = None
        if tag.start:
            self.lost.pop(tag.sequence_id, None)
            if sequence is not None:
                log.warning(
                    "sequence %s for model '%s' has a conflict. The previous sequence did not "
                    "end before this sequence start. Previous sequence will be terminated "
                    "early.",
                    tag.sequence_id,
                    self.model.name,
                )
                return sequence
            return self._start(tag.sequence_id)
        if sequence is None:
            lost = self.lost.get(tag.sequence_id)
            if lost is not None:
                raise Unavailable(lost)
            raise InvalidInput(
                f"inference request for sequence {tag.sequence_id} to model "
                f"'{self.model.name}' must specify the START flag on the first request of "
                "the sequence"
            )
        return sequence

    def _start(self, sequence_id: int | str) -> _Seq:
        self._handles += 1
        sequence: _Seq = Sequence(self._handles, sequence_id)
        self.sequences[sequence_id] = sequence
        lane = self._free_lane()
        if lane is None:
            if len(self.backlog) >= BACKLOG_MAX:
                del self.sequences[sequence_id]
                raise Unavailable(
                    f"model '{self.model.name}': {BACKLOG_MAX} sequences already wait for a "
                    "slot; retry",
                    retry_after=1,
                )
            self.backlog.append(sequence)
        else:
            lane.take(sequence, lane.free_slot())
        return sequence

    def _enqueue(self, sequence: _Seq, step: _Step, deadline: float) -> None:
        idle = self._idle.pop(sequence.handle, None)
        if idle is not None:
            idle.cancel()
        sequence.queue.append(step)
        step.stats.pending += 1
        if self._order is not None:
            self._order.append(step)
        if step.tag.end:  # a later request of this id starts a new sequence
            sequence.ending = True
            if self.sequences.get(sequence.sequence_id) is sequence:
                del self.sequences[sequence.sequence_id]
        step.expiry = self._loop.call_at(deadline, self._expire_step, sequence, step)

    def close(self, error: Unavailable) -> None:
        """The version leaves service (unloaded, replaced): every request still waiting,
        in the backlog for a slot or on its lane for the next batch, is answered ``error``
        (503) now rather than at its deadline, as the dynamic batcher answers its queue;
        batches already running finish. Its sequences are forgotten: the workers drop the
        version, and its state with it."""
        self._closed = True
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

    # ---- lanes -------------------------------------------------------------------

    def _alive(self, lane: _Lane) -> bool:
        worker = lane.worker
        return (
            not lane.dead
            and worker.alive
            and (worker.pid or 0) == lane.pid
            and self.model.key in worker.models
        )

    def _free_lane(self) -> _Lane | None:
        """The running lane with a free place and the fewest sequences (lanes made for
        the version's workers as they come, and for a restarted worker anew)."""
        best: _Lane | None = None
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

    def _lane_lost(self, lane: _Lane) -> None:
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

    def _lost_message(self, sequence: _Seq) -> str:
        return (
            f"the instance of model '{self.model.name}' that held sequence "
            f"{sequence.sequence_id} stopped; the sequence must start again (sequence_start)"
        )

    def _assign_backlog(self) -> None:
        while self.backlog:
            lane = self._free_lane()
            if lane is None:
                return
            sequence = self.backlog.popleft()
            lane.take(sequence, lane.free_slot())

    def _pump_all(self) -> None:
        for lane in list(self.lanes.values()):
            self._pump(lane)

    def _pump(self, lane: _Lane) -> None:
        """Start the lane's next batch when it is idle and one is due."""
        if lane.busy or lane.dead or self._closed:
            return
        if not self._alive(lane):
            self._lane_lost(lane)
            return
        now = monotonic_ns()
        policy = self.policy
        rows: list[_Seq | None]
        if policy.strategy == "direct":
            rows = list(direct_rows(lane))
            due = direct_due(
                rows, lane.places, policy.minimum_slot_utilization,
                policy.max_queue_delay_ns, now,
            )  # fmt: skip
        else:
            oldest = oldest_rows(lane, self.model.max_batch_size)
            due = oldest_due(oldest, policy.preferred_batch_sizes, policy.max_queue_delay_ns, now)
            rows = list(oldest)
        if not rows:
            return
        if due:
            self._wake_at(lane, due, now)
            return
        wakeup = self._wakeups.pop(id(lane), None)
        if wakeup is not None:
            wakeup.cancel()
        lane.busy = True
        steps: list[_Step | None] = []
        for row in rows:
            if row is None:
                steps.append(None)
                continue
            step = row.queue.popleft()
            step.taken = True
            row.in_batch = True
            steps.append(step)
        task = self._loop.create_task(self._run_batch(lane, rows, steps))
        task.add_done_callback(_forget)

    def _wake_at(self, lane: _Lane, due: int, now: int) -> None:
        if id(lane) in self._wakeups:
            return

        def wake() -> None:
            self._wakeups.pop(id(lane), None)
            self._pump(lane)

        self._wakeups[id(lane)] = self._loop.call_later((due - now) / 1e9, wake)

    # ---- one batch ---------------------------------------------------------------

    async def _run_batch(
        self, lane: _Lane, rows: list[_Seq | None], steps: list[_Step | None]
    ) -> None:
        try:
            results = await self._execute(lane.worker, rows, steps)
        except BaseException as exc:
            alive = self._alive(lane)
            for row, step in zip(rows, steps, strict=True):
                if row is not None and step is not None:
                    failed = exc if alive else Unavailable(self._lost_message(row), 1)
                    self._finish(row, step, failed, ran=True)
            if not alive:
                self._lane_lost(lane)
            else:  # the worker kept no state of a failed batch, but holds the sequences' before
                ended = [
                    row.handle
                    for row, step in zip(rows, steps, strict=True)
                    if row is not None and step is not None and step.tag.end
                ]
                if ended and self._states:
                    lane.worker.send(EndSequences(self.model.key, ended))
        else:
            for row, step, result in zip(rows, steps, results, strict=True):
                if row is None or step is None:
                    result.release()  # an empty slot's row
                else:
                    self._finish(row, step, result, ran=True)
        finally:
            lane.busy = False
            for row in rows:
                if row is not None:
                    row.in_batch = False
                    self._after(row)
            self._assign_backlog()
            self._pump_all()

    async def _execute(
        self, worker: WorkerLink, rows: list[_Seq | None], steps: list[_Step | None]
    ) -> list[InferResult]:
        """Run one batch on the lane's worker; one result per row."""
        model = self.model
        filler = next(step for step in steps if step is not None)
        joined = [
            [*(step or filler).placements, *self._controls(row, step)]
            for row, step in zip(rows, steps, strict=True)
        ]
        lease: Lease | None = None
        try:
            lease = await self.intake.inputs.acquire_async(batch_size(joined))
            descs = assemble(joined, lease)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        finally:
            for step in steps:
                if step is not None:
                    step.release_inputs()
        computed = _outputs(model, [step for step in steps if step is not None])
        sequence = SequenceRows(
            self._states,
            [row.handle if row is not None else 0 for row in rows],
            [bool(step is not None and step.tag.start) for step in steps],
            [bool(step is not None and step.tag.end) for step in steps],
            self.batched,
        )
        held = lease
        key = model.key
        try:
            waiting = worker.call(
                lambda rid: Infer(rid, key, descs, computed, [], [], sequence), held.release
            )
        except BaseException:
            held.release()
            raise
        done = worker.inferred(await waiting)
        for name in done.dropped:
            self.dispatch.outputs.forget(name)
        results = self.dispatch.results(worker, model, done, [1] * len(rows))
        _record(filler.stats, [s for s in steps if s is not None], done)
        for step, result in zip(steps, results, strict=True):
            if step is not None and step.outputs and step.outputs != computed:
                by_name = {tensor.name: tensor for tensor in result.outputs}
                result.outputs = [by_name[name] for name in step.outputs]
        return results

    def _controls(self, row: _Seq | None, step: _Step | None) -> list[Placement]:
        """The control inputs of one row: [1, 1] each ([1] without batching)."""
        placements: list[Placement] = []
        shape = [1, 1] if self.batched else [1]
        if row is None or step is None:
            for control in self.policy.controls:
                placements.append(control_value(control, None, False, False, shape))
            return placements
        start, end = step.tag.start, step.tag.end
        for control in self.policy.controls:
            placements.append(control_value(control, row.sequence_id, start, end, shape))
        return placements

    # ---- answers, expiry ---------------------------------------------------------

    def _finish(
        self,
        sequence: _Seq,
        step: _Step,
        outcome: InferResult | BaseException,
        ran: bool = False,
    ) -> None:
        """The step's answer (or failure), counted once, in arrival order if asked."""
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
        if self._order is None:
            _settle(step.future, outcome)
            return
        self._outcomes[id(step)] = outcome
        order = self._order
        while order and id(order[0]) in self._outcomes:
            head = order.popleft()
            _settle(head.future, self._outcomes.pop(id(head)))

    def _withdraw(self, sequence: _Seq, step: _Step, exc: BaseException) -> None:
        if not step.taken and not step.future.done():
            self._finish(sequence, step, exc)

    def _expire_step(self, sequence: _Seq, step: _Step) -> None:
        """The request's deadline: one still waiting leaves its sequence's queue."""
        if step.taken or step.future.done():
            if not step.future.done():  # running: its answer is released when it comes
                step.future.set_exception(DeadlineExceeded())
            return
        exc: BaseException = (
            Unavailable(BACKLOG_TIMEOUT) if sequence.lane is None else DeadlineExceeded()
        )
        self._finish(sequence, step, exc)
        self._after(sequence)

    def _after(self, sequence: _Seq) -> None:
        """A sequence with nothing left to run: ended, or idle until its expiry."""
        if not sequence.idle:
            return
        if sequence.ending:
            self._release(sequence, told=True)
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

    def _drop_idle(self, sequence: _Seq) -> None:
        idle = self._idle.pop(sequence.handle, None)
        if idle is not None:
            idle.cancel()

    def _expire_idle(self, sequence: _Seq) -> None:
        """Idle past ``max_sequence_idle_microseconds``: it loses its place and state."""
        self._idle.pop(sequence.handle, None)
        if not sequence.idle:
            return
        if self.sequences.get(sequence.sequence_id) is sequence:
            del self.sequences[sequence.sequence_id]
        self._release(sequence, told=False)

    def _release(self, sequence: _Seq, told: bool) -> None:
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


def _outputs(model: ModelVersion, steps: list[_Step]) -> list[str]:
    """Every output a request of the batch asked for (all when one asked for none)."""
    if any(not step.outputs for step in steps):
        return [tensor.name for tensor in model.outputs]
    return list(dict.fromkeys(name for step in steps for name in step.outputs))


def control_value(
    control: Control, sequence_id: int | str | None, start: bool, end: bool, shape: list[int]
) -> Placement:
    """One row's value of one control input; ``sequence_id`` None: an empty slot (READY
    false, and every other control false or 0)."""
    tensor = InputTensor(control.name, control.datatype, shape)
    if control.kind == "CORRID":
        if control.datatype == "BYTES":
            text = str(sequence_id).encode() if sequence_id is not None else b""
            data = struct.pack("<I", len(text)) + text
            return tensor, shape, len(data), memoryview(data)
        number = sequence_id if isinstance(sequence_id, int) else 0
        # NOTE: a 32-bit (or signed) CORRID keeps the id's low bits, as Triton's does.
        array = np.array([number], dtype=np.uint64).astype(NUMPY_DTYPES[control.datatype])
    else:
        flag = {"START": start, "END": end, "READY": sequence_id is not None}[control.kind]
        value = control.true_value if flag else control.false_value
        array = np.array([value], dtype=NUMPY_DTYPES[control.datatype])
    array = array.reshape(shape)
    return tensor, shape, array.nbytes, array


def _record(stats: ModelStats, steps: list[_Step], done: InferDone) -> None:
    """One execution, and each request's success with its share of the phases; queue time
    from its arrival (waiting for a slot included) to the worker's start."""
    input_ns, infer_ns, output_ns = done.input_ns, done.infer_ns, done.output_ns
    started = done.started_ns
    rows = len(steps)
    stats.executed(rows, input_ns, infer_ns, output_ns)
    now = monotonic_ns()
    for step in steps:
        step.stats.request_succeeded(
            1,
            now - step.start_ns,
            max(0, started - step.enqueued_ns),
            input_ns // rows,
            infer_ns // rows,
            output_ns // rows,
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


def _release(owned: list[Lease | RegionUse]) -> None:
    for held in owned:
        held.release()


def _forget(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a sequence batch failed unexpectedly", exc_info=task.exception())
