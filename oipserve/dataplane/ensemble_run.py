"""One ensemble request on its way through its steps (``ensemble.EnsembleRunner``'s run).

``EnsembleRun.execute`` runs each step, or chain of steps (``ensemble_chains``), as soon as
its inputs exist, independent branches at once; a step as a request of its composing model
through that model's strategy (through ``Unbatched`` with a ``StepDispatch`` that prefers
the request's last worker and keeps where the outputs lie, for a model that runs requests
alone); each step's outputs kept as ensemble tensors where they lie
(``ensemble_tensors``); the slots of ``max_inflight_requests`` taken before a step and let
go once every reader of its outputs is done; the ensemble's outputs as views of the steps'
segments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from time import monotonic_ns
from typing import Protocol, cast

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.ensemble_chains import Chain, run_chain
from oipserve.dataplane.ensemble_tensors import EnsembleTensor, Held, release_all
from oipserve.dataplane.intake import Intake
from oipserve.dataplane.strategies import Strategy, Unbatched, waited_for_share
from oipserve.errors import InferenceFailed, Unavailable
from oipserve.models.ensemble import EnsembleVersion
from oipserve.models.registry import ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import Inference, InferResult, InputTensor, OutputTensor
from oipserve.runtime.worker_share import WORKER_SHARE, WorkerShare
from oipserve.telemetry.stats import ModelStats, refusal_reason
from oipserve.wire.messages import InferDone
from oipserve.wire.shm import Lease

__all__ = ["EnsembleRun", "Runner", "StepDispatch"]


class Runner(Protocol):
    """What a run uses of the data plane's ``ensemble.EnsembleRunner`` (which imports
    this module): its intake and dispatch, the strategy and statistics of each model."""

    intake: Intake
    dispatch: Dispatch
    strategy_of: Callable[[ModelVersion], Strategy]
    stats_of: Callable[[ModelVersion], ModelStats]
    unbatched: Strategy
    loop: asyncio.AbstractEventLoop


class StepDispatch(Dispatch):
    """``Dispatch`` for one step: prefers the worker of the request's earlier steps when it
    is idle, and keeps the reply (where the outputs lie)."""

    __slots__ = ("pin", "done")

    def __init__(self, parent: Dispatch, pin: list[WorkerLink]) -> None:
        super().__init__(parent.outputs, parent.max_queue)
        # NOTE: the front's, as every Infer it sends (``Dispatch.light``, ``.answered``).
        self.busy_poll = parent.busy_poll
        self.affinity = parent.affinity
        # NOTE: a step waiting for its connection's place is never refused for the waiting
        #   of others: its request's own steps may be most of them, and a request must
        #   not be refused because of itself (its place, and the ensemble's, bound them).
        self.share_bounded = False
        #: The worker of this request's last step (shared by its steps; empty at first).
        self.pin = pin
        self.done: tuple[WorkerLink, InferDone] | None = None

    def pick(self, model: ModelVersion) -> WorkerLink:
        best = model.pick(self.max_queue)
        pin = self.pin
        if pin:
            pinned = pin[0]
            # NOTE: only an idle one: a busy one would run parallel branches one by one.
            if pinned.alive and pinned.in_flight == 0 and model.key in pinned.models:
                return pinned
            pin[0] = best
        else:
            pin.append(best)
        return best

    def result(
        self,
        worker: WorkerLink,
        model: ModelVersion,
        done: InferDone,
        into: Mapping[str, RegionUse],
        rows: int = 1,
    ) -> InferResult:
        self.done = (worker, done)
        return super().result(worker, model, done, into, rows)


class EnsembleRun:
    """One ensemble request on its way through the steps."""

    def __init__(
        self,
        runner: Runner,
        model: EnsembleVersion,
        inference: Inference,
        tensors: dict[str, EnsembleTensor],
        client: Held,
        chains: dict[int, Chain],
    ) -> None:
        self.runner = runner
        self.model = model
        self.inference = inference
        self.tensors = tensors
        #: What this request holds: the client's inputs and each step's outputs.
        self.held = [client]
        self.pin: list[WorkerLink] = []
        self.deadline = runner.intake.deadline(inference)
        steps = model.plan.steps
        #: Per step: ensemble tensors still missing; readers of its outputs still running.
        #: An ensemble input the request left out (an optional one: ``check_inputs``) is
        #: never missing: it is absent, and the steps reading it run without it (Triton's).
        own = model.input_map
        self.missing = [
            sum(1 for t in step.input_map.values() if t not in tensors and t not in own)
            for step in steps
        ]
        self.readers = [len(c) for c in model.plan.consumers]
        #: Per step: whether it holds a slot of ``max_inflight_requests``.
        self.slotted = [False] * len(steps)
        #: A chain's first step -> the chain (``ensemble_chains``).
        self.chains = chains

    async def execute(self, wanted: list[str]) -> InferResult:
        """Every step, in dependency order and in parallel where possible; the outputs.

        A step that is the only one ready while none runs is awaited here (a chain's
        steps: no task, no ``asyncio.wait``); more at once run as tasks.
        """
        running: dict[asyncio.Task[None], int] = {}
        ready = [index for index, count in enumerate(self.missing) if count == 0]
        try:
            while ready or running:
                if len(ready) == 1 and not running:
                    index = ready.pop()
                    await self._unit(index)
                    ready = self._unit_finished(index)
                    continue
                for index in ready:
                    running[asyncio.ensure_future(self._unit(index))] = index
                ready = []
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = running.pop(task)
                    task.result()  # a step's failure fails the request
                    ready.extend(self._unit_finished(index))
            return self._result(wanted)
        except BaseException:
            for task in running:
                task.cancel()
            if running:
                await asyncio.wait(running)
            for task in running:  # NOTE: their errors are this one's: retrieved, not logged
                if not task.cancelled():
                    task.exception()
            raise
        finally:
            self._end()

    def _unit(self, index: int) -> Awaitable[None]:
        """Step ``index``, or the chain it starts (``ensemble_chains``)."""
        chain = self.chains.get(index)
        return self._step(index) if chain is None else self._chain(chain)

    def _unit_finished(self, index: int) -> list[int]:
        """``_finished`` of step ``index`` or of every step of the chain it starts."""
        chain = self.chains.get(index)
        if chain is None:
            return self._finished(index)
        ready: list[int] = []
        for step in chain.steps:
            ready.extend(i for i in self._finished(step) if i not in chain.members)
        return ready

    def _finished(self, index: int) -> list[int]:
        """Steps whose last missing input step ``index`` wrote; slots it let go."""
        plan = self.model.plan
        written = set(plan.steps[index].output_map.values())
        ready = []
        for consumer in plan.consumers[index]:
            reads = plan.steps[consumer].input_map.values()
            self.missing[consumer] -= sum(1 for t in reads if t in written)
            if self.missing[consumer] == 0:
                ready.append(consumer)
        for producer, readers in enumerate(plan.consumers):
            if index in readers:
                self.readers[producer] -= 1
                if self.readers[producer] == 0:
                    self._free_slot(producer)
        return ready

    async def _step(self, index: int) -> None:
        """Run step ``index`` as a request of its model; its outputs become tensors."""
        runner, model = self.runner, self.model
        step = model.plan.steps[index]
        slots = model.step_slots
        if slots is not None:
            await slots[index].acquire()
            self.slotted[index] = True
        composing = model.step_model(index)
        inputs, owned = self._step_inputs(index)
        remaining = max(self.deadline - runner.loop.time(), 1e-6)
        request = Inference(
            composing,
            inputs,
            list(step.output_map),
            owned,
            priority=self.inference.priority,
            timeout_us=max(int(remaining * 1e6), 1),
            request_id=self.inference.request_id,  # (as Triton's steps: their request's id)
        )
        # NOTE: the request's sequence (read when a step is a sequence model) goes to every
        #   step, as Triton passes the correlation id; other models' strategies ignore it.
        request.sequence = self.inference.sequence
        request.parked = self.inference.parked  # (a sequence step waiting for a slot)
        dispatch: StepDispatch | None = None
        strategy = runner.strategy_of(composing)
        if strategy == runner.unbatched:
            dispatch = StepDispatch(runner.dispatch, self.pin)
            strategy = Unbatched(runner.intake, dispatch).run
        composing.in_flight += 1
        try:
            result = await strategy(request, runner.stats_of(composing), monotonic_ns())
        except InferenceFailed:
            self._check_inputs_alive(index)
            raise
        finally:
            composing.in_flight -= 1
        self._keep(index, result, dispatch)

    def _check_inputs_alive(self, index: int) -> None:
        """After step ``index`` failed: Unavailable when the worker that wrote one of its
        inputs died (its segment went with it: the step's worker could not map it).
        Retryable, not the model's fault."""
        step = self.model.plan.steps[index]
        for model_input, name in step.input_map.items():
            tensor = self.tensors.get(name)
            worker = tensor.held.worker if tensor is not None else None
            if worker is not None and not worker.alive:
                raise Unavailable(
                    f"ensemble '{self.model.name}': the worker that made input '{model_input}' "
                    f"of step {index} (model '{step.model_name}') stopped; retry",
                    retry_after=1,
                ) from None

    async def _chain(self, chain: Chain) -> None:
        """The steps of ``chain`` as one request of a worker that holds all their models
        (``workers.chains``); one by one as usual when no worker holds them all. A place
        in its connection's share of the workers' queues first, as a step alone takes."""
        runner = self.runner
        share = WORKER_SHARE.get()
        waited = 0
        limit = runner.dispatch.max_share
        held: WorkerShare | None = None
        began = monotonic_ns()
        try:
            if share is not None and not share.take(limit):
                stats = runner.stats_of(chain.models[0])
                waited = await waited_for_share(share, self.deadline, stats, limit, False)
            held = share
            worker = self._chain_worker(chain)
        except BaseException as exc:
            # (counted against its first model, as its failures after are, and a step's
            #  alone: a chain that failed waiting for its place went uncounted, fuzzing)
            if held is not None:
                held.back()
            runner.stats_of(chain.models[0]).request_failed(
                refusal_reason(exc), monotonic_ns() - began
            )
            raise
        if worker is None:
            if share is not None:
                share.back()
            for index in chain.steps:
                await self._step(index)
            return
        head = chain.steps[0]
        inputs, owned = self._step_inputs(head)
        first = chain.models[0]
        request = Inference(
            first,
            inputs,
            chain.outputs,
            owned,
            priority=self.inference.priority,
            request_id=self.inference.request_id,
        )
        for composing in chain.models:
            composing.in_flight += 1
        try:
            done = await run_chain(
                runner.intake, runner.stats_of, request, chain, worker, self.deadline, share,
                waited,
            )  # fmt: skip
        except InferenceFailed:
            self._check_inputs_alive(head)
            raise
        finally:
            for composing in chain.models:
                composing.in_flight -= 1
        self._keep_chain(worker, done)

    def _chain_worker(self, chain: Chain) -> WorkerLink | None:
        """The worker for ``chain``: this request's last one when idle and holding every
        model of it, else the least busy one that does (503 when the first step's model
        is overloaded); None when none holds them all."""
        keys = chain.keys
        pin = self.pin
        if pin:
            pinned = pin[0]
            if pinned.alive and pinned.in_flight == 0 and all(k in pinned.models for k in keys):
                return pinned
        best = chain.models[0].pick(self.runner.dispatch.max_queue)
        if not all(k in best.models for k in keys):
            found = [w for w in chain.models[0].instances() if all(k in w.models for k in keys)]
            if not found:
                return None
            best = min(found, key=_load)
        if pin:
            pin[0] = best
        else:
            pin.append(best)
        return best

    def _keep_chain(self, worker: WorkerLink, done: InferDone) -> None:
        """A chain's tensors the front needs, where the worker wrote them."""
        segment = done.segment
        release = worker.release_outputs
        if not segment:
            return
        buf = memoryview(self.runner.dispatch.outputs.get(segment).buf.obj)
        held = Held(segment, buf, lambda: release(segment), worker)
        self.held.append(held)
        for desc in done.outputs:
            data = buf[desc.offset : desc.offset + desc.nbytes]
            self.tensors[desc.name] = EnsembleTensor(
                desc.name, desc.datatype, desc.shape, held, data=data, offset=desc.offset
            )

    def _step_inputs(self, index: int) -> tuple[list[InputTensor], list[Lease | RegionUse]]:
        """Step ``index``'s inputs, where they lie, each with a hold on what it lies in;
        none for an optional ensemble input the request left out (the step's model then
        refuses it in its words when it requires that input, as Triton's step does)."""
        inputs = []
        owned: list[Lease | RegionUse] = []
        for model_input, name in self.model.plan.steps[index].input_map.items():
            tensor = self.tensors.get(name)
            if tensor is None:
                continue
            inputs.append(tensor.as_input(model_input))
            owned.append(cast(Lease, tensor.held.part()))  # (see EnsembleTensor.as_input)
        return inputs, owned

    def _keep(self, index: int, result: InferResult, dispatch: StepDispatch | None) -> None:
        """A step's outputs as ensemble tensors, where they lie."""
        step = self.model.plan.steps[index]
        located = dispatch.done if dispatch is not None else None
        segment = located[1].segment if located is not None else ""
        buf = memoryview(b"")
        if segment:
            # NOTE: a view of its own over the mapping: the front's cache of segments lets
            #   go of its view when that worker dies, this one stays valid meanwhile.
            buf = memoryview(self.runner.dispatch.outputs.get(segment).buf.obj)
        worker = located[0] if located is not None else None
        held = Held(segment, buf, result.release, worker)
        self.held.append(held)
        offsets = {d.name: d.offset for d in located[1].outputs} if located else {}
        for output in result.outputs:
            name = step.output_map.get(output.name)
            if name is None:
                continue
            offset = offsets.get(output.name, -1) if segment else -1
            self.tensors[name] = EnsembleTensor(
                name, output.datatype, output.shape, held, data=output.data, offset=offset
            )

    def _result(self, wanted: list[str]) -> InferResult:
        """The ensemble's outputs: views of the steps' segments, held until released."""
        outputs = []
        parts: list[Held] = []
        for name in wanted:
            tensor = self.tensors[name]
            data = tensor.data if tensor.data is not None else memoryview(b"")
            outputs.append(OutputTensor(name, tensor.datatype, tensor.shape, data))
            parts.append(tensor.held.part())
        return InferResult(self.model, outputs, lambda: release_all(parts))

    def _free_slot(self, index: int) -> None:
        slots = self.model.step_slots
        if slots is not None and self.slotted[index]:
            self.slotted[index] = False
            slots[index].release()

    def _end(self) -> None:
        """The request's own hold on everything, and its slots, let go."""
        for index in range(len(self.slotted)):
            self._free_slot(index)
        for held in self.held:
            held.release()


def _load(worker: WorkerLink) -> int:
    return worker.in_flight + worker.away
