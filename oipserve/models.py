"""Models being served: their versions, metadata, state and instances.

The registry answers "which version serves this request, and is it ready";
the manager loads versions onto workers and derives each version's metadata
from the ONNX graph, refined by ``config.pbtxt`` when there is one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hardware import InventoryError, cuda_provider_options
from oipserve.errors import InvalidInput, NotFound, ServerError, Unavailable
from oipserve.metadata import MetadataConflict, TensorSpec, merge_metadata
from oipserve.model_config import ModelConfig, ModelConfigError
from oipserve.pool import WorkerPool
from oipserve.repository import ModelSource, read_model
from oipserve.session_options import session_options
from oipserve.wire.messages import Loaded
from oipserve.worker_handle import WorkerHandle

if TYPE_CHECKING:
    from oipserve.scheduler import DynamicBatcher

__all__ = [
    "ModelManager",
    "ModelRegistry",
    "ModelVersion",
    "TensorSpec",
    "merge_metadata",
]

log = logging.getLogger("oipserve.models")

State = Literal["LOADING", "READY", "UNAVAILABLE", "UNLOADING"]
PLATFORM = "onnxruntime_onnx"


#: What means "this model cannot be loaded" (bad config, a graph that does not match it,
#: a device or file problem, a worker's refusal), as opposed to a bug of the server.
_CANNOT_LOAD = (ServerError, MetadataConflict, ModelConfigError, OSError)


class ModelVersion:
    """One version of one model, and the workers that hold a session for it."""

    def __init__(self, name: str, version: str, path: str, config: ModelConfig | None) -> None:
        self.name = name
        self.version = version
        self.key = f"{name}/{version}"
        self.path = path
        self.config = config
        self.max_batch_size = config.max_batch_size if config else 0
        self.parameters: dict[str, str] = dict(config.parameters) if config else {}
        self.state: State = "LOADING"
        self.reason = ""
        self.inputs: tuple[TensorSpec, ...] = ()
        self.outputs: tuple[TensorSpec, ...] = ()
        self.input_map: dict[str, TensorSpec] = {}
        self.output_map: dict[str, TensorSpec] = {}
        self.workers: list[WorkerHandle] = []
        self.providers: dict[int, list[str]] = {}
        self.platform = PLATFORM
        #: Echo endpoints are answered by the front (inputs copied to outputs), no session.
        self.echo = False
        #: Extra CUDA settings (from worker-load parameters) on top of config parameters.
        self.cuda_settings: dict[str, str] = {}
        #: Its dynamic batcher (config.pbtxt ``dynamic_batching``), made on first use.
        self.batcher: DynamicBatcher | None = None
        #: Worker id -> where the session went and what it was given, for GET /v2/hardware.
        self.placements: dict[int, dict[str, object]] = {}

    def set_metadata(self, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.input_map = {t.name: t for t in inputs}
        self.output_map = {t.name: t for t in outputs}

    def check_serving(self) -> None:
        """NotFound once the version was unloaded; 503 while no worker runs it."""
        self._check_not_unloaded()
        if not self.instances():
            raise self._no_instance()

    def _check_not_unloaded(self) -> None:
        if self.state in ("UNLOADING", "UNAVAILABLE") and self.reason == "unloaded":
            raise NotFound(f"model '{self.name}' was unloaded")

    def _no_instance(self) -> Unavailable:
        return Unavailable(
            f"model '{self.name}' version {self.version} has no running instance "
            "(its worker is restarting)",
            retry_after=1,
        )

    def pick(self, max_queue: int) -> WorkerHandle:
        """The worker with the fewest requests in flight, or 503."""
        self._check_not_unloaded()
        best: WorkerHandle | None = None
        for worker in self.workers:
            if worker.alive and self.key in worker.models:
                if best is None or worker.in_flight < best.in_flight:
                    best = worker
        if best is None:
            raise self._no_instance()
        if best.in_flight >= max_queue:
            raise Unavailable(
                f"model '{self.name}' is overloaded: {best.in_flight} requests queued on "
                "each of its instances",
                retry_after=1,
            )
        return best

    def instances(self) -> list[WorkerHandle]:
        """The workers that can run this version now."""
        return [w for w in self.workers if w.alive and self.key in w.models]

    @property
    def ready(self) -> bool:
        if self.echo:
            return self.state == "READY"
        return self.state == "READY" and any(w.alive and self.key in w.models for w in self.workers)


class ModelRegistry:
    """Name -> version -> ModelVersion, plus the set that readiness depends on."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, ModelVersion]] = {}
        self.failed: dict[str, str] = {}
        self.required: set[str] = set()
        #: Names unloaded on request, for a clearer 404.
        self.unloaded: set[str] = set()

    def resolve(self, name: str, version: str | None) -> ModelVersion:
        versions = self.models.get(name)
        if versions is None:
            reason = self.failed.get(name)
            if reason is not None:
                raise Unavailable(f"model '{name}' is unavailable: {reason}")
            if name in self.unloaded:
                raise NotFound(f"model '{name}' is not loaded (it was unloaded)")
            raise NotFound(f"unknown model '{name}'")
        if version is not None:
            model = versions.get(version)
            if model is None:
                raise NotFound(
                    f"model '{name}' has no version '{version}' (versions: {', '.join(versions)})"
                )
        else:
            ready = [v for v in versions.values() if v.state == "READY"]
            if not ready:
                any_version = next(iter(versions.values()))
                raise Unavailable(
                    f"model '{name}' has no ready version"
                    + (f": {any_version.reason}" if any_version.reason else "")
                )
            model = max(ready, key=lambda v: int(v.version))
        if not model.ready:
            raise Unavailable(
                f"model '{name}' version {model.version} is not ready"
                + (f": {model.reason}" if model.reason else ""),
                retry_after=1,
            )
        return model

    def model_ready(self, name: str, version: str | None) -> bool:
        """Readiness of a known model (or version); unknown ones are NotFound."""
        versions = self.models.get(name)
        if versions is None:
            if name in self.failed:
                return False
            raise NotFound(f"unknown model '{name}'")
        if version is None:
            return any(v.ready for v in versions.values())
        model = versions.get(version)
        if model is None:
            raise NotFound(f"model '{name}' has no version '{version}'")
        return model.ready

    def all_ready(self) -> bool:
        for name in self.required:
            versions = self.models.get(name)
            if not versions or not all(v.ready for v in versions.values()):
                return False
        return True


class ModelManager:
    """Loads repository models onto workers and keeps the registry in step."""

    def __init__(
        self,
        root: Path,
        pool: WorkerPool,
        registry: ModelRegistry,
        simulate_devices: bool = False,
        start_cpu_workers: Callable[[], Awaitable[list[WorkerHandle]]] | None = None,
    ) -> None:
        self.root = root
        self.pool = pool
        self.registry = registry
        #: Starts CPU workers when a KIND_CPU instance group needs them and ``--devices``
        #: started none (Triton runs KIND_CPU instances on the CPU whatever GPUs exist).
        self.start_cpu_workers = start_cpu_workers
        #: Ids of the workers started that way: they hold KIND_CPU instances only.
        self.cpu_on_demand: set[int] = set()
        #: Fake inventory: GPUs do not exist, so sessions run on the CPU provider while the
        #: planned CUDA providers are only recorded (``ModelVersion.placements``).
        self.simulate_devices = simulate_devices
        self.lock = asyncio.Lock()
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
        the server runs any, else on the CPU. An instance is a session in one worker
        process, so ``count`` is capped at the worker processes of that device
        (``--instances-per-device``): two sessions in one single-threaded worker would
        not run at the same time.
        """
        workers = self.repository_workers()
        groups = model.config.instance_groups if model.config else ()
        if not groups:
            return [w for w in workers if w.worker_id not in self.cpu_on_demand]
        gpu_devices = sorted({w.device for w in workers if w.device.startswith("cuda:")})
        chosen: list[WorkerHandle] = []
        for group in groups:
            if group.kind == "KIND_CPU":
                devices = ["cpu"]
            elif group.kind == "KIND_GPU":
                devices = [f"cuda:{g}" for g in group.gpus] or gpu_devices
            else:
                devices = gpu_devices or ["cpu"]
            if not devices:
                raise MetadataConflict(
                    f"instance_group {group.kind} asks for a GPU; this server runs none"
                )
            for device in devices:
                on_device = [w for w in workers if w.device == device]
                if not on_device:
                    raise MetadataConflict(
                        f"instance_group asks for {device}, where this server runs no workers "
                        f"(--devices gave: {', '.join(sorted({w.device for w in workers}))})"
                    )
                chosen.extend(w for w in on_device[: group.count] if w not in chosen)
        return chosen

    async def place(self, model: ModelVersion, worker: WorkerHandle, threads: int | None) -> Loaded:
        """Create one session of ``model`` on ``worker`` and record what it was given."""
        planned = self.providers_for(worker, model)
        sent = [("CPUExecutionProvider", {})] if self.simulate_devices else planned
        options = session_options(model.name, model.parameters)
        loaded = await worker.load(model.key, model.path, sent, threads, options)
        model.placements[worker.worker_id] = {
            "worker": worker.worker_id,
            "device": worker.device,
            "providers": [[name, options] for name, options in planned],
            "simulated": self.simulate_devices and planned != sent,
            "session_providers": loaded.providers,
        }
        model.providers[worker.worker_id] = loaded.providers
        return loaded

    async def load(self, name: str) -> None:
        """Load (or reload) every version of ``name``; failures leave it UNAVAILABLE."""
        async with self.lock:
            source = read_model(self.root, name)
            self.registry.unloaded.discard(name)
            await self._load_source(source)

    async def _load_source(self, source: ModelSource) -> None:
        if source.error is not None:
            log.error("model '%s' is UNAVAILABLE: %s", source.name, source.error)
            self.registry.failed[source.name] = source.error
            return
        versions = {
            v: ModelVersion(source.name, v, path, source.config)
            for v, path in source.versions.items()
        }
        await asyncio.gather(*(self._load_version(m) for m in versions.values()))
        old = self.registry.models.get(source.name, {})
        self.registry.models[source.name] = versions
        self.registry.failed.pop(source.name, None)
        for model in old.values():
            await self._unload_version(model)
        for model in versions.values():
            if model.state == "READY":
                log.info("model '%s' version %s is READY", model.name, model.version)
            else:
                log.error(
                    "model '%s' version %s is UNAVAILABLE: %s",
                    model.name,
                    model.version,
                    model.reason,
                )

    async def _load_version(self, model: ModelVersion) -> None:
        # NOTE: a reload gives the new sessions a fresh key so the old ones can
        #   finish their in-flight requests under the old key.
        model.key = f"{model.name}/{model.version}#{id(model)}"
        workers: list[WorkerHandle] = []
        try:
            await self._cpu_workers_on_demand(model)
            workers = self.workers_for(model)
            if not workers:
                raise MetadataConflict("no worker process runs to hold it")
            results = await asyncio.gather(*(self.place(model, w, None) for w in workers))
            inputs, outputs = merge_metadata(model.config, results[0])
        except _CANNOT_LOAD as exc:
            await self._fail_version(model, workers, str(exc))
            return
        except Exception:
            # NOTE: anything else is a bug of the server, not of the model: its text is
            #   not a reason to show clients, the traceback goes to the log.
            log.exception("loading model '%s' version %s failed", model.name, model.version)
            await self._fail_version(model, workers, "internal error while loading (see the log)")
            return
        model.set_metadata(inputs, outputs)
        model.workers = workers
        model.state = "READY"

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

    async def _fail_version(
        self, model: ModelVersion, workers: list[WorkerHandle], reason: str
    ) -> None:
        model.state = "UNAVAILABLE"
        model.reason = reason
        for worker in workers:
            if model.key in worker.models:
                await worker.unload(model.key)

    async def _unload_version(self, model: ModelVersion) -> None:
        model.state = "UNLOADING"
        if model.batcher is not None:
            model.batcher.close()  # queued requests: 503; batches running finish
        for worker in model.workers:
            # Requests already sent to this worker are answered before the Unload.
            if worker.alive and model.key in worker.models:
                await worker.unload(model.key)
        model.state = "UNAVAILABLE"
        model.reason = "unloaded"

    async def unload(self, name: str, version: str | None = None) -> bool:
        """Unload a repository model (or one version); False if it was not loaded.

        It leaves the registry first, so later requests get 404, then each session
        is unloaded after the requests already sent to it.
        """
        async with self.lock:
            versions = self.registry.models.get(name)
            failed = self.registry.failed.pop(name, None)
            if versions is None:
                return failed is not None
            if version is not None:
                model = versions.get(version)
                if model is None:
                    return False
                gone = [model]
                remaining = {v: m for v, m in versions.items() if v != version}
            else:
                gone = list(versions.values())
                remaining = {}
            if remaining:
                self.registry.models[name] = remaining
            else:
                del self.registry.models[name]
                self.registry.required.discard(name)
                self.registry.unloaded.add(name)
            for model in gone:
                await self._unload_version(model)
            log.info("model '%s'%s unloaded", name, f" version {version}" if version else "")
            return True

    async def _reloaded(self, worker: WorkerHandle) -> None:
        log.info("worker %d holds %d model versions again", worker.worker_id, len(worker.models))
