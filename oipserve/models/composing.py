"""An ensemble's composing models at its load: loaded with it, waited for, never itself.

Triton loads an ensemble's composing models with it. ``ComposingLoads.load_for`` does so
before the ensemble's own load: a composing model the start loads anyway
(``registry.required``) is waited for, not loaded twice; one not loaded, and in the
repository, is loaded now, an ensemble with its own composing models (Triton's nested
ensembles). What is still missing afterwards fails the ensemble's validation
(``models.ensemble.validate``) with Triton's message.

``cycle`` is Triton's ``circular dependency between ensembles``: an ensemble that is its
own step, however far down, through the ensembles loaded and those of the repository now.
Nothing is waited for then (two ensembles naming each other held the start for ever,
found by fuzzing), and the manager refuses the load with that message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator

from oipserve.models.config.parse import ModelConfig
from oipserve.models.ensemble import EnsembleVersion, composing_names, ensemble_cycle
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.models.repository import Repository

__all__ = ["ComposingLoads"]

log = logging.getLogger("oipserve.models")


class ComposingLoads:
    """The composing models of the ensembles a manager loads."""

    def __init__(
        self,
        repository: Repository,
        registry: ModelRegistry,
        load: Callable[[str], Awaitable[object]],
    ) -> None:
        self.repository = repository
        self.registry = registry
        #: The manager's ``load`` (a composing model loads as any model does).
        self.load = load
        #: Models loaded as an ensemble's step and never asked for themselves since: an
        #: unload with its dependents takes them along (``released``).
        self.as_step: set[str] = set()
        #: Set (and replaced) at each end of a load or unload (``settle``): a load waiting
        #: for a composing model that the start loads anyway waits on it.
        self._settled = asyncio.Event()

    def settle(self) -> None:
        """A load or unload ended: wake the ensemble loads waiting for one."""
        self._settled.set()
        self._settled = asyncio.Event()

    def loaded(self, name: str, as_step: bool) -> None:
        """``name`` loaded: for an ensemble's step (``as_step``), or asked for (a model
        loaded as a step and then asked for is the operator's from then on)."""
        if as_step:
            self.as_step.add(name)
        else:
            self.as_step.discard(name)

    def forget(self, name: str) -> None:
        """``name`` is no longer loaded."""
        self.as_step.discard(name)

    def released(self, gone: list[ModelVersion]) -> list[str]:
        """The composing models of the ensemble versions in ``gone`` that no loaded
        ensemble has as a step any more, and that were loaded only as steps (Triton's
        ``unload_dependents``: a model loaded by its own request stays)."""
        steps = set(_steps_of(gone))
        still = set(
            _steps_of(
                version
                for versions in self.registry.models.values()
                for version in versions.values()
            )
        )
        return sorted(
            name for name in steps - still if name in self.as_step and name in self.registry.models
        )

    async def load_for(self, name: str, config: ModelConfig | None) -> None:
        """Before ``name`` loads (with ``config``, or the repository's): if it is an
        ensemble, its composing models, loaded or waited for."""
        source = self.repository.read(name, config)
        if source.error is not None or source.config is None or source.config.ensemble is None:
            return
        if self.cycle(name, source.config) is not None:
            return
        known = set(self.repository.names())
        for dep in composing_names(source.config):
            if dep not in known:
                continue
            while self._pending(dep):
                await self._settled.wait()
            if dep in self.registry.models:
                continue
            log.info("model '%s': loading its composing model '%s'", name, dep)
            await self.load(dep)

    def cycle(self, name: str, config: ModelConfig) -> str | None:
        """Triton's message when ensemble ``name`` with ``config`` would be its own step;
        None otherwise (and for a model that is not an ensemble)."""
        return ensemble_cycle(name, composing_names(config), self._composing_of)

    def _composing_of(self, name: str) -> list[str]:
        """The models the steps of ``name`` name, as loaded and as the repository has
        them now (none for a model that is not an ensemble)."""
        names = list(_steps_of(self.registry.models.get(name, {}).values()))
        config = self.repository.read(name).config
        return names + composing_names(config) if config is not None else names

    def _pending(self, name: str) -> bool:
        """The start will load ``name`` (or is loading it) and has not yet."""
        registry = self.registry
        if name in registry.loading:
            return True
        return (
            name in registry.required
            and name not in registry.models
            and (name not in registry.failed)
        )


def _steps_of(versions: Iterable[ModelVersion]) -> Iterator[str]:
    """The models the steps of the ensemble versions among ``versions`` name."""
    for version in versions:
        if isinstance(version, EnsembleVersion):
            for step in version.plan.steps:
                yield step.model_name
