"""An ensemble version in the registry: no worker holds it, its steps' models run it.

``EnsembleVersion`` is a ``ModelVersion`` whose readiness is its steps': it is READY once
loaded and ready while every composing model (the step's version, or any ready version
for ``model_version: -1``) is ready. A composing model unloaded or not ready makes the
ensemble answer 503 with the step named (``ModelRegistry.resolve`` shows ``reason``).

``validate`` is the load-time half of Triton's checks (``oipserve.models.config.ensemble``
has the half that needs only the ensemble's own configuration): each step's model known
and loaded, batch sizes, tensor maps, datatypes and shapes agreeing between steps. A step's
model may itself be an ensemble (Triton's nested ensembles); ``ensemble_cycle`` refuses one
that leads back to itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from oipserve.errors import NotFound, ServerError, Unavailable
from oipserve.models.config.ensemble import (
    ENSEMBLE_PLATFORM,
    EnsembleConfig,
    EnsembleError,
    EnsembleStep,
    StepModel,
    check_against,
)
from oipserve.models.config.parse import ModelConfig
from oipserve.models.metadata import TensorSpec
from oipserve.models.registry import ModelRegistry, ModelVersion

__all__ = [
    "EnsembleVersion",
    "chain_runs",
    "composing_names",
    "ensemble_cycle",
    "validate",
]


class EnsembleVersion(ModelVersion):
    """One version of an ensemble: orchestrated by the front (``dataplane.ensemble``)."""

    def __init__(
        self,
        name: str,
        version: str,
        path: str,
        config: ModelConfig,
        plan: EnsembleConfig,
        registry: ModelRegistry,
    ) -> None:
        super().__init__(name, version, path, config)
        self.platform = ENSEMBLE_PLATFORM
        #: The steps, in dependency order, and who reads whose outputs.
        self.plan = plan
        self.registry = registry
        limit = plan.max_inflight_requests
        #: ``max_inflight_requests``: one semaphore per step, shared by the ensemble's
        #: requests (none without a limit: no cost at all).
        self.step_slots: tuple[asyncio.Semaphore, ...] | None = (
            tuple(asyncio.Semaphore(limit) for _ in plan.steps) if limit else None
        )
        #: Runs of steps that only ever run one right after the other: each may run as
        #: one chain in one worker (``dataplane.ensemble_chains``); none with a limit.
        self.chain_runs = () if limit else chain_runs(plan)
        #: The data plane's ``ChainPlan`` for the composing versions it was made for.
        self.chain_plan: object = None
        #: Why the steps' models, as loaded now, no longer fit this ensemble ("" while
        #: they do), and the registry's ``changes`` when that was last checked.
        self.mismatch = ""
        self._checked_at = -1

    def step_model(self, index: int) -> ModelVersion:
        """The version that runs step ``index`` now; 503 naming the step when it has none."""
        step = self.plan.steps[index]
        version = None if step.model_version < 0 else str(step.model_version)
        try:
            return self.registry.resolve(step.model_name, version)
        except (NotFound, Unavailable) as exc:
            raise Unavailable(
                f"ensemble '{self.name}' cannot run: step {index} (model '{step.model_name}') "
                f"is not available: {exc.message}",
                retry_after=1,
            ) from None

    def has_sequence_step(self) -> bool:
        """Whether a step's model has a version with ``sequence_batching``: the ensemble's
        requests then carry the sequence parameters, which the runner passes to its steps,
        as Triton passes the correlation id. (Dict lookups only: it runs per request.)"""
        models = self.registry.models
        for step in self.plan.steps:
            for version in models.get(step.model_name, {}).values():
                config = version.config
                if config is not None and config.sequence_batching is not None:
                    return True
                if isinstance(version, EnsembleVersion) and version.has_sequence_step():
                    return True
        return False

    def _missing_step(self) -> str | None:
        """Why a step cannot run now, or None when every step's model is ready."""
        models = self.registry.models
        for index, step in enumerate(self.plan.steps):
            versions = models.get(step.model_name, {})
            if step.model_version < 0:
                ready = any(v.ready for v in versions.values())
            else:
                found = versions.get(str(step.model_version))
                ready = found is not None and found.ready
            if not ready:
                return (
                    f"step {index} (composing model '{step.model_name}'"
                    + ("" if step.model_version < 0 else f" version {step.model_version}")
                    + ") is not ready"
                    + (" (it was unloaded)" if step.model_name in self.registry.unloaded else "")
                )
        return self._step_mismatch()

    def _step_mismatch(self) -> str | None:
        """Why the steps' models, as loaded now, no longer fit; None while they do.

        Checked again (``validate``) only after the registry changed: a reload of a step's
        model (another ensemble's most of all, which has no graph to hold its tensors)
        may rename or retype what this ensemble maps. Triton checks an ensemble again
        when a model it uses is reloaded; until a reload fits again, this one is not
        ready and answers 503 saying why, where its requests got a 400 blaming the
        client (found by fuzzing)."""
        changes = self.registry.changes
        if self._checked_at != changes:
            self._checked_at = changes
            try:
                validate(self)
            except CANNOT_LOAD as exc:
                self.mismatch = str(exc)
            else:
                self.mismatch = ""
        if not self.mismatch:
            return None
        return f"a step's model no longer fits it since it was reloaded: {self.mismatch}"

    @property
    def ready(self) -> bool:
        if self.state != "READY":
            return False
        missing = self._missing_step()
        self.reason = missing or ""
        return missing is None

    def check_serving(self) -> None:
        """503 once out of service or while a step's model is not ready."""
        if self.state != "READY":
            raise self.gone_while("in flight")
        missing = self._missing_step()
        if missing is not None:
            raise Unavailable(f"ensemble '{self.name}': {missing}", retry_after=1)


def chain_runs(plan: EnsembleConfig) -> tuple[tuple[int, ...], ...]:
    """The runs of two steps or more that only ever run one right after the other."""
    producer = {
        tensor: i for i, step in enumerate(plan.steps) for tensor in step.output_map.values()
    }
    claimed: set[int] = set()
    runs = []
    for first in range(len(plan.steps)):
        if first in claimed:
            continue
        run = [first]
        while len(plan.consumers[run[-1]]) == 1:
            following = plan.consumers[run[-1]][0]
            reads = plan.steps[following].input_map.values()
            if following in claimed or any(producer.get(t, -1) not in run for t in reads):
                break
            run.append(following)
        if len(run) > 1:
            claimed.update(run)
            runs.append(tuple(run))
    return tuple(runs)


def composing_names(config: ModelConfig) -> list[str]:
    """The models an ensemble's steps name, each once, in step order."""
    plan = config.ensemble
    return list(dict.fromkeys(step.model_name for step in plan.steps)) if plan else []


def _spec_dims(spec: TensorSpec) -> tuple[str, tuple[int, ...]]:
    return spec.datatype, spec.shape


def _step_model(registry: ModelRegistry, ensemble: str, step: EnsembleStep) -> StepModel:
    """What ``check_against`` needs of a step's model; EnsembleError in Triton's words when
    it has no loaded version (or not the one the step asks for)."""
    versions = registry.models.get(step.model_name)
    loaded = {v: m for v, m in (versions or {}).items() if m.state == "READY"}
    if not loaded:
        why = registry.failed.get(step.model_name)
        if why is None and versions is None and step.model_name not in registry.unloaded:
            raise EnsembleError(
                f"ensemble '{ensemble}' depends on '{step.model_name}', which is not a model "
                "of the repository (unknown composing model)"
            )
        raise EnsembleError(
            f"ensemble '{ensemble}' depends on '{step.model_name}' which has no loaded version."
            + (f" Model '{step.model_name}' loading failed with error: {why}" if why else "")
        )
    if step.model_version >= 0:
        model = loaded.get(str(step.model_version))
        if model is None:
            raise EnsembleError(
                f"ensemble '{ensemble}' depends on '{step.model_name}' whose required version "
                f"{step.model_version} is not loaded."
            )
    else:
        model = loaded[max(loaded, key=int)]
    return StepModel(
        model.name,
        model.max_batch_size,
        {t.name: _spec_dims(t) for t in model.inputs},
        {t.name: _spec_dims(t) for t in model.outputs},
        frozenset(t.name for t in model.inputs if t.optional),
    )


def ensemble_cycle(
    name: str, steps: Iterable[str], composing_of: Callable[[str], Iterable[str]]
) -> str | None:
    """Triton's message when the models of ``name``'s steps (``steps``) lead back to
    ``name`` through ensembles; None otherwise. ``composing_of`` gives the models of an
    ensemble's steps (none for a model that is not an ensemble).

    An ensemble may be a step of another (as in Triton), but not of itself, however far
    down: its load would wait for itself, and its requests would never end."""
    seen: set[str] = set()
    pending = [(step, name) for step in steps]  # (a model, the ensemble naming it)
    while pending:
        model, named_by = pending.pop()
        if model == name:
            return f"circular dependency between ensembles: {name} -> ... -> {named_by} -> {name}"
        if model not in seen:
            seen.add(model)
            pending.extend((step, model) for step in composing_of(model))
    return None


def validate(model: EnsembleVersion) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Check the ensemble against its composing models as loaded now; its metadata (the
    ensemble's own inputs and outputs as clients see them). EnsembleError otherwise."""
    config = model.config
    if config is None:  # an EnsembleVersion is made from a configuration only
        raise EnsembleError(f"ensemble '{model.name}' has no configuration")
    batch = (-1,) if config.max_batch_size > 0 else ()
    # NOTE: an optional one a request leaves out reaches the steps that read it as absent,
    #   as in Triton (``dataplane.ensemble_run``): a step whose own input is optional runs
    #   without it, one whose input is required is refused in the step model's words.
    inputs = tuple(
        TensorSpec(t.name, t.data_type, (*batch, *t.dims), None, t.optional) for t in config.inputs
    )
    outputs = tuple(
        TensorSpec(t.name, t.data_type, (*batch, *t.dims), None, False, t.labels)
        for t in config.outputs
    )
    check_against(
        model.name,
        config.max_batch_size,
        [(t.name, t.datatype, t.shape) for t in inputs],
        [(t.name, t.datatype, t.shape) for t in outputs],
        model.plan,
        lambda step: _step_model(model.registry, model.name, step),
    )
    return inputs, outputs


#: What means "this ensemble cannot load" besides a bad configuration.
CANNOT_LOAD = (EnsembleError, ServerError)
