"""Worker endpoints (amdinfer semantics): create, grow, shrink and describe them.

An endpoint is registered in the ``ModelRegistry`` like a repository model, so metadata,
ready and infer work on it unchanged. An ``echo`` endpoint has no session: the data plane
answers it in the front by copying inputs to outputs (``dataplane._echo``). An
``onnxruntime`` endpoint has one session per instance, each on a different worker process
of its device; workers this module starts are "dedicated" and stopped with their last
session.

Methods that change state expect the caller (``Management``) to hold the management lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import psutil

from hardware import CPU_DEVICE, Inventory, InventoryError, cuda_provider_options, resolve_device
from oipserve.errors import InvalidInput, NotFound
from oipserve.management.endpoint_naming import EndpointNames, ParamKey
from oipserve.management.worker_params import (
    LoadRequest,
    cuda_settings,
    optional_str,
    positive_int,
)
from oipserve.models import ModelManager, ModelRegistry, ModelVersion, merge_metadata
from oipserve.pool import WorkerHandle, WorkerPool
from oipserve.repository import read_model

log = logging.getLogger("oipserve.management")

#: Called with a worker that died; the data plane's ``worker_gone``.
DeathListener = Callable[[WorkerHandle], None]


class Endpoint:
    """One worker endpoint: its parameters and the served model behind it."""

    def __init__(
        self, name: str, worker: str, kind: str, params: dict[str, object], key: ParamKey
    ) -> None:
        self.name = name
        self.worker = worker
        self.kind = kind
        self.params = params
        self.key = key
        self.model: ModelVersion | None = None
        self.threads: int | None = None
        self.device = CPU_DEVICE
        #: Echo endpoints have no sessions; this counts their instances.
        self.echo_instances = 0

    @property
    def instances(self) -> int:
        if self.kind == "echo":
            return self.echo_instances
        return len(self.model.workers) if self.model is not None else 0


class WorkerEndpoints:
    """Every worker endpoint, by name, and the worker processes started for them."""

    def __init__(
        self,
        root: Path,
        pool: WorkerPool,
        registry: ModelRegistry,
        manager: ModelManager,
        inventory: Callable[[], Inventory],
        death_listeners: list[DeathListener],
        stop_timeout: float,
    ) -> None:
        self.root = root
        self.pool = pool
        self.registry = registry
        self.manager = manager
        #: Reads the inventory afresh (placement needs current free memory).
        self.inventory = inventory
        self.names = EndpointNames()
        self.endpoints: dict[str, Endpoint] = {}
        #: Given to every worker this module starts, so the data plane hears of its death.
        self.death_listeners = death_listeners
        self.stop_timeout = stop_timeout

    def __contains__(self, name: str) -> bool:
        return name in self.endpoints

    async def load(self, request: LoadRequest) -> str:
        """Create or reuse an endpoint; returns its name once it can infer."""
        worker = request.worker
        existing = self.names.find(worker, request.key)
        if existing is not None:
            if not request.share:
                await self._add_instance(self.endpoints[existing])
            return existing
        name = self.names.next_name(worker)
        if name in self.registry.models:
            raise InvalidInput(f"endpoint name '{name}' is already used by a model")
        endpoint = Endpoint(name, worker, worker, dict(request.params), request.key)
        if endpoint.kind == "echo":
            await self._create_echo(endpoint)
        else:
            await self._create_onnx(endpoint)
        self.names.add(worker, request.key)
        self.endpoints[name] = endpoint
        self.registry.unloaded.discard(name)
        log.info("endpoint '%s' loaded (%s, %s)", name, endpoint.kind, endpoint.params)
        return name

    async def _create_echo(self, endpoint: Endpoint) -> None:
        instances = positive_int(endpoint.params, "instances", 1)
        assert instances is not None
        model = ModelVersion(endpoint.name, "1", "", None)
        model.echo = True
        model.platform = "echo"
        model.state = "READY"
        endpoint.model = model
        endpoint.echo_instances = instances
        self.registry.models[endpoint.name] = {"1": model}

    async def _create_onnx(self, endpoint: Endpoint) -> None:
        params = endpoint.params
        spec = optional_str(params, "model")
        if not spec:
            raise InvalidInput("No model specified: worker 'onnxruntime' needs a 'model' parameter")
        version = optional_str(params, "version")
        instances = positive_int(params, "instances", 1)
        batch_size = positive_int(params, "batch_size", None)
        endpoint.threads = positive_int(params, "intra_op_threads", None)
        device_spec = optional_str(params, "device") or "auto"
        settings = cuda_settings(params)
        try:
            cuda_provider_options(0, settings)  # validate even when placed on the CPU
        except InventoryError as exc:
            raise InvalidInput(str(exc)) from None
        # Outside the try: an unreadable inventory is the server's problem (503), not a 400.
        inventory = self.inventory()
        try:
            endpoint.device = resolve_device(inventory, device_spec)
        except InventoryError as exc:
            raise InvalidInput(str(exc)) from None
        path, config, version = self._model_file(spec, version)
        model = ModelVersion(endpoint.name, version, path, config)
        model.key = f"{endpoint.name}/{version}#{id(model)}"
        model.cuda_settings = settings
        endpoint.model = model
        assert instances is not None
        try:
            for _ in range(instances):
                await self._place_instance(endpoint)
        except BaseException:
            await self._rollback(model)
            raise
        if (
            batch_size is not None
            and model.inputs
            and all(t.shape and t.shape[0] == -1 for t in model.inputs)
        ):
            model.max_batch_size = batch_size
        model.state = "READY"
        self.registry.models[endpoint.name] = {version: model}

    def _model_file(self, spec: str, version: str | None) -> tuple[str, object, str]:
        """(path, config, version) for a repository model name or an .onnx path inside it."""
        root = self.root.resolve()
        if spec.endswith(".onnx"):
            path = (root / spec).resolve()
            if not path.is_relative_to(root):
                raise InvalidInput(f"model path '{spec}' is outside the model repository")
            if not path.is_file():
                raise InvalidInput(f"model file '{spec}' not found in the model repository")
            return str(path), None, version or "1"
        if "/" in spec or spec.startswith("."):
            raise InvalidInput(f"model '{spec}' is neither a repository model nor an .onnx path")
        source = read_model(self.root, spec)
        if source.error is not None:
            raise InvalidInput(f"model '{spec}' cannot be loaded: {source.error}")
        if version is None:
            version = max(source.versions, key=int)
        if version not in source.versions:
            raise InvalidInput(
                f"model '{spec}' has no version '{version}' "
                f"(versions: {', '.join(source.versions)})"
            )
        return source.versions[version], source.config, version

    async def _place_instance(self, endpoint: Endpoint) -> None:
        """One more session of the endpoint, on a worker of its device without one."""
        model = endpoint.model
        assert model is not None
        worker = await self._free_worker(endpoint.device, model, endpoint.threads)
        loaded = await self.manager.place(model, worker, endpoint.threads)
        if not model.inputs and not model.outputs:
            try:
                inputs, outputs = merge_metadata(model.config, loaded)  # type: ignore[arg-type]
            except ValueError as exc:
                await worker.unload(model.key)
                raise InvalidInput(str(exc)) from None
            model.set_metadata(inputs, outputs)
        model.workers.append(worker)

    async def _free_worker(
        self, device: str, model: ModelVersion, threads: int | None
    ) -> WorkerHandle:
        """The least busy live worker of ``device`` without this model, or a new dedicated one."""
        candidates = [
            w
            for w in self.pool.workers
            if w.device == device and w.alive and w not in model.workers
        ]
        if candidates:
            return min(candidates, key=lambda w: (len(w.models), w.worker_id))
        if threads is None:
            threads = 1
            if device == CPU_DEVICE:
                threads = max(1, (psutil.cpu_count() or 1) // 2)
        worker = await self.pool.add_worker(device, threads, dedicated=True)
        for listener in self.death_listeners:
            worker.add_death_listener(listener)
        log.info("started worker %d on %s for endpoints", worker.worker_id, device)
        return worker

    async def _rollback(self, model: ModelVersion) -> None:
        """Undo a failed creation: drop the sessions made so far (and their workers)."""
        for worker in list(model.workers):
            await self._drop_session(model, worker)
        model.state = "UNAVAILABLE"
        model.reason = "load failed"

    async def _drop_session(self, model: ModelVersion, worker: WorkerHandle) -> None:
        if worker in model.workers:
            model.workers.remove(worker)
        model.placements.pop(worker.worker_id, None)
        await worker.unload(model.key)
        if worker.dedicated and not worker.models:
            await self.pool.remove_worker(worker, self.stop_timeout)
            log.info("stopped worker %d: no endpoint uses it", worker.worker_id)

    async def _add_instance(self, endpoint: Endpoint) -> None:
        if endpoint.kind == "echo":
            endpoint.echo_instances += 1
            return
        await self._place_instance(endpoint)

    async def unload_instance(self, name: str) -> bool:
        """Remove one instance of endpoint ``name``; False if there is no such endpoint."""
        endpoint = self.endpoints.get(name)
        if endpoint is None:
            return False
        model = endpoint.model
        assert model is not None
        last = endpoint.instances <= 1
        if last:
            # Leave the registry first: later requests get 404, in-flight ones finish.
            del self.endpoints[name]
            self.registry.models.pop(name, None)
            self.registry.unloaded.add(name)
            self.names.remove(endpoint.worker, name)
            model.state = "UNLOADING"
            model.reason = "unloaded"
        if endpoint.kind == "echo":
            endpoint.echo_instances -= 1
        elif model.workers:
            await self._drop_session(model, model.workers[-1])
        if last:
            model.state = "UNAVAILABLE"
            log.info("endpoint '%s' unloaded", name)
        return True

    def info(self, name: str) -> dict[str, object]:
        """Debug view of one endpoint (``GET /v2/workers/{name}``); 404 if unknown."""
        endpoint = self.endpoints.get(name) or self.endpoints.get(name.lower())
        if endpoint is None:
            raise NotFound(f"unknown worker endpoint '{name}'")
        model = endpoint.model
        assert model is not None
        return {
            "name": endpoint.name,
            "worker": endpoint.worker,
            "parameters": endpoint.params,
            "device": endpoint.device if endpoint.kind != "echo" else CPU_DEVICE,
            "instances": endpoint.instances,
            "placements": [model.placements[w.worker_id] for w in model.workers],
        }
