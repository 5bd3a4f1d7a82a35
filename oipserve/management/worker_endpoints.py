"""Worker endpoints (amdinfer semantics): the table of them; create, grow, shrink, describe.

An endpoint is registered in the ``ModelRegistry`` like a repository model, so metadata,
ready and infer work on it unchanged. An ``echo`` endpoint has no session: the data plane
answers it in the front by copying inputs to outputs (``dataplane.strategies.answer_in_front``). An
``onnxruntime`` endpoint has one session per instance, each on a different worker process
of its device (``endpoint_sessions``, which starts and stops the dedicated workers).

A new endpoint is checked in full first (``endpoint_plan``), then created. No lock is held
while a worker starts or a session loads: names are taken in a step without ``await``
(atomic on the event loop), changes to one endpoint's instances take that endpoint's lock,
and each load runs under ``--load-timeout`` (``load_limits``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from hardware import CPU_DEVICE, Inventory
from oipserve.errors import InternalError, InvalidInput, NotFound, Unavailable
from oipserve.management.endpoint_naming import EndpointNames, ParamKey
from oipserve.management.endpoint_plan import EndpointPlan, plan_echo, plan_onnx
from oipserve.management.endpoint_sessions import DeathListener, EndpointSessions
from oipserve.management.load_limits import LoadLimits, check_instances
from oipserve.management.worker_params import LoadRequest
from oipserve.models.manager import ModelManager
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.handle import own_handle
from oipserve.pool.worker_pool import WorkerPool

log = logging.getLogger("oipserve.management")


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

    @property
    def served(self) -> ModelVersion:
        """Its model: every endpoint has one from its plan on (``WorkerEndpoints._plan``),
        before it is registered."""
        if self.model is None:
            raise InternalError(f"endpoint '{self.name}' has no model")
        return self.model


class WorkerEndpoints:
    """Every worker endpoint, by name; its sessions are placed by ``EndpointSessions``."""

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
        self.registry = registry
        #: Reads the inventory afresh (placement needs current free memory).
        self.inventory = inventory
        self.names = EndpointNames()
        self.endpoints: dict[str, Endpoint] = {}
        #: The sessions of onnxruntime endpoints, and the workers started for them.
        self.sessions = EndpointSessions(
            pool, manager, death_listeners, stop_timeout, lambda: inventory().cpu.usable_cores
        )
        self.limits = limits
        #: True for names repository models hold or are being loaded under.
        self.name_taken = name_taken
        #: Endpoints being created, by the name they took: resolves to it, or fails.
        self.loading: dict[str, asyncio.Future[str]] = {}

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
        plan = self._plan(endpoint)
        # From here until the endpoint is registered or given up, the name is ours.
        self.names.add(worker, request.key)
        outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        outcome.add_done_callback(_consume)
        self.loading[name] = outcome
        try:
            try:
                async with asyncio.timeout(self.limits.load_timeout):
                    await self._create(endpoint, plan)
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
        self.registry.models[name] = {plan.model.version: plan.model}
        self.registry.changes += 1
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
            model = endpoint.served
            try:
                async with asyncio.timeout(self.limits.load_timeout):
                    await self.sessions.place(model, endpoint.device, endpoint.threads)
            except TimeoutError:
                raise Unavailable(
                    f"adding an instance to endpoint '{endpoint.name}' took more than "
                    f"--load-timeout {self.limits.load_timeout:g}s; it was stopped"
                ) from None

    def _plan(self, endpoint: Endpoint) -> EndpointPlan:
        """Check a new endpoint in full (``endpoint_plan``) and give it its model."""
        if endpoint.kind == "echo":
            plan = plan_echo(endpoint.name, endpoint.params, self.limits)
        else:
            plan = plan_onnx(endpoint.name, endpoint.params, self.inventory, self.limits, self.root)
        endpoint.model = plan.model
        endpoint.device = plan.device
        endpoint.threads = plan.threads
        return plan

    async def _create(self, endpoint: Endpoint, plan: EndpointPlan) -> None:
        """Make a checked endpoint ready: its instances, then its batch size and state."""
        model = plan.model
        if endpoint.kind == "echo":
            model.state = "READY"
            endpoint.echo_instances = plan.instances
            return
        await self.sessions.place_all(model, plan.device, plan.threads, plan.instances)
        if (
            plan.batch_size is not None
            and model.inputs
            and all(t.shape and t.shape[0] == -1 for t in model.inputs)
        ):
            model.max_batch_size = plan.batch_size
        model.state = "READY"

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
        model = endpoint.served
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
            await self.sessions.drop(model, own_handle(model.workers[-1]))
        if last:
            model.state = "UNAVAILABLE"
            log.info("endpoint '%s' unloaded", name)
        return True

    def info(self, name: str) -> dict[str, object]:
        """Debug view of one endpoint (``GET /v2/workers/{name}``); 404 if unknown."""
        endpoint = self.endpoints.get(name) or self.endpoints.get(name.lower())
        if endpoint is None:
            raise NotFound(f"unknown worker endpoint '{name}'")
        model = endpoint.served
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
