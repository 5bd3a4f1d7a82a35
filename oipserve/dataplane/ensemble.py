"""Running an ensemble: the front orchestrates, the tensors stay in the workers.

``EnsembleRunner.run`` is the strategy of every ensemble version (``DataPlane._choose``).
A request's steps run as soon as their inputs exist (independent branches at once), each
as a request of its composing model:

- a composing model that runs requests alone (no ``dynamic_batching``, no response cache)
  goes through ``strategies.Unbatched`` (its checks, its statistics, its worker choice)
  with a dispatch that keeps where the outputs lie (``ensemble_run.StepDispatch``);
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

The code: ``EnsembleRunner`` here (the request checked against the ensemble, the chains
planned for the versions its steps resolve to, the statistics); ``ensemble_run``, one
request through its steps; ``ensemble_tensors``, where its tensors lie and who holds them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic_ns

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.ensemble_chains import Chain, ChainPlan, plan_chains
from oipserve.dataplane.ensemble_run import EnsembleRun
from oipserve.dataplane.ensemble_tensors import EnsembleTensor, Held, release_all
from oipserve.dataplane.intake import Intake
from oipserve.dataplane.strategies import Strategy
from oipserve.errors import InvalidInput, RequestRefusal
from oipserve.models.ensemble import EnsembleVersion
from oipserve.models.registry import ModelVersion
from oipserve.request.checks import check_inputs, rows_of
from oipserve.request.classification import check_classification
from oipserve.request.inference import Inference, InferResult
from oipserve.request.region_use import RegionUse
from oipserve.telemetry.stats import FailureReason, ModelStats

__all__ = ["EnsembleRunner", "Held"]

_NO_CHAINS: dict[int, Chain] = {}


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
        client = Held("", memoryview(b""), lambda: release_all(inference.owned))
        try:
            model.check_serving()
            tensors = _client_tensors(model, inference, client)
            wanted = _wanted_outputs(model, inference.output_names)
            check_classification(model, inference.classification, inference.into_regions)
            chains = self._chains(model) if model.chain_runs else _NO_CHAINS
        except BaseException:
            client.release()
            stats.request_failed(FailureReason.OTHER, monotonic_ns() - start)
            raise
        run = EnsembleRun(self, model, inference, tensors, client, chains)
        try:
            outputs = await run.execute(wanted)
            _check_regions_fit(outputs, inference.into_regions)
        except BaseException:
            stats.request_failed(FailureReason.OTHER, monotonic_ns() - start)
            raise
        batch = rows_of(model, inference.inputs[0].shape if inference.inputs else ())
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


def _client_tensors(
    model: EnsembleVersion, inference: Inference, client: Held
) -> dict[str, EnsembleTensor]:
    """The request's inputs as ensemble tensors, checked against the ensemble's inputs and
    outputs as any model's request is (``check_inputs``); their data is checked by the
    steps that read them."""
    try:
        check_inputs(model, inference.inputs, inference.output_names, images=False)
    except RequestRefusal as exc:
        raise exc.of_request(inference.request_id) from None
    return {
        tensor.name: EnsembleTensor(
            tensor.name, tensor.datatype, tensor.shape, client, client=tensor
        )
        for tensor in inference.inputs
    }


def _wanted_outputs(model: EnsembleVersion, names: list[str]) -> list[str]:
    """The outputs the request asks for (all when it names none; ``check_inputs`` checked
    them)."""
    return list(names) if names else [t.name for t in model.outputs]


def _check_regions_fit(result: InferResult, into: dict[str, RegionUse]) -> None:
    """InvalidInput (the result released) when an output asked for in a client's region is
    larger than the region gives: known only now, as an ensemble's output shapes are its
    steps'. Checked before the request counts as a success (the data plane writes the
    outputs there after the run, ``plane._deliver``)."""
    try:
        for tensor in result.outputs:
            use = into.get(tensor.name)
            if use is not None:
                use.check_room(f"output '{tensor.name}'", len(tensor.data))
    except InvalidInput:
        result.release()
        raise
