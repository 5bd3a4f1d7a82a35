"""Worker endpoints (amdinfer semantics): create, grow, shrink and describe them.

An endpoint is registered in the ``ModelRegistry`` like a repository model, so metadata,
ready and infer work on it unchanged. An ``echo`` endpoint has no session: the data plane
answers it in the front by copying inputs to outputs (``dataplane._echo``). An
``onnxruntime`` endpoint has one session per instance, each on a different worker process
of its device; workers this module starts are "dedicated" and stopped with their last
session.

No lock is held while a worker starts or a session loads: names are taken in a step without
``await`` (atomic on the event loop), changes to one endpoint's instances take that
endpoint's lock, and each load runs under ``--load-timeout`` (``load_limits``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

from hardware import CPU_DEVICE, Inventory, InventoryError, cuda_provider_options, resolve_device
from oipserve.errors import InvalidInput, NotFound, ServerError, Unavailable
from oipserve.management.endpoint_naming import EndpointNames, ParamKey
from oipserve.management.load_limits import LoadLimits, check_instances, check_numbers
from oipserve.management.worker_params import (
    LoadRequest,
    cuda_settings,
    optional_str,
    positive_int,
)
from oipserve.model_manager import ModelManager
from oipserve.models import ModelRegistry, ModelVersion, merge_metadata
from oipserve.pool import WorkerPool
from oipserve.repository import read_model
from oipserve.worker_handle import WorkerHandle

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
        #: Serialises adding and removing this endpoint's instances (two at once could
        #: pick the same worker); held only by the changes of this one endpoint.
        self.lock = asyncio.Lock()

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
        limits: LoadLimits,
        name_taken: Callable[[str], bool],
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
        self.limits = limits
        #: True for names repository models hold or are being loaded under.
        self.name_taken = name_taken
        #: Endpoints being created, by the name they took: resolves to it, or fails.
        self.loading: dict[str, asyncio.Future[str]] = {}
        #: Session loads under way per worker id, so concurrent loads spread out.
        self.busy: Counter[int] = Counter()
        #: Unloads sent to workers after an abandoned load; nobody waits for them.
        self.background: set[asyncio.Task[None]] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.endpoints or name in self.loading

    async def load(self, request: LoadRequest) -> str:
        """Create or reuse an endpoint; returns its name once it can infer.

        Nothing is locked while processes start or sessions load: the name is taken (and
        every number checked) in one step without an ``await``, which the event loop makes
        atomic, and a second load of the same parameters waits for the first one's outcome.
        The creation runs under ``--load-timeout``; past it, everything it made is undone.
        """
        worker = request.worker
        existing = self.names.find(worker, request.key)
        if existing is not None:
            loading = self.loading.get(existing)
            if loading is not None:
                try:
                    await asyncio.shield(loading)  # the same outcome, error included
                except asyncio.CancelledError:
                    if not loading.cancelled():
                        raise  # this request was cancelled, not the load it waited for
            endpoint = self.endpoints.get(existing)
            if endpoint is None:  # unloaded while we waited: load it afresh
                return await self.load(request)
            if not request.share:
                await self._grow(endpoint)
            return existing
        name = self.names.next_name(worker)
        if self.name_taken(name):
            raise InvalidInput(f"endpoint name '{name}' is already used by a model")
        endpoint = Endpoint(name, worker, worker, dict(request.params), request.key)
        create = self._plan_echo(endpoint) if endpoint.kind == "echo" else self._plan_onnx(endpoint)
        # From here until the endpoint is registered or given up, the name is ours.
        self.names.add(worker, request.key)
        outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        outcome.add_done_callback(_consume)
        self.loading[name] = outcome
        try:
            try:
                async with asyncio.timeout(self.limits.load_timeout):
                    await create()
            except TimeoutError:
                raise Unavailable(
                    f"loading endpoint '{name}' took more than --load-timeout "
                    f"{self.limits.load_timeout:g}s; it was stopped and nothing of it is left"
                ) from None
        except BaseException as exc:
            self.names.release(worker, name)
            if isinstance(exc, Exception):
                outcome.set_exception(exc)
            else:
                outcome.cancel()
            raise
        finally:
            del self.loading[name]
        self.endpoints[name] = endpoint
        assert endpoint.model is not None
        self.registry.models[name] = {endpoint.model.version: endpoint.model}
        self.registry.unloaded.discard(name)
        outcome.set_result(name)
        log.info("endpoint '%s' loaded (%s, %s)", name, endpoint.kind, endpoint.params)
        return name

    async def _grow(self, endpoint: Endpoint) -> None:
        """One more instance (``share: false``), checked first, under ``--load-timeout``."""
        inventory = None if endpoint.kind == "echo" else self.inventory()
        check_instances(endpoint.instances + 1, endpoint.device, inventory, self.limits)
        async with endpoint.lock:
            if endpoint.kind == "echo":
                endpoint.echo_instances += 1
                return
            try:
                async with asyncio.timeout(self.limits.load_timeout):
                    await self._place_instance(endpoint)
            except TimeoutError:
                raise Unavailable(
                    f"adding an instance to endpoint '{endpoint.name}' took more than "
                    f"--load-timeout {self.limits.load_timeout:g}s; it was stopped"
                ) from None

    def _plan_echo(self, endpoint: Endpoint) -> Callable[[], Awaitable[None]]:
        """Check an echo endpoint's parameters; the function returned makes it (no process)."""
        instances = positive_int(endpoint.params, "instances", 1)
        assert instances is not None
        check_instances(instances, CPU_DEVICE, None, self.limits)
        model = ModelVersion(endpoint.name, "1", "", None)
        model.echo = True
        model.platform = "echo"
        endpoint.model = model

        async def create() -> None:
            model.state = "READY"
            endpoint.echo_instances = instances

        return create

    def _plan_onnx(self, endpoint: Endpoint) -> Callable[[], Awaitable[None]]:
        """Check every parameter against the node and the limits; the function returned
        creates the endpoint.

        Everything that can be refused is refused here, before any process starts.
        """
        params = endpoint.params
        spec = optional_str(params, "model")
        if not spec:
            raise InvalidInput("No model specified: worker 'onnxruntime' needs a 'model' parameter")
        version = optional_str(params, "version")
        instances = positive_int(params, "instances", 1)
        assert instances is not None
        batch_size = positive_int(params, "batch_size", None)
        endpoint.threads = positive_int(params, "intra_op_threads", None)
        positive_int(params, "inter_op_threads", None)
        device_spec = optional_str(params, "device") or "auto"
        settings = cuda_settings(params)
        try:
            options = cuda_provider_options(0, settings)  # validate even when placed on the CPU
        except InventoryError as exc:
            raise InvalidInput(str(exc)) from None
        # Outside the try: an unreadable inventory is the server's problem (503), not a 400.
        inventory = self.inventory()
        try:
            endpoint.device = resolve_device(inventory, device_spec)
        except InventoryError as exc:
            raise InvalidInput(str(exc)) from None
        check_instances(instances, endpoint.device, inventory, self.limits)
        check_numbers(params, endpoint.device, inventory, options, self.limits)
        path, config, version = self._model_file(spec, version)
        model = ModelVersion(endpoint.name, version, path, config)
        model.key = f"{endpoint.name}/{version}#{id(model)}"
        model.cuda_settings = settings
        endpoint.model = model
        return functools.partial(self._create_onnx, endpoint, instances, batch_size)

    async def _create_onnx(
        self, endpoint: Endpoint, instances: int, batch_size: int | None
    ) -> None:
        model = endpoint.model
        assert model is not None
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
        self.busy[worker.worker_id] += 1
        try:
            loaded = await self.manager.place(model, worker, endpoint.threads)
            if not model.inputs and not model.outputs:
                try:
                    inputs, outputs = merge_metadata(model.config, loaded)  # type: ignore[arg-type]
                except ValueError as exc:
                    raise InvalidInput(str(exc)) from None
                model.set_metadata(inputs, outputs)
        except BaseException:
            await self._abandon(model, worker)
            raise
        finally:
            self.busy[worker.worker_id] -= 1
            if not self.busy[worker.worker_id]:
                del self.busy[worker.worker_id]
        model.workers.append(worker)

    async def _abandon(self, model: ModelVersion, worker: WorkerHandle) -> None:
        """Undo a session load that failed or ran out of time, without waiting for it.

        The worker may still be busy creating the session (a timeout). A dedicated worker
        with nothing else on it is killed at once; any other worker is sent an unload that
        it handles once the load it is busy with is over.
        """
        model.placements.pop(worker.worker_id, None)
        others = [key for key in worker.models if key != model.key]
        if worker.dedicated and not others:
            worker.models.pop(model.key, None)
            await self.pool.remove_worker(worker, 0)  # 0: kill, do not wait for the load
            log.info("stopped worker %d: the load it was started for failed", worker.worker_id)
            return
        worker.models.pop(model.key, None)
        if worker.alive:
            task = asyncio.get_running_loop().create_task(_unload_quietly(worker, model.key))
            self.background.add(task)
            task.add_done_callback(self.background.discard)

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
            # Loads under way count: a worker busy with a slow load is chosen last.
            return min(
                candidates,
                key=lambda w: (len(w.models) + self.busy[w.worker_id], w.worker_id),
            )
        if threads is None:
            threads = 1
            if device == CPU_DEVICE:
                threads = max(1, (psutil.cpu_count() or 1) // 2)
        worker = await self._start_worker(device, threads)
        for listener in self.death_listeners:
            worker.add_death_listener(listener)
        log.info("started worker %d on %s for endpoints", worker.worker_id, device)
        return worker

    async def _start_worker(self, device: str, threads: int) -> WorkerHandle:
        """A new dedicated worker; if this load is given up while it starts, it is stopped.

        The start runs as its own task: cancelling it half-way would leave a process the
        pool treats as crashed (and restarts). So a load that times out here answers at
        once, and the worker is stopped as soon as its start is over.
        """
        start = asyncio.get_running_loop().create_task(
            self.pool.add_worker(device, threads, dedicated=True)
        )
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            start.add_done_callback(self._stop_unwanted)
            raise

    def _stop_unwanted(self, start: asyncio.Task[WorkerHandle]) -> None:
        """Stop a worker whose load was given up while it started (see ``_start_worker``)."""
        if start.cancelled() or start.exception() is not None:
            return  # add_worker cleaned up after itself
        worker = start.result()
        task = asyncio.get_running_loop().create_task(self.pool.remove_worker(worker, 0))
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        log.info("stopping worker %d: the load it was started for was given up", worker.worker_id)

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

    async def unload_instance(self, name: str) -> bool:
        """Remove one instance of endpoint ``name``; False if there is no such endpoint."""
        endpoint = self.endpoints.get(name)
        if endpoint is None:
            return False
        async with endpoint.lock:
            return await self._unload_instance(name, endpoint)

    async def _unload_instance(self, name: str, endpoint: Endpoint) -> bool:
        if self.endpoints.get(name) is not endpoint:
            return True  # a concurrent unload removed the last instance meanwhile
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


def _consume(outcome: asyncio.Future[str]) -> None:
    """Mark a load's outcome as seen: a failure nobody else awaited is not an error to log."""
    if not outcome.cancelled():
        outcome.exception()


async def _unload_quietly(worker: WorkerHandle, key: str) -> None:
    """Unload ``key`` from ``worker``; a worker that died meanwhile has nothing to unload."""
    try:
        await worker.unload(key)
    except ServerError:
        pass
