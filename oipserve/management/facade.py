"""``Management``: the one object the management routes (REST and gRPC) talk to.

A thin facade over three jobs, each in its own module: the hardware view
(``hardware_view``), worker endpoints (``worker_endpoints``) and repository control
(``repository_control``). What it adds is the one lock: every call that changes what is
loaded holds it, so management is serialised (as in amdinfer's manager thread) while
inference on everything else goes on. Checks that need no state run before the lock, so a
bad request is answered at once even while a slow load holds it. It also settles the one
place where the jobs meet: worker endpoints and repository models share one namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from hardware import InventorySource
from oipserve.errors import InvalidInput
from oipserve.management.hardware_view import HardwareView
from oipserve.management.repository_control import RepositoryControl, check_load_parameters
from oipserve.management.worker_endpoints import DeathListener, WorkerEndpoints
from oipserve.management.worker_params import parse_load_request
from oipserve.models import ModelManager, ModelRegistry
from oipserve.pool import WorkerPool


class Management:
    """Hardware, worker endpoints and the model repository, behind one lock."""

    def __init__(
        self,
        root: Path,
        source: InventorySource,
        pool: WorkerPool,
        registry: ModelRegistry,
        manager: ModelManager,
        on_new_worker: list[DeathListener] | None = None,
        stop_timeout: float = 30.0,
    ) -> None:
        self.lock = asyncio.Lock()
        self.hardware_view = HardwareView(source, pool, registry, manager.simulate_devices)
        self.endpoints = WorkerEndpoints(
            root,
            pool,
            registry,
            manager,
            self.hardware_view.inventory,
            list(on_new_worker or []),
            stop_timeout,
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
        request = parse_load_request(worker, params)
        async with self.lock:
            return await self.endpoints.load(request)

    async def worker_unload(self, name: str) -> None:
        """Remove one instance of an endpoint; unknown names are a no-op."""
        async with self.lock:
            await self.endpoints.unload_instance(name.lower())

    def endpoint_info(self, name: str) -> dict[str, object]:
        """``GET /v2/workers/{name}``: parameters, device, instances, placements."""
        return self.endpoints.info(name)

    # ---- model repository ---------------------------------------------------

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model in the directory, loaded or not, one entry per version."""
        return self.repository.index(ready_only)

    async def repository_load(
        self, name: str, version: str | None, parameters: Mapping[str, object]
    ) -> None:
        """(Re)load a model from the directory, read afresh; 404 if absent, 400 if broken."""
        check_load_parameters(parameters)
        if name in self.endpoints:
            raise InvalidInput(f"'{name}' is a worker endpoint; load it with /v2/workers")
        async with self.lock:
            await self.repository.load(name, version)

    async def repository_unload(self, name: str, version: str | None) -> None:
        """Unload a model (or one version), or one instance of an endpoint; no-op if unknown."""
        async with self.lock:
            if await self.endpoints.unload_instance(name):
                return
            await self.repository.unload(name, version)

    def served(self) -> list[str]:
        """Names of everything that can infer now (models and endpoints)."""
        return self.repository.served()
