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

The code is in three layers, one job each: ``Sequenced`` here, a request's way in (its
checks, the sequence it joins, its queue); ``sequence_batches``, when a lane's batch runs and
running it; ``sequence_slots``, the sequences' places, the backlog, answers and timers.

With ``--http-workers N`` a version's sequences live in the primary front alone: another
front checks a request (``run``) and sends it there (``elsewhere``,
``scaleout.batch_link``), where it joins its sequence (``run_checked``), so that a sequence
may come through any front, as any connection reaches Triton's one process.
"""

from __future__ import annotations

import asyncio
import logging
from time import monotonic_ns
from typing import TYPE_CHECKING

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.intake import Intake, has_deferred
from oipserve.dataplane.sequence_batches import SequenceBatches
from oipserve.dataplane.sequence_slots import Seq, SequenceStep
from oipserve.dataplane.strategies import CheckedQueue
from oipserve.errors import (
    InvalidInput,
    Unavailable,
    Withdrawn,
    cancelled_by_client,
    request_tag,
)
from oipserve.models.config.sequence import SequencePolicy
from oipserve.models.registry import ModelVersion
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import Inference, InferResult
from oipserve.request.placement import Placement
from oipserve.telemetry.stats import ModelStats, refusal_reason
from oipserve.wire.shm import Lease

if TYPE_CHECKING:
    from oipserve.request.sequence_params import SequenceTag

__all__ = ["Sequenced"]

log = logging.getLogger("oipserve.dataplane")


class Sequenced(SequenceBatches):
    """The sequence batcher of one model version (``DataPlane._choose``'s strategy)."""

    def __init__(
        self,
        intake: Intake,
        dispatch: Dispatch,
        model: ModelVersion,
        policy: SequencePolicy,
        elsewhere: CheckedQueue | None = None,
    ) -> None:
        super().__init__(intake, dispatch, model, policy)
        #: Set in a front other than the primary: the primary's sequence batcher.
        self.elsewhere = elsewhere

    # ---- one request -----------------------------------------------------------

    async def run(self, inference: Inference, stats: ModelStats, start: int) -> InferResult:
        """Check the request, queue it on its sequence (here, or in the primary's), and
        await its answer."""
        try:
            # (Triton's order: core's checks, the CORRID's datatype last among them, then
            #  its sequence batcher's batch size and correlation ID)
            placements = self.intake.check(inference)
            self._check_corrid(inference)
            self._check_batch_size(placements)
            self._tag(inference)
        except BaseException as exc:
            _release(inference.owned)
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        deadline = self.intake.deadline(inference)
        elsewhere = self.elsewhere
        if elsewhere is None:
            return await self.run_checked(inference, placements, stats, start, deadline)
        placements = await self._inputs_here(inference, placements, stats, start, deadline)
        return await elsewhere(inference, stats, start, placements, deadline)

    async def _inputs_here(
        self,
        inference: Inference,
        placements: list[Placement],
        stats: ModelStats,
        start: int,
        deadline: float,
    ) -> list[Placement]:
        """Before a checked request crosses to the primary: its large JSON decoded, its
        clients' regions read (the primary gets its inputs' bytes)."""
        owned = inference.owned
        try:
            if has_deferred(placements):
                placements = await self.intake.decode_in_worker(
                    self.model, placements, owned, deadline
                )
            self.intake.copy_regions(inference, placements, owned)
        except BaseException as exc:
            _release(owned)
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        return placements

    async def run_checked(
        self,
        inference: Inference,
        placements: list[Placement],
        stats: ModelStats,
        start: int,
        deadline: float,
    ) -> InferResult:
        """A checked request (here, or by another front) queued on its sequence; its
        answer."""
        future: asyncio.Future[InferResult] = self._loop.create_future()
        try:
            tag = self._tag(inference)
            self.model.check_serving()
            step = SequenceStep(placements, inference, tag, start, stats, future)
            sequence = self._sequence_of(tag, step.nbytes)
        except BaseException as exc:
            _release(inference.owned)
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        step.slot_deadline = self._slot_deadline(inference, deadline)
        self._enqueue(sequence, step, deadline)
        if has_deferred(placements) or any(t.region is not None for t, _, _, _ in placements):
            step.ready = False
            try:
                step.placements = await self._ready_inputs(inference, step, deadline)
            except BaseException as exc:
                self._withdraw(sequence, step, exc)
            step.ready = True
        self._pump_all()
        if inference.watch is not None:
            inference.watch(future.cancel)
        try:
            return await future
        except asyncio.CancelledError:
            if cancelled_by_client(future):  # an answer as the batcher's, not a traceback
                if step.taken:
                    raise Withdrawn("the client went away while its request ran") from None
                raise Withdrawn() from None
            raise
        finally:
            if future.cancelled() and not step.taken:  # its client went away
                self._finish(sequence, step, asyncio.CancelledError())
                self._after(sequence)
            if step.expiry is not None:
                step.expiry.cancel()

    def _slot_deadline(self, inference: Inference, deadline: float) -> float:
        """When a request fails while its sequence holds a slot: its ``timeout`` bounds only
        the wait for one (Triton's backlog), so ``--infer-timeout`` and the client's own
        deadline do."""
        if not inference.timeout_us:
            return deadline
        bound = self._loop.time() + self.intake.infer_timeout
        if inference.deadline is not None:
            bound = min(bound, inference.deadline)
        return max(bound, deadline)

    def _tag(self, inference: Inference) -> SequenceTag:
        tag = inference.sequence
        if tag is None or not tag.sequence_id:
            raise InvalidInput(
                f"inference request to model '{self.model.name}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        return tag

    def _check_corrid(self, inference: Inference) -> None:
        """InvalidInput for a sequence id of another kind than the model's CORRID (a string
        id to a numeric CORRID, a numeric id to a TYPE_STRING one), in Triton's words first
        (core's ValidateCorrelationId). (A numeric id to a string CORRID was given as its
        decimal text until 2026-11-30; Triton refuses it.)"""
        tag, corrid = inference.sequence, self.policy.control("CORRID")
        if tag is None or corrid is None:
            return
        string_id = isinstance(tag.sequence_id, str)
        if string_id == (corrid.datatype == "BYTES"):
            return
        given, kind = ("BYTES", "a string") if string_id else ("UINT64", "a number")
        raise InvalidInput(
            f"{request_tag(inference.request_id)}sequence batching control "
            f"'{corrid.name}' data-type is '{given}', but model "
            f"'{self.model.name}' expects '{corrid.datatype}': the request's sequence id "
            f"is {kind}, its CONTROL_SEQUENCE_CORRID input '{corrid.name}' is "
            f"{corrid.datatype}"
        )

    def _check_batch_size(self, placements: list[Placement]) -> None:
        if not self.batched:
            return
        if any(shape[:1] != [1] for _, shape, _, _ in placements):
            raise InvalidInput(
                f"inference request to model '{self.model.name}' must specify batch-size 1 "
                "due to requirements of sequence batcher"
            )

    async def _ready_inputs(
        self, inference: Inference, step: SequenceStep, deadline: float
    ) -> list[Placement]:
        """Large JSON data decoded by a worker, clients' regions read into segments."""
        placements = step.placements
        if has_deferred(placements):
            made: list[Lease | RegionUse] = []
            placements = await self.intake.decode_in_worker(self.model, placements, made, deadline)
            if step.future.done():  # failed while decoding (its deadline): nothing reads it
                _release(made)
                return placements
            step.owned.extend(made)
        self.intake.copy_regions(inference, placements, step.owned)
        return placements

    def _sequence_of(self, tag: SequenceTag, nbytes: int) -> Seq:
        """The live sequence the request (of ``nbytes``) joins (a new one at START); 400 /
        503 otherwise (503 too when it would wait in a full backlog)."""
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
            else:
                return self._start(tag.sequence_id, nbytes)
        elif sequence is None:
            lost = self.lost.get(tag.sequence_id)
            if lost is not None:
                raise Unavailable(lost)
            raise InvalidInput(
                f"inference request for sequence {tag.sequence_id} to model "
                f"'{self.model.name}' must specify the START flag on the first request of "
                "the sequence"
            )
        if sequence.lane is None:  # it waits in the backlog
            self._check_backlog_room(nbytes)
        return sequence

    def _enqueue(self, sequence: Seq, step: SequenceStep, deadline: float) -> None:
        idle = self._idle.pop(sequence.handle, None)
        if idle is not None:
            idle.cancel()
        sequence.queue.append(step)
        step.stats.pending += 1
        if sequence.lane is not None:  # (in the backlog: ordered once placed)
            self._now_ordered((step,))
        else:
            self._park(step)
        if step.tag.end:  # a later request of this id starts a new sequence
            sequence.ending = True
            if self.sequences.get(sequence.sequence_id) is sequence:
                del self.sequences[sequence.sequence_id]
        step.expiry = self._loop.call_at(deadline, self._expire_step, sequence, step)

    def _withdraw(self, sequence: Seq, step: SequenceStep, exc: BaseException) -> None:
        """A step whose inputs could not be made ready fails; its sequence goes on as after
        any step (freed at its END or when idle: it kept its slot for ever, found by
        fuzzing)."""
        if not step.taken and not step.future.done():
            self._finish(sequence, step, exc)
            self._after(sequence)


# ---- helpers ------------------------------------------------------------------------


def _release(owned: list[Lease | RegionUse]) -> None:
    for held in owned:
        held.release()
