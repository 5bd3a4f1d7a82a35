"""Loading repository models onto workers, and keeping the registry in step.

The manager derives each version's metadata from the ONNX graph, refined by
``config.pbtxt`` (or a load's ``config``) when there is one; reloads swap versions
only once all the new ones are ready; uploaded model files live in its upload area.
Where a version's sessions go, and each one made on its worker, is ``models.placement``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from oipserve.errors import ServerError, Unavailable
from oipserve.models.autofill import AutoComplete, completed_metadata
from oipserve.models.composing import ComposingLoads
from oipserve.models.config.parse import ConfigLimits, ModelConfig, ModelConfigError, check_limits
from oipserve.models.ensemble import CANNOT_LOAD as ENSEMBLE_CANNOT_LOAD
from oipserve.models.ensemble import EnsembleVersion, validate
from oipserve.models.metadata import MetadataConflict
from oipserve.models.placement import Placement, where
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.models.repository import ModelSource, Repository, read_model
from oipserve.models.uploads import UploadArea, UploadError, UploadFiles
from oipserve.pool.handle import WorkerHandle, own_handle
from oipserve.pool.link import WorkerDied
from oipserve.pool.worker_pool import WorkerPool

__all__ = ["ModelManager"]

# NOTE: the logger the load lines always came from (operators grep for it).
log = logging.getLogger("oipserve.models")

#: What means "this model cannot be loaded" (bad config, a graph that does not match it,
#: a device or file problem, a worker's refusal), as opposed to a bug of the server.
_CANNOT_LOAD = (ServerError, MetadataConflict, ModelConfigError, OSError)


class ModelManager:
    """Loads repository models onto workers and keeps the registry in step."""

    def __init__(
        self,
        root: Path | Repository,
        pool: WorkerPool,
        registry: ModelRegistry,
        simulate_devices: bool = False,
        start_cpu_workers: Callable[[], Awaitable[list[WorkerHandle]]] | None = None,
        config_limits: ConfigLimits | None = None,
        auto_complete: AutoComplete | None = None,
    ) -> None:
        #: The repository, and the names its models are served under (``--model-name``).
        self.repository = root if isinstance(root, Repository) else Repository(root)
        self.root = self.repository.root
        #: The operator's bounds on configuration numbers (``--max-priority-levels``).
        self.config_limits = config_limits or ConfigLimits()
        #: Configurations completed from the graph as Triton's ONNX Runtime backend does
        #: (``--disable-auto-complete-config``, ``--backend-config``; ``models.autofill``).
        self.auto_complete = auto_complete or AutoComplete()
        self.registry = registry
        #: Where the versions' sessions go, and each made on its worker.
        self.placement = Placement(pool, registry, simulate_devices, start_cpu_workers)
        self.lock = asyncio.Lock()
        #: Uploaded model files (loads with ``file:`` parameters), and which upload
        #: directory each loaded model came from.
        self.uploads = UploadArea()
        self.upload_of: dict[str, Path] = {}
        #: Unloads of sessions abandoned at a load timeout, still waiting for their worker.
        self.background: set[asyncio.Task[None]] = set()
        #: The other HTTP fronts (``--http-workers``, ``oipserve.scaleout``): told after
        #: each change of the registry (``changed``), and before a version's sessions are
        #: unloaded (``retiring``: they stop answering it and finish what they sent).
        self.changed: Callable[[], Awaitable[None]] | None = None
        self.retiring: Callable[[ModelVersion, str], Awaitable[None]] | None = None
        #: Ensembles' composing models, loaded with them (``self.load``, as any model).
        self.composing = ComposingLoads(
            self.repository, registry, functools.partial(self.load, as_step=True)
        )
        pool.on_replaced(self.placement.reloaded)

    async def load(
        self,
        name: str,
        config: ModelConfig | None = None,
        files: UploadFiles | None = None,
        timeout: float | None = None,
        as_step: bool = False,
    ) -> str | None:
        """Load (or reload) every version of ``name``; None, or the reason it failed.

        ``as_step``: loaded for an ensemble (``ComposingLoads``), not asked for; such a model
        goes with the ensemble when its unload asks for its dependents.

        ``config`` replaces the directory's config.pbtxt for this load; ``files`` are the
        model directory itself (uploaded; written under ``uploads``, never into the
        repository). A reload swaps the new versions in only when all of them loaded, so
        requests never see the model unknown; a failed reload leaves the old ones serving.
        Past ``timeout`` seconds the load is undone and ``Unavailable`` raised.

        The files are written before the lock that serialises loads is taken: other
        models' loads never wait for them (their own directory is this load's alone).
        """
        if config is not None:
            try:
                check_limits(config, self.config_limits)
            except ModelConfigError as exc:
                return f"invalid config override: {exc}"
        place: Path | None = None
        if not files:
            await self.composing.load_for(name, config)
        if files:
            try:
                place = await self.uploads.write(name, files)
            except UploadError as exc:
                return str(exc)
            except OSError as exc:
                return f"cannot write the uploaded files: {exc}"
        try:
            async with self.lock:
                reason = await self._load_locked(name, config, place, timeout)
                if reason is None:
                    self.composing.loaded(name, as_step)
                return reason
        except BaseException:
            if place is not None and self.upload_of.get(name) != place:
                self.uploads.remove(place)
            raise

    async def _load_locked(
        self, name: str, config: ModelConfig | None, place: Path | None, timeout: float | None
    ) -> str | None:
        self.registry.loading.add(name)
        try:
            if place is None:
                source = self.repository.read(name, config)
            else:
                source = read_model(place, name, config)
            reason = await self._load_source(source, timeout)
        finally:
            self.registry.loading.discard(name)
            self.composing.settle()
            await self._tell_changed()
        if reason is not None and place is not None and self.upload_of.get(name) != place:
            self.uploads.remove(place)
        return reason

    async def _tell_changed(self) -> None:
        if self.changed is not None:
            await asyncio.shield(self.changed())

    async def _load_source(self, source: ModelSource, timeout: float | None) -> str | None:
        name = source.name
        source = self._checked(source)
        if source.error is not None:
            log.error("model '%s' is UNAVAILABLE: %s", name, source.error)
            if name not in self.registry.models:
                self.registry.failed[name] = source.error
            return source.error
        versions = {v: self._version(source, v, path) for v, path in source.versions.items()}
        for model in versions.values():
            model.repository = True
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(self._load_version(m) for m in versions.values()))
        except BaseException as exc:
            # Past the timeout, or cancelled (a gRPC client that went away): nothing of
            # this load may stay, whatever state its sessions are in.
            for model in versions.values():
                self._abandon(model)
            if not isinstance(exc, TimeoutError):
                raise
            message = (
                f"loading model '{name}' took more than --load-timeout {timeout:g}s; "
                "it was stopped and nothing of it is left"
            )
            log.error("%s", message)
            if name not in self.registry.models:
                self.registry.failed[name] = message
            raise Unavailable(message) from None
        broken = [m for m in versions.values() if m.state != "READY"]
        reason = "; ".join(f"version {m.version}: {m.reason}" for m in broken) or None
        for model in broken:
            log.error("model '%s' version %s is UNAVAILABLE: %s", name, model.version, model.reason)
        old = self.registry.models.get(name, {})
        if broken and any(m.state == "READY" for m in old.values()):
            # A failed reload changes nothing: the versions serving go on serving, those
            # whose only worker is being replaced included (they are ready again with it;
            # a reload in that moment took them out of service for good, found by fuzzing).
            log.error("model '%s': the reload failed; the loaded versions go on serving", name)
            discarded = [m for m in versions.values() if m.state == "READY"]
            await asyncio.shield(self._retire(discarded, "discarded", None))
            return reason
        self.registry.models[name] = versions
        self.registry.changes += 1
        self.registry.failed.pop(name, None)
        self.registry.unloaded.discard(name)
        self.registry.unloaded_versions.pop(name, None)
        await self._tell_changed()  # the other fronts get the new versions before the old go
        old_place = self.upload_of.pop(name, None)
        # NOTE: by where the files are, not by "not in the repository": a model served
        #   as --model-name is the repository itself (or one directory of it), whose parent
        #   must never be removed as if it were an upload.
        uploads = self.uploads.root
        # NOTE: the files are kept while a version of theirs serves (a worker replaced
        #   loads them again); those of a load that failed whole go with its 400 (they
        #   stayed until the name was loaded again, found by fuzzing).
        serving = any(m.state == "READY" for m in versions.values())
        if serving and uploads is not None and source.directory.is_relative_to(uploads):
            self.upload_of[name] = source.directory.parent
        # Shielded: once swapped, the old versions are unloaded even if this call is
        # cancelled (their sessions would otherwise stay in the workers).
        await asyncio.shield(self._retire(list(old.values()), "replaced by a reload", old_place))
        return reason

    async def _retire(self, models: list[ModelVersion], why: str, place: Path | None) -> None:
        """Unload versions no longer served, then the upload directory they came from."""
        for model in models:
            await self._unload_version(model, why)
        if place is not None and place not in self.upload_of.values():
            self.uploads.remove(place)

    def _checked(self, source: ModelSource) -> ModelSource:
        """``source``, or what it becomes when refused: a config past the limits, an
        ensemble that is its own step, however far down."""
        config = source.config
        if source.error is None and config is None and not self.auto_complete.enabled:
            return ModelSource(source.name, source.directory, error=_no_config(source))
        if source.error is not None or config is None:
            return source
        try:
            check_limits(config, self.config_limits)
        except ModelConfigError as exc:
            return ModelSource(source.name, source.directory, error=f"config.pbtxt: {exc}")
        cycle = self.composing.cycle(source.name, config)
        if cycle is not None:
            return ModelSource(source.name, source.directory, error=cycle)
        return source

    def _version(self, source: ModelSource, version: str, path: str) -> ModelVersion:
        """A new version of ``source``: an ensemble's runs on no worker."""
        config = source.config
        if config is not None and config.ensemble is not None:
            return EnsembleVersion(
                source.name, version, path, config, config.ensemble, self.registry
            )
        return ModelVersion(source.name, version, path, config)

    # ---- ensembles ------------------------------------------------------------

    async def _ready_ensemble(self, model: EnsembleVersion) -> None:
        """An ensemble version is ready once checked against its composing models."""
        started = time.monotonic()
        try:
            inputs, outputs = validate(model)
        except ENSEMBLE_CANNOT_LOAD as exc:
            await self._fail_version(model, str(exc))
            return
        model.set_metadata(inputs, outputs)
        model.load_seconds = time.monotonic() - started
        model.state = "READY"
        steps = ", ".join(step.model_name for step in model.plan.steps)
        log.info(
            "model '%s' version %s is READY: an ensemble of %s", model.name, model.version, steps
        )

    async def _load_version(self, model: ModelVersion) -> None:
        if isinstance(model, EnsembleVersion):
            await self._ready_ensemble(model)
            return
        # NOTE: a reload gives the new sessions a fresh key so the old ones can
        #   finish their in-flight requests under the old key.
        model.key = f"{model.name}/{model.version}#{id(model)}"
        # NOTE: the clock, not the loop's time: uvloop's counts whole milliseconds, and a
        #   load within one read 0 s (nv_model_load_duration_secs of a small model).
        started = time.monotonic()
        try:
            await self.placement.cpu_workers_on_demand(model)
            loaded = await self.placement.place_everywhere(model)
            config, inputs, outputs = completed_metadata(
                model.config, loaded[0], model.name, self.auto_complete
            )
        except _CANNOT_LOAD as exc:
            await self._fail_version(model, str(exc))
            return
        except Exception:
            # NOTE: anything else is a bug of the server, not of the model: its text is
            #   not a reason to show clients, the traceback goes to the log.
            log.exception("loading model '%s' version %s failed", model.name, model.version)
            await self._fail_version(model, "internal error while loading (see the log)")
            return
        model.config = config
        model.max_batch_size = config.max_batch_size if config is not None else 0
        model.set_metadata(inputs, outputs)
        listed = [t.name for t in outputs]
        if {m.name for m in loaded[0].outputs} - set(listed):
            model.run_outputs = listed
        model.load_seconds = time.monotonic() - started
        model.state = "READY"
        log.info(
            "model '%s' version %s is READY: loaded in %.2fs on %s",
            model.name,
            model.version,
            model.load_seconds,
            where(model.workers),
        )

    async def _fail_version(self, model: ModelVersion, reason: str) -> None:
        model.state = "UNAVAILABLE"
        model.reason = reason
        workers, model.workers = model.workers, []
        for worker in workers:
            if model.key in worker.models:
                await own_handle(worker).unload(model.key)

    def _abandon(self, model: ModelVersion) -> None:
        """Undo a version whose load ran out of time, without waiting for the workers.

        Repository workers are shared, so they are not killed: each is sent an unload,
        which it handles once the session it may still be creating exists.
        """
        model.state = "UNAVAILABLE"
        model.reason = "the load timed out"
        workers, model.workers = model.workers, []
        for worker in workers:
            worker.models.pop(model.key, None)
            if worker.alive:
                unloading = self._unload_late(own_handle(worker), model)
                task = asyncio.get_running_loop().create_task(unloading)
                self.background.add(task)
                task.add_done_callback(self.background.discard)

    async def _unload_late(self, worker: WorkerHandle, model: ModelVersion) -> None:
        try:
            await worker.unload(model.key)
        except ServerError:
            return  # the worker died meanwhile: nothing of it is left
        log.info(
            "model '%s' version %s: the session abandoned at the load timeout is unloaded "
            "from worker %d",
            model.name,
            model.version,
            worker.worker_id,
        )

    async def _unload_version(self, model: ModelVersion, why: str = "unloaded") -> None:
        model.stop_serving(why)
        if self.retiring is not None:
            # The other fronts' requests already sent are answered before the Unload too.
            await self.retiring(model, why)
        for worker in model.workers:
            # Requests already sent to this worker are answered before the Unload.
            if worker.alive and model.key in worker.models:
                with contextlib.suppress(WorkerDied):  # gone meanwhile, with its sessions
                    await own_handle(worker).unload(model.key)
        model.state = "UNAVAILABLE"

    async def unload(self, name: str, version: str | None = None, dependents: bool = False) -> bool:
        """Unload a repository model (or one version); False if it was not loaded.

        It leaves the registry first, so later requests get 404 (and its readiness is
        false: it is known), then each session is unloaded after the requests already
        sent to it; requests that found it before get their answer or a 503.

        ``dependents`` (Triton's ``unload_dependents``): once an ensemble is gone, the
        composing models loaded only for it go too, at any depth, unless another loaded
        ensemble still has them as a step (``ComposingLoads.released``).
        """
        async with self.lock:
            versions = self.registry.models.get(name)
            failed = self.registry.failed.pop(name, None)
            if versions is None:
                if failed is not None:
                    self.registry.unloaded.add(name)
                return failed is not None
            gone = await self._take_out(name, versions, version)
            if dependents and name not in self.registry.models:
                await self._unload_steps(gone)
            self.composing.settle()
            await self._tell_changed()
            return True

    async def _take_out(
        self, name: str, versions: dict[str, ModelVersion], version: str | None
    ) -> list[ModelVersion]:
        """Take ``version`` of ``name`` (every version when None) out of service; what went."""
        if version is not None:
            model = versions.get(version)
            if model is None:
                return []
            gone = [model]
            remaining = {v: m for v, m in versions.items() if v != version}
        else:
            gone = list(versions.values())
            remaining = {}
        if remaining:
            self.registry.models[name] = remaining
            self.registry.unloaded_versions.setdefault(name, set()).update(m.version for m in gone)
        else:
            if name in self.upload_of:
                # No directory to read its versions from: the index lists them unloaded
                # (an uploaded model went from it at its unload, found by fuzzing).
                self.registry.unloaded_versions.setdefault(name, set()).update(versions)
            else:
                self.registry.unloaded_versions.pop(name, None)
            del self.registry.models[name]
            self.registry.required.discard(name)
            self.registry.unloaded.add(name)
            self.composing.forget(name)
        for model in gone:
            await self._unload_version(model)
        if not remaining:
            self.uploads.remove(self.upload_of.pop(name, None))
        log.info("model '%s'%s unloaded", name, f" version {version}" if version else "")
        return gone

    async def _unload_steps(self, gone: list[ModelVersion]) -> None:
        """Unload the composing models the ensembles in ``gone`` leave unused."""
        pending = self.composing.released(gone)
        while pending:
            step = pending.pop()
            versions = self.registry.models.get(step)
            if versions is None:
                continue
            log.info("model '%s': unloading it with the ensemble it was loaded for", step)
            pending.extend(self.composing.released(await self._take_out(step, versions, None)))

    def close(self) -> None:
        """Remove every uploaded model file (at shutdown, once the workers are stopped)."""
        self.upload_of.clear()
        self.uploads.close()


def _no_config(source: ModelSource) -> str:
    """Why a model without a configuration is not loaded when auto-complete is off: core's
    words for the config.pbtxt it cannot read (Triton reads it then, and fails), then ours."""
    path = source.directory / "config.pbtxt"
    return (
        f"failed to open text file for read {path}: No such file or directory; the model has "
        "no config.pbtxt and auto-complete is off (--disable-auto-complete-config or "
        "--strict-model-config=true): give it a config.pbtxt that lists its inputs and "
        "outputs, or load it with a configuration, or start the server without the flag"
    )
