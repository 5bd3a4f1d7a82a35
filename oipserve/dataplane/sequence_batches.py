"""The batches of a sequence model's lanes: when one is due, and running it on the worker.

``SequenceBatches`` (between ``sequence_slots.SequenceSlots`` and ``sequenced.Sequenced``)
starts a lane's next batch when the lane is idle and one is due by the strategy's rules
(``direct`` or ``oldest``: ``scheduling.sequence``), or sets a timer for when one will be.
It runs the batch on the lane's worker: the rows' inputs joined into one segment with each
row's control inputs (START, END, READY, CORRID: ``control_value``; an empty slot repeats
another row's inputs with READY false), the rows' sequences (``SequenceRows``) so that the
worker feeds and keeps their state; then each row's answer, or its failure (a stopped
worker fails its whole lane).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import struct
from time import monotonic_ns
from typing import TYPE_CHECKING

import numpy as np

from oipserve.dataplane.batch_io import assemble, batch_size
from oipserve.dataplane.dispatch import infer_on, sendable
from oipserve.dataplane.sequence_slots import Seq, SeqLane, SequenceSlots, SequenceStep
from oipserve.errors import Unavailable
from oipserve.models.config.sequence import Control
from oipserve.pool.link import WorkerLink
from oipserve.request.inference import InferResult, InputTensor
from oipserve.request.placement import Placement
from oipserve.scheduling.sequence import direct_due, direct_rows, oldest_due, oldest_rows
from oipserve.telemetry.stats import ModelStats
from oipserve.wire.datatypes import NUMPY_DTYPES
from oipserve.wire.messages import EndSequences, Infer, InferDone, SequenceRows
from oipserve.wire.shm import Lease

if TYPE_CHECKING:
    from oipserve.models.registry import ModelVersion

__all__ = ["SequenceBatches", "control_value"]

log = logging.getLogger("oipserve.dataplane")


class SequenceBatches(SequenceSlots):
    """When each lane's next batch runs, and running it."""

    def _pump_all(self) -> None:
        for lane in list(self.lanes.values()):
            self._pump(lane)

    def _pump(self, lane: SeqLane) -> None:
        """Start the lane's next batch when it is idle and one is due."""
        if lane.busy or lane.dead or self._closed:
            return
        if not self._alive(lane):
            self._lane_lost(lane)
            return
        now = monotonic_ns()
        policy = self.policy
        rows: list[Seq | None]
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
        steps: list[SequenceStep | None] = []
        for row in rows:
            if row is None:
                steps.append(None)
                continue
            step = row.queue.popleft()
            step.taken = True
            row.in_batch = True
            row.end_taken = row.end_taken or step.tag.end
            steps.append(step)
        # (a batch is many clients' rows: not in the context of the request or timer that
        #  started it, whose connection would count it: ``runtime.abandoned_work``)
        task = self._loop.create_task(
            self._run_batch(lane, rows, steps), context=contextvars.Context()
        )
        task.add_done_callback(_forget)

    def _wake_at(self, lane: SeqLane, due: int, now: int) -> None:
        if id(lane) in self._wakeups:
            return

        def wake() -> None:
            self._wakeups.pop(id(lane), None)
            self._pump(lane)

        self._wakeups[id(lane)] = self._loop.call_later((due - now) / 1e9, wake)

    # ---- one batch ---------------------------------------------------------------

    async def _run_batch(
        self, lane: SeqLane, rows: list[Seq | None], steps: list[SequenceStep | None]
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
        self, worker: WorkerLink, rows: list[Seq | None], steps: list[SequenceStep | None]
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
        sendable(model, [held])
        key = model.key
        light = self.dispatch.light()
        answer = await infer_on(
            worker,
            lambda rid: Infer(rid, key, descs, computed, [], [], sequence, light=light),
            held.release,
            self.dispatch.outputs,
        )
        done = self.dispatch.answered(worker, answer)
        results = self.dispatch.results(worker, model, done, [1] * len(rows))
        _record(filler.stats, [s for s in steps if s is not None], done)
        for step, result in zip(steps, results, strict=True):
            if step is not None and step.outputs and step.outputs != computed:
                by_name = {tensor.name: tensor for tensor in result.outputs}
                result.outputs = [by_name[name] for name in step.outputs]
        return results

    def _controls(self, row: Seq | None, step: SequenceStep | None) -> list[Placement]:
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


# ---- helpers ------------------------------------------------------------------------


def _outputs(model: ModelVersion, steps: list[SequenceStep]) -> list[str]:
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


def _record(stats: ModelStats, steps: list[SequenceStep], done: InferDone) -> None:
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


def _forget(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a sequence batch failed unexpectedly", exc_info=task.exception())
