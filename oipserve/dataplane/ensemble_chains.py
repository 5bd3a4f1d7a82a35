"""Which steps of an ensemble run as one chain in one worker (``workers.chains``).

A chain is a run of steps ``s0 -> s1 -> ... -> sk`` where each next step is the only
reader of its predecessor's outputs and reads nothing but outputs of earlier steps of
the chain: it could only ever run right after them, so running it in the same worker,
fed the arrays they made, loses no parallelism (a diamond's branches are never chained:
the step they start from has two readers) and saves a round trip through the front and
a write into and a read from shared memory per intermediate.

``EnsembleVersion.chain_runs`` is the shape of the ensemble alone (made at load,
``oipserve.models.ensemble.chain_runs``).
``plan_chains`` keeps the runs whose every step's model runs requests alone (no
``dynamic_batching``, ``sequence_batching``, response cache, ragged or padded inputs:
``Unbatched``'s strategy) and has no reshape (an array is fed to the next step as its
model made it), for one set of composing versions; ``EnsembleVersion.chain_plan`` keeps it
while those versions stay the ones the steps resolve to. An ensemble with
``max_inflight_requests`` is never chained (its per-step slots are the front's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import monotonic_ns

from oipserve.dataplane.dispatch import Dispatch, infer_on
from oipserve.dataplane.intake import Intake, has_deferred
from oipserve.dataplane.strategies import refused, sending
from oipserve.errors import WorkerProtocolError, from_kind
from oipserve.models.config.ensemble import EnsembleConfig
from oipserve.models.registry import ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request.inference import Inference
from oipserve.request.placement import place
from oipserve.runtime.worker_share import WorkerShare
from oipserve.telemetry.stats import ModelStats, failure_reason
from oipserve.wire.messages import ChainStep, Failed, Infer, InferDone, StepTimes, TensorDesc
from oipserve.wire.shm import Lease

__all__ = ["Chain", "ChainPlan", "plan_chains", "run_chain"]


class Chain:
    """Steps run as one request of the first step's worker."""

    __slots__ = ("steps", "members", "models", "keys", "messages", "outputs")

    def __init__(
        self, steps: tuple[int, ...], models: tuple[ModelVersion, ...], messages: list[ChainStep]
    ) -> None:
        #: The step indexes, in order, and the same as a set.
        self.steps = steps
        self.members = frozenset(steps)
        #: Each step's composing version (the ones this plan was made for).
        self.models = models
        self.keys = tuple(model.key for model in models)
        #: What the worker is sent (``Infer.chain``): every step, the first one's too.
        self.messages = messages
        #: The first step's outputs (the Infer's ``outputs``).
        self.outputs = list(messages[0].outputs)


class ChainPlan:
    """An ensemble version's chains, for one set of composing versions."""

    __slots__ = ("composing", "heads")

    def __init__(self, composing: tuple[ModelVersion, ...], heads: dict[int, Chain]) -> None:
        #: Per step, the version it resolved to when this plan was made.
        self.composing = composing
        #: A chain's first step -> the chain (steps of no chain run one Infer each).
        self.heads = heads


def plan_chains(
    plan: EnsembleConfig,
    runs: Sequence[tuple[int, ...]],
    composing: tuple[ModelVersion, ...],
    ensemble_outputs: frozenset[str],
    alone: Callable[[ModelVersion], bool],
) -> ChainPlan:
    """The chains of ``runs`` whose steps' versions (``composing``, per step) run
    requests ``alone`` and reshape nothing; a run with a step that does not qualify
    is cut around it (the steps before it and after it can still be chains)."""
    heads: dict[int, Chain] = {}
    for run in runs:
        part: list[int] = []
        for index in (*run, -1):
            if index >= 0 and _qualifies(composing[index], alone):
                part.append(index)
                continue
            if len(part) > 1:
                heads[part[0]] = _chain(plan, tuple(part), composing, ensemble_outputs)
            part = []
    return ChainPlan(composing, heads)


def _qualifies(model: ModelVersion, alone: Callable[[ModelVersion], bool]) -> bool:
    if not alone(model):
        return False
    specs = (*model.inputs, *model.outputs)
    return all(spec.model_shape is None for spec in specs)


def _chain(
    plan: EnsembleConfig,
    steps: tuple[int, ...],
    composing: tuple[ModelVersion, ...],
    ensemble_outputs: frozenset[str],
) -> Chain:
    """One chain: what each step reads and makes, and which tensors go to the front
    (the ensemble's outputs, and what a step outside the chain reads)."""
    members = set(steps)
    read_outside = {
        tensor
        for i, step in enumerate(plan.steps)
        if i not in members
        for tensor in step.input_map.values()
    }
    messages = []
    for position, index in enumerate(steps):
        step = plan.steps[index]
        written = [
            tensor
            for tensor in step.output_map.values()
            if tensor in ensemble_outputs or tensor in read_outside
        ]
        inputs = {} if position == 0 else dict(step.input_map)
        messages.append(ChainStep(composing[index].key, inputs, dict(step.output_map), written))
    return Chain(steps, tuple(composing[i] for i in steps), messages)


async def run_chain(
    intake: Intake,
    stats_of: Callable[[ModelVersion], ModelStats],
    request: Inference,
    chain: Chain,
    worker: WorkerLink,
    deadline: float,
    share: WorkerShare | None = None,
    waited: int = 0,
) -> InferDone:
    """``request`` (the chain's first step) checked and placed as ``Unbatched`` does, sent
    with the chain to ``worker``; each step counted in its model's statistics (a failed
    one with its reason, and those before it as successes). ``share``: the place the
    chain holds in its connection's share of the workers' queues (given back when the
    worker answers, or here if it is not sent); ``waited``: when it began to wait for it
    (``monotonic_ns``; 0: it did not wait)."""
    start = waited or monotonic_ns()
    first = stats_of(request.model)
    owned = request.owned
    lease: Lease | None = None
    try:
        placements = intake.check(request)
        if has_deferred(placements):
            placements = await intake.decode_in_worker(request.model, placements, owned, deadline)
        inputs, lease = await place(placements, intake.inputs)
    except BaseException as exc:
        if share is not None:
            share.back()
        refused(exc, owned, lease, first, start)
        raise
    sent = sending(owned, lease, first)
    if waited:
        sent = waited
    try:
        reply = await _send(intake.dispatch, worker, request, chain, inputs, deadline, share)
    except BaseException as exc:
        first.request_failed(failure_reason(exc), monotonic_ns() - start)
        raise
    finally:
        first.pending -= 1
    _count(chain, stats_of, reply.steps, start, sent)
    if isinstance(reply, InferDone):
        for name in reply.dropped:
            intake.dispatch.outputs.forget(name)
        return reply
    failed = from_kind(reply.kind, reply.message)
    stats_of(chain.models[len(reply.steps)]).request_failed(
        failure_reason(failed), monotonic_ns() - start
    )
    raise failed


async def _send(
    dispatch: Dispatch,
    worker: WorkerLink,
    request: Inference,
    chain: Chain,
    inputs: list[TensorDesc],
    deadline: float,
    share: WorkerShare | None = None,
) -> InferDone | Failed:
    """The chain's ``Infer`` and the worker's answer (a step's ``Failed`` included)."""
    owned = request.owned
    key = request.model.key
    # (a chain's steps run requests alone, none a sequence's: one the worker comes to too
    # late to end by its deadline is not run, as a request alone is not)
    expires = worker.expires(deadline)
    light = dispatch.light()

    def inputs_free() -> None:
        for held in owned:
            held.release()
        if share is not None:
            share.back()

    reply = await infer_on(
        worker,
        lambda rid: Infer(
            rid, key, inputs, chain.outputs, chain=chain.messages, light=light, expires=expires
        ),
        inputs_free,
        dispatch.outputs,
        deadline,
    )
    if isinstance(reply, Failed):
        dispatch.forget(reply.dropped)
        if len(reply.steps) >= len(chain.steps):  # a worker that broke the protocol
            raise WorkerProtocolError(f"worker {worker.worker_id} failed a step of no chain")
        return reply
    done = dispatch.answered(worker, reply)
    if len(done.steps) != len(chain.steps):  # (a worker that broke the protocol)
        if done.segment:
            worker.release_outputs(done.segment)
        raise WorkerProtocolError(f"worker {worker.worker_id} ran {len(done.steps)} chain steps")
    return done


def _count(
    chain: Chain,
    stats_of: Callable[[ModelVersion], ModelStats],
    steps: list[StepTimes],
    start: int,
    sent: int,
) -> None:
    """Each step that ran, in its model's statistics, as a request that ran alone: the
    first from the chain's arrival (queued from its send), each next from its start."""
    for position, times in enumerate(steps):
        model = chain.models[position]
        batch = times.rows if model.max_batch_size > 0 else 1
        queue = max(0, times.started_ns - sent) if position == 0 else 0
        arrived = start if position == 0 else times.started_ns
        end = times.started_ns + times.input_ns + times.infer_ns + times.output_ns
        stats = stats_of(model)
        stats.executed(batch, times.input_ns, times.infer_ns, times.output_ns)
        stats.request_succeeded(
            batch, max(0, end - arrived), queue, times.input_ns, times.infer_ns, times.output_ns
        )
