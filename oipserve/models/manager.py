"""Loading repository models onto workers, and keeping the registry in step.

The manager derives each version's metadata from the ONNX graph, refined by
``config.pbtxt`` (or a load's ``config``) when there is one; reloads swap versions
only once all the new ones are ready; uploaded model files live in its upload area.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from hardware import InventoryError, cuda_provider_options
from oipserve.errors import InvalidInput, ServerError, Unavailable
from oipserve.models.autofill import AutoComplete, completed_metadata
from oipserve.models.composing import ComposingLoads
from oipserve.models.config.parse import ConfigLimits, ModelConfig, ModelConfigError, check_limits
from oipserve.models.config.session_options import session_options
from oipserve.models.ensemble import CANNOT_LOAD as ENSEMBLE_CANNOT_LOAD
from oipserve.models.ensemble import EnsembleVersion, validate
from oipserve.models.instance_groups import place_groups
from oipserve.models.metadata import MetadataConflict
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.models.repository import ModelSource, Repository, read_model
from oipserve.models.uploads import UploadArea, UploadError, UploadFiles
from oipserve.pool.handle import WorkerHandle, own_handle
from oipserve.pool.link import WorkerDied, WorkerLink
from oipserve.pool.worker_pool import WorkerPool
from oipserve.wire.messages import Loaded

__all__ = ["ModelManager", "gpu_fallback_refusal", "unload_quietly"]

# NOTE: the logger the load lines always came from (operators grep for it).
log = logging.getLogger("oipserve.models")

#: What means "this model cannot be loaded" (bad config, a graph that does not match it,
#: a device or file problem, a worker's refusal), as opposed to a bug of the server.
_CANNOT_LOAD = (ServerError, MetadataConflict, ModelConfigError, OSError)

#: Seconds a load waits for the worker replacements under way before it places its
#: sessions (one start, and one pause between failed starts, ``worker_pool.MAX_PAUSE``).
REPLACEMENT_WAIT = 15.0
#: Times a version's sessions are placed when workers die during a placement (each
#: replaced, as their models are).
PLACEMENT_TRIES = 2

#: The provider a session planned on a GPU must really get (``gpu_fallback_refusal``).
_CUDA = "CUDAExecutionProvider"


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
        self.pool = pool
        self.registry = registry
        #: Starts CPU workers when a KIND_CPU instance group needs them and ``--devices``
        #: started none (Triton runs KIND_CPU instances on the CPU whatever GPUs exist).
        self.start_cpu_workers = start_cpu_workers
        #: Ids of the workers started that way: they hold KIND_CPU instances only.
        self.cpu_on_demand: set[int] = set()
        #: Fake inventory (``gpu_sessions: "simulated"``): GPUs do not exist, so sessions run
        #: on the CPU provider while the planned CUDA providers are only recorded
        #: (``ModelVersion.placements``).
        self.simulate_devices = simulate_devices
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
        pool.on_replaced(self._reloaded)

    def providers_for(
        self, worker: WorkerHandle, model: ModelVersion
    ) -> list[tuple[str, dict[str, str]]]:
        """Providers planned for ``model`` on ``worker``'s device; InvalidInput on bad options."""
        if not worker.device.startswith("cuda:"):
            return [("CPUExecutionProvider", {})]
        index = int(worker.device.partition(":")[2])
        try:
            options = cuda_provider_options(index, {**model.parameters, **model.cuda_settings})
        except InventoryError as exc:
            raise InvalidInput(f"model '{model.name}': {exc}") from None
        return [("CUDAExecutionProvider", options), ("CPUExecutionProvider", {})]

    def repository_workers(self) -> list[WorkerHandle]:
        """Workers that hold repository models: those started with the server."""
        return [w for w in self.pool.workers if w.alive and not w.dedicated]

    def workers_for(self, model: ModelVersion) -> list[WorkerHandle]:
        """The repository workers that get a session of ``model``; MetadataConflict if none fit.

        Without ``instance_group`` every repository worker holds the model. With it, as
        in Triton: ``KIND_CPU`` places ``count`` instances on the CPU, ``KIND_GPU`` on each
        GPU of ``gpus`` (all GPUs when empty), ``KIND_AUTO``/``KIND_MODEL`` on the GPUs if
        the server runs any, else on the CPU (``models.instance_groups``; the model keeps
        the groups so resolved for its config response). An instance is a session in one worker
        process, so ``count`` is capped at the worker processes of that device
        (``--instances-per-device``): two sessions in one single-threaded worker would
        not run at the same time.
        """
        workers = self.repository_workers()
        groups = model.config.instance_groups if model.config else ()
        if not groups:
            return [w for w in workers if w.worker_id not in self.cpu_on_demand]
        chosen, model.instance_groups = place_groups(groups, workers, model.name)
        return chosen

    async def place(self, model: ModelVersion, worker: WorkerHandle, threads: int | None) -> Loaded:
        """Create one session of ``model`` on ``worker`` and record what it was given.

        A session sent to a GPU that ONNX Runtime put on the CPU is unloaded at once and
        the placement fails (InvalidInput, like the worker's own load refusals).
        """
        planned = self.providers_for(worker, model)
        sent = [("CPUExecutionProvider", {})] if self.simulate_devices else planned
        level = model.config.graph_level if model.config is not None else 0
        options = session_options(model.name, model.parameters, level)
        loaded = await worker.load(model.key, model.path, sent, threads, options)
        refusal = gpu_fallback_refusal(
            model.name, model.version, worker.device, [name for name, _ in sent], loaded.providers
        )
        if refusal is not None:
            await unload_quietly(worker, model.key)
            raise InvalidInput(refusal)
        model.session_threads[worker.worker_id] = threads
        model.placements[worker.worker_id] = {
            "worker": worker.worker_id,
            "device": worker.device,
            "providers": [[name, options] for name, options in planned],
            "simulated": self.simulate_devices and planned != sent,
            "session_providers": loaded.providers,
            "graph_optimization_level": loaded.graph_optimization_level,
        }
        model.providers[worker.worker_id] = loaded.providers
        return loaded

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
            await self._cpu_workers_on_demand(model)
            loaded = await self._place_everywhere(model)
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
            _placement(model.workers),
        )

    async def _cpu_workers_on_demand(self, model: ModelVersion) -> None:
        """Start CPU workers for a KIND_CPU group when the server runs none (once)."""
        groups = model.config.instance_groups if model.config else ()
        wanted = any(g.kind == "KIND_CPU" for g in groups)
        if not wanted or self.start_cpu_workers is None:
            return
        if any(w.device == "cpu" for w in self.repository_workers()):
            return
        started = await self.start_cpu_workers()
        self.cpu_on_demand.update(w.worker_id for w in started)

    async def _place_everywhere(self, model: ModelVersion) -> list[Loaded]:
        """A session of ``model`` on each worker that is to hold it (``workers_for``).

        A worker being replaced gets the registry's models back, not this version's: the
        placement waits for the replacements under way, or the version would leave the
        slot without a session for good. A worker that dies during the placement is
        replaced so too: the placement is made again, once, on the workers then running
        (the sessions made meanwhile unloaded first). Such a load failed for good: a 400
        blaming the model, and a model unavailable with its worker back (found by fuzzing).
        """
        for attempt in range(PLACEMENT_TRIES):
            await self.pool.replaced(REPLACEMENT_WAIT)
            workers = self.workers_for(model)
            model.workers = list(workers)
            retry = attempt + 1 < PLACEMENT_TRIES
            if not workers:
                if retry and self.pool.replacing:  # each died since the wait: one more
                    continue
                raise MetadataConflict("no worker process runs to hold it")
            log.info(
                "model '%s' version %s: loading %s on %s",
                model.name,
                model.version,
                model.path,
                _placement(workers),
            )
            # Every placement ends before a failure is handled, so none is left loading.
            results = await asyncio.gather(
                *(self.place(model, w, None) for w in workers), return_exceptions=True
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            if not failures:
                return [r for r in results if isinstance(r, Loaded)]
            if not retry or not all(isinstance(f, WorkerDied) for f in failures):
                raise failures[0]
            log.warning(
                "model '%s' version %s: a worker stopped while loading it; loading it again",
                model.name,
                model.version,
            )
            for worker in workers:
                if worker.alive and model.key in worker.models:
                    with contextlib.suppress(WorkerDied):
                        await own_handle(worker).unload(model.key)
        raise AssertionError("unreachable")

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

    async def _reloaded(self, worker: WorkerHandle) -> None:
        """Give a replacement worker the sessions the registry says its slot holds.

        The record is the registry's: every version in service that lists this worker,
        made again as it was first made (``place``, with the threads it had). What the dead
        process held is gone with it. A version taken out of service while its session was
        being made again is unloaded from the new process at once. A failure raises: the
        pool counts it as a failed start and tries again.
        """
        for model in self._held_by(worker):
            if not _serves_on(model, worker):
                continue  # unloaded or replaced meanwhile
            await self.place(model, worker, model.session_threads.get(worker.worker_id))
            if not _serves_on(model, worker):
                await unload_quietly(worker, model.key)
        log.info("worker %d holds %d model versions again", worker.worker_id, len(worker.models))

    def _held_by(self, worker: WorkerHandle) -> list[ModelVersion]:
        """The versions in the registry (repository models and endpoints) with a session on
        ``worker``'s slot."""
        return [
            model
            for versions in self.registry.models.values()
            for model in versions.values()
            if _serves_on(model, worker)
        ]


def gpu_fallback_refusal(
    name: str, version: str, device: str, sent: list[str], session_providers: list[str]
) -> str | None:
    """Why a session sent to the GPU cannot serve there, or None when it got its GPU.

    ONNX Runtime silently falls back to the next provider when the CUDA one cannot start
    (a CPU-only onnxruntime, CUDA or cuDNN libraries that do not load, a driver too old
    for them). As in Triton, a GPU instance without its GPU is a failed load, not a CPU
    instance many times slower than the operator expects.
    """
    if not sent or sent[0] != _CUDA or _CUDA in session_providers:
        return None
    got = ", ".join(session_providers) or "no execution provider"
    return (
        f"model '{name}' version {version} on {device}: ONNX Runtime could not use the GPU "
        f"(the session got {got} only); install onnxruntime-gpu with CUDA and cuDNN libraries "
        "that match the driver (docs/deploy.md), or serve the model on the CPU "
        "(--devices cpu, or instance_group KIND_CPU)"
    )


async def unload_quietly(worker: WorkerHandle, key: str) -> None:
    """Unload ``key`` from ``worker``; a worker that died meanwhile has nothing left to unload."""
    try:
        await worker.unload(key)
    except ServerError:
        pass


def _serves_on(model: ModelVersion, worker: WorkerHandle) -> bool:
    """``model`` is in service and one of its sessions belongs on ``worker``'s slot."""
    return model.state == "READY" and not model.echo and worker in model.workers


def _placement(workers: Sequence[WorkerLink]) -> str:
    """Where a version's sessions are, for the log: ``worker 0 (cpu), worker 1 (cuda:0)``."""
    return ", ".join(f"worker {w.worker_id} ({w.device})" for w in workers) or "no worker"


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
