"""``Management``: the one object the management routes (REST and gRPC) talk to.

A thin facade over three jobs, each in its own module: the hardware view
(``hardware_view``), worker endpoints (``worker_endpoints``, which checks new ones with
``endpoint_plan`` and places their sessions with ``endpoint_sessions``) and repository
control (``repository_control``). It settles the one place where the jobs meet: worker
endpoints and repository models share one namespace.

There is no lock over management: a load that starts a process or creates a session
must not make every other load (or unload) wait behind it (one slow load once held all
others for 46 s). The namespace is kept whole without one: each side claims a name in a
step without ``await`` (atomic on the event loop) and checks the other side's claims,
including loads still under way. Repository loads are serialised by ``ModelManager``
itself; worker-endpoint loads run concurrently. Every load, of either kind, runs under
``--load-timeout``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from hardware import InventorySource
from oipserve.errors import InvalidInput, Unavailable
from oipserve.management.endpoint_sessions import DeathListener
from oipserve.management.hardware_view import HardwareView
from oipserve.management.load_limits import LoadLimits
from oipserve.management.load_override import parse_load_parameters, unload_dependents
from oipserve.management.repository_control import RepositoryControl, check_repository_name
from oipserve.management.worker_endpoints import WorkerEndpoints
from oipserve.management.worker_params import parse_load_request
from oipserve.models.manager import ModelManager
from oipserve.models.registry import ModelRegistry
from oipserve.pool.worker_pool import WorkerPool


class Management:
    """Hardware, worker endpoints and the model repository, in one namespace."""

    def __init__(
        self,
        root: Path,
        source: InventorySource,
        pool: WorkerPool,
        registry: ModelRegistry,
        manager: ModelManager,
        on_new_worker: list[DeathListener] | None = None,
        stop_timeout: float = 30.0,
        limits: LoadLimits | None = None,
    ) -> None:
        self.limits = limits or LoadLimits()
        #: Repository models being (re)loaded now: their names are taken for endpoints.
        self.repository_loading: Counter[str] = Counter()
        self.hardware_view = HardwareView(
            source, pool, registry, manager.placement.simulate_devices
        )
        self.endpoints = WorkerEndpoints(
            root,
            pool,
            registry,
            manager,
            self.hardware_view.inventory,
            list(on_new_worker or []),
            stop_timeout,
            self.limits,
            lambda name: name in registry.models or name in self.repository_loading,
        )
        self.repository = RepositoryControl(
            root, registry, manager, lambda name: name in self.endpoints
        )

    # ---- hardware -----------------------------------------------------------

    def has_hardware(self, name: str, num: int) -> bool:
        """True if at least ``num`` units named ``name`` exist; 503 if inventory unreadable."""
        return self.hardware_view.has_hardware(name, num)

    def hardware(self) -> dict[str, object]:
        """``GET /v2/hardware``: devices with their workers, models and memory in use."""
        return self.hardware_view.describe()

    # ---- worker endpoints ---------------------------------------------------

    async def worker_load(self, worker: str, params: dict[str, object]) -> str:
        """Create or reuse an endpoint; returns its name once it can infer."""
        return await self.endpoints.load(parse_load_request(worker, params))

    async def worker_unload(self, name: str) -> None:
        """Remove one instance of an endpoint; unknown names are a no-op."""
        await self.endpoints.unload_instance(name.lower())

    def endpoint_info(self, name: str) -> dict[str, object]:
        """``GET /v2/workers/{name}``: parameters, device, instances, placements."""
        return self.endpoints.info(name)

    # ---- model repository ---------------------------------------------------

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model in the directory, loaded or not, one entry per version."""
        return self.repository.index(ready_only)

    async def repository_load(
        self,
        name: str,
        version: str | None,
        parameters: Mapping[str, object],
        files_in_base64: bool = True,
    ) -> None:
        """(Re)load a model; 400 ``failed to load '<name>': <reason>``, 503 past the timeout.

        ``parameters`` may carry ``config`` and ``file:`` overrides (file contents base64
        over HTTP, bytes over gRPC: ``files_in_base64``).
        """
        self._check_repository_control()
        override = parse_load_parameters(
            name, parameters, files_in_base64, self.limits.max_upload_files
        )
        if name in self.endpoints:
            raise InvalidInput(f"'{name}' is a worker endpoint; load it with /v2/workers")
        self.repository_loading[name] += 1
        try:
            await self.repository.load(name, version, override, self.limits.load_timeout)
        finally:
            self.repository_loading[name] -= 1
            if not self.repository_loading[name]:
                del self.repository_loading[name]

    @staticmethod
    def check_repository_name(name: str) -> None:
        """Refuse a repository request that names a repository (``repository_control``)."""
        check_repository_name(name)

    async def repository_unload(
        self, name: str, version: str | None, parameters: Mapping[str, object]
    ) -> None:
        """Unload a model (or one version), or one instance of an endpoint; no-op if unknown.

        ``parameters`` may carry ``unload_dependents`` (``load_override.unload_dependents``).
        """
        self._check_repository_control()
        dependents = unload_dependents(parameters)
        if await self.endpoints.unload_instance(name):
            return
        await self.repository.unload(name, version, dependents)

    def served(self) -> list[str]:
        """Names of everything that can infer now (models and endpoints)."""
        return self.repository.served()

    def _check_repository_control(self) -> None:
        """503 for a repository load or unload unless ``--model-control-mode explicit``.

        Triton's words and status (UNAVAILABLE), which clients and Triton's tests match;
        mode none is how operators lock a server's models (mode poll is refused at start).
        Worker endpoints (``/v2/workers``) are ours, not Triton's: not locked.
        """
        if not self.limits.repository_control:
            raise Unavailable(REPOSITORY_LOCKED)


#: Triton's refusal of a repository load / unload outside explicit mode (its text says
#: "polling" for mode none too), then ours.
REPOSITORY_LOCKED = (
    "explicit model load / unload is not allowed if polling is enabled: the server runs "
    "with --model-control-mode none, so its models are fixed at start (use "
    "--model-control-mode explicit to load and unload through the repository API)"
)
