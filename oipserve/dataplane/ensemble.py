"""Running an ensemble: the front orchestrates, the tensors stay in the workers.

``EnsembleRunner.run`` is the strategy of every ensemble version (``DataPlane._choose``).
A request's steps run as soon as their inputs exist (independent branches at once), each
as a request of its composing model:

- a composing model that runs requests alone (no ``dynamic_batching``, no response cache)
  goes through ``strategies.Unbatched`` (its checks, its statistics, its worker choice)
  with a dispatch that keeps where the outputs lie (``_StepDispatch``);
- one with ``dynamic_batching`` (or a response cache) goes through its own strategy in the
  data plane, so that its batcher joins steps of many ensemble requests with its other
  requests into one batch.

Intermediate tensors are never read into the front: a step's output stays in the output
segment of the worker that made it, and the next step's input descriptor names that
segment, offset and size (``InputTensor.located``); the worker that runs the next step maps
it (``workers.peer_segments``) and feeds ONNX Runtime a view of it. When both steps run
on one worker, that is the same memory. A segment goes back to its worker once every step
reading it is done and, for the ensemble's outputs, once the response is sent. The one
exception is a batched composing model's output feeding a later step: the batcher's
output is cut per request in the front, and it is copied once into an input segment (a
copy between shared-memory segments, docs/ensembles.md has the counts).

``max_inflight_requests`` (Triton 2.63): a step of a request holds a slot of that step from
its start until every step reading its outputs is done; past the limit, requests wait
for a slot before the step, so a slow later step holds back the earlier ones.

Consecutive steps that only ever run one right after the other, of models that run requests
alone, go as ONE request of one worker that runs them all (``ensemble_chains``,
``workers.chains``): the tensors between them stay in that worker's memory, not even in a
segment.

Statistics: each step counts in its composing model's statistics like any request; the
ensemble counts each request once, a failure with reason OTHER (as Triton's ensembles).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from time import monotonic_ns
from typing import TYPE_CHECKING, cast

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.ensemble_chains import Chain, ChainPlan, plan_chains, run_chain
from oipserve.dataplane.intake import Intake
from oipserve.dataplane.strategies import Strategy, Unbatched
from oipserve.errors import InferenceFailed, InvalidInput, Unavailable
from oipserve.models.ensemble import EnsembleVersion
from oipserve.models.registry import ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request.checks import check_datatype, check_output_names, input_spec
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import Inference, InferResult, InputTensor, OutputTensor
from oipserve.telemetry.stats import FailureReason, ModelStats
from oipserve.wire.messages import InferDone
from oipserve.wire.shm import Lease

if TYPE_CHECKING:
    from oipserve.wire.shm import SegmentCache

__all__ = ["EnsembleRunner", "Held"]

_NO_CHAINS: dict[int, Chain] = {}


class Held:
    """What a tensor of an ensemble request lives in, released once its last user is done.

    A step output's segment (``name`` and the front's mapping ``buf``: what
    ``InputTensor.located`` wants), or the client's inputs. Each user takes a ``part``
    (the same object) and releases it once.
    """

    __slots__ = ("name", "buf", "worker", "_count", "_release")

    def __init__(
        self,
        name: str,
        buf: memoryview,
        release: Callable[[], None],
        worker: WorkerLink | None = None,
    ) -> None:
        self.name = name
        self.buf = buf
        #: The worker whose output segment this is (None: the client's inputs, or a copy).
        self.worker = worker
        self._count = 1  # the request's own, released when it ends
        self._release: Callable[[], None] | None = release

    def part(self) -> Held:
        self._count += 1
        return self

    def release(self) -> None:
        self._count -= 1
        if self._count == 0 and self._release is not None:
            release, self._release = self._release, None
            release()


class _StepDispatch(Dispatch):
    """``Dispatch`` for one step: prefers the worker of the request's earlier steps when it
    is idle, and keeps the reply (where the outputs lie)."""

    __slots__ = ("pin", "done")

    def __init__(self, outputs: SegmentCache, max_queue: int, pin: list[WorkerLink]) -> None:
        super().__init__(outputs, max_queue)
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
    ) -> InferResult:
        self.done = (worker, done)
        return super().result(worker, model, done, into)


class _Tensor:
    """One ensemble tensor of a request, where it lies."""

    __slots__ = ("name", "datatype", "shape", "client", "data", "offset", "held")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: list[int],
        held: Held,
        client: InputTensor | None = None,
        data: memoryview | None = None,
        offset: int = -1,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.held = held
        #: The client's input, as the protocol adapter parsed it.
        self.client = client
        #: A step's output as the front maps it, and its offset in ``held``'s segment
        #: (-1: not in a worker's segment, a batched step's share: copied when read).
        self.data = data
        self.offset = offset

    def as_input(self, name: str) -> InputTensor:
        """This tensor as input ``name`` of a step; its data where it lies."""
        client = self.client
        if client is not None:
            return InputTensor(
                name,
                client.datatype,
                client.shape,
                values=client.values,
                raw=client.raw,
                located=client.located,
                region=client.region,
            )
        data = self.data
        if self.offset >= 0 and data is not None:
            # NOTE: a Held is what placement reads of a Lease (``name``, ``buf``) and what a
            #   strategy does with what it owns (``release``): typed as one on purpose.
            held = cast(Lease, self.held)
            located = (held, self.offset, len(data))
            return InputTensor(name, self.datatype, self.shape, located=located)
        return InputTensor(name, self.datatype, self.shape, raw=data)


class EnsembleRunner:
    """The strategy of ensemble versions (one for the data plane)."""

    __slots__ = ("intake", "dispatch", "strategy_of", "stats_of", "unbatched", "loop")

    def __init__(
        self,
        intake: Intake,
        dispatch: Dispatch,
        strategy_of: Callable[[ModelVersion], Strategy],
        stats_of: Callable[[ModelVersion], ModelStats],
        unbatched: Strategy,
    ) -> None:
        self.intake = intake
        self.dispatch = dispatch
        #: The data plane's strategy of a composing model (``DataPlane._strategy``).
        self.strategy_of = strategy_of
        self.stats_of = stats_of
        #: The data plane's strategy of versions that run requests alone: a step of such
        #: a version runs through ``Unbatched`` here, which keeps where its outputs lie.
        self.unbatched = unbatched
        self.loop = asyncio.get_running_loop()

    async def run(self, inference: Inference, stats: ModelStats, start: int) -> InferResult:
        model = inference.model
        if not isinstance(model, EnsembleVersion):  # _choose gives this strategy to them only
            raise TypeError(f"model '{model.name}' is not an ensemble")
        client = Held("", memoryview(b""), lambda: _release(inference.owned))
        try:
            model.check_serving()
            tensors = _client_tensors(model, inference, client)
            wanted = _wanted_outputs(model, inference.output_names)
            chains = self._chains(model) if model.chain_runs else _NO_CHAINS
        except BaseException:
            client.release()
            stats.request_failed(FailureReason.OTHER, monotonic_ns() - start)
            raise
        run = _Run(self, model, inference, tensors, client, chains)
        try:
            outputs = await run.execute(wanted)
        except BaseException:
            stats.request_failed(FailureReason.OTHER, monotonic_ns() - start)
            raise
        batch = _batch_size(model, inference)
        stats.executed(batch, 0, 0, 0)  # NOTE: its steps' compute counts in their models
        stats.request_succeeded(batch, monotonic_ns() - start, 0, 0, 0, 0)
        return outputs

    def _chains(self, model: EnsembleVersion) -> dict[int, Chain]:
        """The ensemble's chains for the versions its steps resolve to now; planned again
        only when one of those changed (a reload, a new version)."""
        composing = tuple(model.step_model(i) for i in range(len(model.plan.steps)))
        plan = model.chain_plan
        if not isinstance(plan, ChainPlan) or plan.composing != composing:
            plan = plan_chains(
                model.plan,
                model.chain_runs,
                composing,
                frozenset(model.output_map),
                lambda version: self.strategy_of(version) == self.unbatched,
            )
            model.chain_plan = plan
        return plan.heads


class _Run:
    """One ensemble request on its way through the steps."""

    def __init__(
        self,
        runner: EnsembleRunner,
        model: EnsembleVersion,
        inference: Inference,
        tensors: dict[str, _Tensor],
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
        self.missing = [
            sum(1 for t in step.input_map.values() if t not in tensors) for step in steps
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
        )
        # NOTE: the request's sequence (read when a step is a sequence model) goes to every
        #   step, as Triton passes the correlation id; other models' strategies ignore it.
        request.sequence = self.inference.sequence
        dispatch: _StepDispatch | None = None
        strategy = runner.strategy_of(composing)
        if strategy == runner.unbatched:
            dispatch = _StepDispatch(runner.dispatch.outputs, runner.dispatch.max_queue, self.pin)
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
            worker = self.tensors[name].held.worker
            if worker is not None and not worker.alive:
                raise Unavailable(
                    f"ensemble '{self.model.name}': the worker that made input '{model_input}' "
                    f"of step {index} (model '{step.model_name}') stopped; retry",
                    retry_after=1,
                ) from None

    async def _chain(self, chain: Chain) -> None:
        """The steps of ``chain`` as one request of a worker that holds all their models
        (``workers.chains``); one by one as usual when no worker holds them all."""
        worker = self._chain_worker(chain)
        if worker is None:
            for index in chain.steps:
                await self._step(index)
            return
        head = chain.steps[0]
        inputs, owned = self._step_inputs(head)
        first = chain.models[0]
        request = Inference(first, inputs, chain.outputs, owned, priority=self.inference.priority)
        for composing in chain.models:
            composing.in_flight += 1
        try:
            runner = self.runner
            done = await run_chain(
                runner.intake, runner.stats_of, request, chain, worker, self.deadline
            )
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
            self.tensors[desc.name] = _Tensor(
                desc.name, desc.datatype, desc.shape, held, data=data, offset=desc.offset
            )

    def _step_inputs(self, index: int) -> tuple[list[InputTensor], list[Lease | RegionUse]]:
        """Step ``index``'s inputs, where they lie, each with a hold on what it lies in."""
        inputs = []
        owned: list[Lease | RegionUse] = []
        for model_input, name in self.model.plan.steps[index].input_map.items():
            tensor = self.tensors[name]
            inputs.append(tensor.as_input(model_input))
            owned.append(cast(Lease, tensor.held.part()))  # (see _Tensor.as_input)
        return inputs, owned

    def _keep(self, index: int, result: InferResult, dispatch: _StepDispatch | None) -> None:
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
            self.tensors[name] = _Tensor(
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
        return InferResult(self.model, outputs, lambda: _release(parts))

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


def _release(owned: list[Lease | RegionUse] | list[Held]) -> None:
    for held in owned:
        held.release()


def _client_tensors(
    model: EnsembleVersion, inference: Inference, client: Held
) -> dict[str, _Tensor]:
    """The request's inputs as ensemble tensors, checked against the ensemble's inputs
    (names, datatypes, shapes; their data is checked by the steps that read them)."""
    tensors: dict[str, _Tensor] = {}
    seen: set[str] = set()
    for tensor in inference.inputs:
        spec = input_spec(model, tensor, seen)
        check_datatype(model, tensor, spec)
        _check_shape(model, tensor.name, tensor.shape, spec.shape)
        tensors[tensor.name] = _Tensor(
            tensor.name, tensor.datatype, tensor.shape, client, client=tensor
        )
    missing = [name for name in model.input_map if name not in tensors]
    if missing:
        raise InvalidInput(
            f"model '{model.name}' needs input(s) {', '.join(repr(m) for m in missing)}, "
            "which the request does not give"
        )
    return tensors


def _check_shape(model: ModelVersion, name: str, shape: list[int], dims: tuple[int, ...]) -> None:
    if len(shape) != len(dims) or any(d != -1 and d != s for s, d in zip(shape, dims, strict=True)):
        raise InvalidInput(
            f"unexpected shape for input '{name}' for model '{model.name}'. Expected "
            f"{list(dims)}, got {shape}"
        )
    if model.max_batch_size > 0 and shape and shape[0] > model.max_batch_size:
        raise InvalidInput(
            f"inference request batch-size must be <= {model.max_batch_size} for '{model.name}'"
        )
    if any(s < 0 for s in shape):
        raise InvalidInput(f"input '{name}': shape {shape} has a negative size")


def _wanted_outputs(model: EnsembleVersion, names: list[str]) -> list[str]:
    """The outputs the request asks for (all when it names none), each checked once."""
    if not names:
        return [t.name for t in model.outputs]
    check_output_names(model, names)
    return list(names)


def _batch_size(model: ModelVersion, inference: Inference) -> int:
    shape = inference.inputs[0].shape if inference.inputs else []
    return shape[0] if model.max_batch_size > 0 and shape else 1
