"""Management plane: hardware queries, worker endpoints (AMD semantics), model repository.

Framework-free: ``rest_admin`` turns HTTP into calls here, and errors are
``oipserve.errors`` classes. Every call that changes what is loaded holds one
lock, so management is serialised (as in amdinfer's manager thread) while
inference on everything else goes on.

Worker endpoints are registered in the ``ModelRegistry`` like repository
models, so metadata, ready and infer work on them unchanged. An ``echo``
endpoint has no session: the data plane answers it in the front by copying
inputs to outputs (``dataplane._echo``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

import psutil

from hardware import (
    CPU_DEVICE,
    InventoryError,
    InventorySource,
    count_matching,
    cuda_provider_options,
    resolve_device,
    to_json,
)
from oipserve.errors import InvalidInput, NotFound, Unsupported
from oipserve.models import ModelManager, ModelRegistry, ModelVersion, merge_metadata
from oipserve.pool import WorkerHandle, WorkerPool
from oipserve.repository import RepositoryError, list_models, read_model

log = logging.getLogger("oipserve.management")

Scalar = bool | int | float | str
#: Typed parameter set: (name, type tag, value) triples; see ``param_key``.
ParamKey = frozenset[tuple[str, str, Scalar]]

KINDS = ("echo", "onnxruntime")
#: Worker-load parameters that become CUDA provider options.
CUDA_KEYS = (
    "gpu_mem_limit",
    "arena_extend_strategy",
    "cudnn_conv_algo_search",
    "do_copy_in_default_stream",
)
_INT32_MAX = 2**31 - 1


def param_key(worker: str, params: Mapping[str, object]) -> ParamKey:
    """The typed key that decides endpoint identity (amdinfer's rules).

    ``share`` is left out; ``worker`` is added. Non-negative integers are int32,
    negative or fractional numbers (and larger integers) are doubles, so
    ``1`` != ``1.0`` != ``true``; arrays, objects and null are a 400.
    """
    items: list[tuple[str, str, Scalar]] = [("worker", "string", worker)]
    for name, value in params.items():
        if name == "share":
            continue
        if name == "worker":
            raise InvalidInput("parameter 'worker' is set by the server and cannot be given")
        if isinstance(value, bool):
            items.append((name, "bool", value))
        elif isinstance(value, int) and 0 <= value <= _INT32_MAX:
            items.append((name, "int32", value))
        elif isinstance(value, int | float):
            items.append((name, "double", float(value)))
        elif isinstance(value, str):
            items.append((name, "string", value))
        else:
            kind = "null" if value is None else type(value).__name__
            raise InvalidInput(
                f"parameter '{name}' is {kind}; worker parameters must be strings, numbers "
                "or booleans"
            )
    return frozenset(items)


class EndpointNames:
    """amdinfer's endpoint naming for each worker name W.

    The first parameter set gets ``W``, later distinct sets ``W-0``, ``W-1``, ...
    from a counter that only grows; the table and counter are cleared only when
    every endpoint of W is gone.
    """

    def __init__(self) -> None:
        self._tables: dict[str, dict[ParamKey, str]] = {}
        self._counters: dict[str, int] = {}

    def find(self, worker: str, key: ParamKey) -> str | None:
        return self._tables.get(worker, {}).get(key)

    def next_name(self, worker: str) -> str:
        """The name the next new parameter set of ``worker`` would get (nothing changes)."""
        if not self._tables.get(worker):
            return worker
        return f"{worker}-{self._counters.get(worker, 0)}"

    def add(self, worker: str, key: ParamKey) -> str:
        name = self.next_name(worker)
        table = self._tables.setdefault(worker, {})
        if table:
            self._counters[worker] = self._counters.get(worker, 0) + 1
        else:
            self._counters[worker] = 0
        table[key] = name
        return name

    def remove(self, worker: str, endpoint: str) -> None:
        table = self._tables.get(worker, {})
        for key, name in list(table.items()):
            if name == endpoint:
                del table[key]
        if not table:
            self._tables.pop(worker, None)
            self._counters.pop(worker, None)


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


def _int(params: Mapping[str, object], name: str, default: int | None) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"parameter '{name}' must be a positive integer; got {value!r}")
    return value


def _str(params: Mapping[str, object], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidInput(f"parameter '{name}' must be a string; got {value!r}")
    return str(value)


class Management:
    """Hardware, worker endpoints and the model repository, behind one lock."""

    def __init__(
        self,
        root: Path,
        source: InventorySource,
        pool: WorkerPool,
        registry: ModelRegistry,
        manager: ModelManager,
        on_new_worker: list[object] | None = None,
        stop_timeout: float = 30.0,
    ) -> None:
        self.root = root
        self.source = source
        self.pool = pool
        self.registry = registry
        self.manager = manager
        self.lock = asyncio.Lock()
        self.names = EndpointNames()
        self.endpoints: dict[str, Endpoint] = {}
        #: Death listeners given to every worker this module starts (the data plane's).
        self.death_listeners = list(on_new_worker or [])
        self.stop_timeout = stop_timeout

    def _inventory(self):  # noqa: ANN202 - hardware.Inventory
        try:
            return self.source.read()
        except InventoryError as exc:
            raise Unsupported(f"the hardware inventory cannot be read: {exc}") from None

    # ---- hardware -----------------------------------------------------------

    def has_hardware(self, name: str, num: int) -> bool:
        """True if at least ``num`` units named ``name`` exist (inventory read afresh)."""
        return count_matching(self._inventory(), name) >= num

    def hardware(self) -> dict[str, object]:
        """The inventory, with each device's workers, sessions and memory in use."""
        doc = to_json(self._inventory())
        devices: dict[str, dict[str, object]] = doc["devices"]
        for worker in self.pool.workers:
            devices.setdefault(worker.device, {"id": worker.device, "kind": "unknown"})
        for device_id, device in devices.items():
            workers = [w for w in self.pool.workers if w.device == device_id]
            instances = []
            for model in self._all_models():
                for worker in model.workers:
                    if worker.device == device_id and model.key in worker.models:
                        placement = model.placements.get(worker.worker_id, {})
                        instances.append(
                            {"model": model.name, "version": model.version, **placement}
                        )
            device["workers"] = [
                {
                    "id": w.worker_id,
                    "pid": w.pid,
                    "alive": w.alive,
                    "dedicated": w.dedicated,
                    "threads": w.threads,
                    "sessions": len(w.models),
                }
                for w in workers
            ]
            device["models"] = sorted({i["model"] for i in instances})
            device["instances"] = instances
            device["memory_in_use"] = sum(_rss(w.pid) for w in workers if w.alive)
        doc["simulated"] = self.manager.simulate_devices
        return doc

    def _all_models(self) -> list[ModelVersion]:
        return [m for versions in self.registry.models.values() for m in versions.values()]

    # ---- worker endpoints ---------------------------------------------------

    async def worker_load(self, worker: str, params: dict[str, object]) -> str:
        """Create or reuse an endpoint; returns its name once it can infer."""
        worker = worker.lower()
        kind = worker
        if kind not in KINDS:
            raise InvalidInput(f"unknown worker '{worker}' (known workers: {', '.join(KINDS)})")
        key = param_key(worker, params)
        share = params.get("share", True)
        if not isinstance(share, bool):
            raise InvalidInput(f"parameter 'share' must be true or false; got {share!r}")
        async with self.lock:
            existing = self.names.find(worker, key)
            if existing is not None:
                if not share:
                    await self._add_instance(self.endpoints[existing])
                return existing
            name = self.names.next_name(worker)
            if name in self.registry.models:
                raise InvalidInput(f"endpoint name '{name}' is already used by a model")
            endpoint = Endpoint(name, worker, kind, dict(params), key)
            if kind == "echo":
                await self._create_echo(endpoint)
            else:
                await self._create_onnx(endpoint)
            self.names.add(worker, key)
            self.endpoints[name] = endpoint
            self.registry.unloaded.discard(name)
            log.info("endpoint '%s' loaded (%s, %s)", name, kind, endpoint.params)
            return name

    async def _create_echo(self, endpoint: Endpoint) -> None:
        instances = _int(endpoint.params, "instances", 1)
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
        spec = _str(params, "model")
        if not spec:
            raise InvalidInput("No model specified: worker 'onnxruntime' needs a 'model' parameter")
        version = _str(params, "version")
        instances = _int(params, "instances", 1)
        batch_size = _int(params, "batch_size", None)
        endpoint.threads = _int(params, "intra_op_threads", None)
        device_spec = _str(params, "device") or "auto"
        cuda_settings = {}
        for name in CUDA_KEYS:
            if name in params:
                value = params[name]
                cuda_settings[name] = (
                    ("1" if value else "0") if isinstance(value, bool) else str(value)
                )
        try:
            cuda_provider_options(0, cuda_settings)  # validate even when placed on the CPU
            endpoint.device = resolve_device(self._inventory(), device_spec)
        except InventoryError as exc:
            raise InvalidInput(str(exc)) from None
        path, config, version = self._model_file(spec, version)
        model = ModelVersion(endpoint.name, version, path, config)
        model.key = f"{endpoint.name}/{version}#{id(model)}"
        model.cuda_settings = cuda_settings
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
            worker.add_death_listener(listener)  # type: ignore[arg-type]
        log.info("started worker %d on %s for endpoints", worker.worker_id, device)
        return worker

    async def _rollback(self, model: ModelVersion) -> None:
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

    async def worker_unload(self, name: str) -> None:
        """Remove one instance of an endpoint; unknown names are a no-op."""
        async with self.lock:
            await self._unload_instance(name.lower())

    async def _unload_instance(self, name: str) -> bool:
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

    def endpoint_info(self, name: str) -> dict[str, object]:
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

    # ---- model repository ---------------------------------------------------

    def _repository_names(self) -> list[str]:
        try:
            return list_models(self.root)
        except RepositoryError as exc:
            raise Unsupported(str(exc)) from None

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model in the directory, loaded or not, one entry per version."""
        entries = []
        for name in self._repository_names():
            versions = self.registry.models.get(name)
            if versions and name not in self.endpoints:
                for model in versions.values():
                    state, reason = model.state, model.reason
                    if state == "READY" and not model.ready:
                        state, reason = "UNAVAILABLE", "no running instance (worker restarting)"
                    entries.append(
                        {"name": name, "version": model.version, "state": state, "reason": reason}
                    )
                continue
            reason = self.registry.failed.get(name)
            if reason is None:
                reason = "unloaded" if name in self.registry.unloaded else "not loaded"
            source = read_model(self.root, name)
            for version in list(source.versions) or [""]:
                entries.append(
                    {"name": name, "version": version, "state": "UNAVAILABLE", "reason": reason}
                )
        if ready_only:
            entries = [e for e in entries if e["state"] == "READY"]
        return entries

    async def repository_load(
        self, name: str, version: str | None, parameters: Mapping[str, object]
    ) -> None:
        """(Re)load a model from the directory, read afresh; 404 if absent, 400 if broken."""
        for key in parameters:
            if key == "config" or key.startswith("file:"):
                raise Unsupported(f"load parameter '{key}' is not supported by this server")
        if name in self.endpoints:
            raise InvalidInput(f"'{name}' is a worker endpoint; load it with /v2/workers")
        async with self.lock:
            if name not in self._repository_names():
                raise NotFound(f"model '{name}' is not in the model repository")
            await self.manager.load(name)
            reason = self.registry.failed.get(name)
            if reason is not None:
                raise InvalidInput(f"failed to load '{name}': {reason}")
            versions = self.registry.models.get(name, {})
            if version is not None and version not in versions:
                raise NotFound(
                    f"model '{name}' has no version '{version}' (versions: {', '.join(versions)})"
                )
            chosen = [versions[version]] if version is not None else list(versions.values())
            broken = [m for m in chosen if m.state != "READY"]
            if broken or not chosen:
                reasons = "; ".join(f"version {m.version}: {m.reason}" for m in broken)
                raise InvalidInput(f"failed to load '{name}': {reasons or 'no versions'}")

    async def repository_unload(self, name: str, version: str | None) -> None:
        """Unload a model (or one version), or one instance of an endpoint; no-op if unknown."""
        async with self.lock:
            if await self._unload_instance(name):
                return
            await self.manager.unload(name, version)

    def served(self) -> list[str]:
        """Names of everything that can infer now (models and endpoints)."""
        return sorted(
            name
            for name, versions in self.registry.models.items()
            if any(v.ready for v in versions.values())
        )


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.Error, OSError):
        return 0


def startup_models(mode: str, load_model: tuple[str, ...], root: Path) -> list[str]:
    """Models to load at start: all in mode "none", the --load-model ones in "explicit"."""
    names = list_models(root)
    if mode == "none" or "*" in load_model:
        return names
    missing = [n for n in load_model if n not in names]
    if missing:
        raise RepositoryError(
            f"--load-model names {', '.join(missing)}, not in the model repository {root}"
        )
    return list(dict.fromkeys(load_model))
