"""``/v2/hardware``: what the machine has, and what this server runs on each device.

The inventory is read afresh on every call (free memory and utilisation change), so a
``--hardware-inventory`` file that was fine at start can break later. That is a condition
of this server, not a feature it lacks and not the client's fault: it answers 503 with the
file and the reason, and recovers by itself once the file is fixed. Start-up reads the
inventory once before serving (``oipserve.app.server``), so a file broken from the start stops
the server instead.
"""

from __future__ import annotations

import psutil

from hardware import Inventory, InventoryError, InventorySource, count_matching, to_json
from oipserve.errors import Unavailable
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.worker_pool import WorkerPool


class HardwareView:
    """Answers the hardware queries from the inventory source, the pool and the registry."""

    def __init__(
        self,
        source: InventorySource,
        pool: WorkerPool,
        registry: ModelRegistry,
        simulated: bool,
    ) -> None:
        self.source = source
        self.pool = pool
        self.registry = registry
        #: True with a fake inventory (``gpu_sessions: "simulated"``): GPU sessions really
        #: run on the CPU provider.
        self.simulated = simulated

    def inventory(self) -> Inventory:
        """A fresh inventory; 503 (naming the file and the reason) if it cannot be read."""
        try:
            return self.source.read()
        except InventoryError as exc:
            raise Unavailable(f"the hardware inventory cannot be read: {exc}") from None

    def has_hardware(self, name: str, num: int) -> bool:
        """True if at least ``num`` units named ``name`` exist (inventory read afresh)."""
        return count_matching(self.inventory(), name) >= num

    def describe(self) -> dict[str, object]:
        """The inventory, with each device's workers, sessions and memory in use."""
        doc = to_json(self.inventory())
        devices: dict[str, dict[str, object]] = doc["devices"]
        for handle in self.pool.workers:
            devices.setdefault(handle.device, {"id": handle.device, "kind": "unknown"})
        for device_id, device in devices.items():
            workers = [w for w in self.pool.workers if w.device == device_id]
            instances: list[dict[str, object]] = []
            names: set[str] = set()
            for model in self._all_models():
                for worker in model.workers:
                    if worker.device == device_id and model.key in worker.models:
                        placement = model.placements.get(worker.worker_id, {})
                        instances.append(
                            {"model": model.name, "version": model.version, **placement}
                        )
                        names.add(model.name)
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
            device["models"] = sorted(names)
            device["instances"] = instances
            device["memory_in_use"] = sum(_rss(w.pid) for w in workers if w.alive)
        doc["simulated"] = self.simulated
        return doc

    def _all_models(self) -> list[ModelVersion]:
        return [m for versions in self.registry.models.values() for m in versions.values()]


def _rss(pid: int | None) -> int:
    """Resident memory of a worker process; 0 if it has just gone (it may die any time)."""
    if pid is None:
        return 0
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.Error, OSError):
        return 0
