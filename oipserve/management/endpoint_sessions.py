"""The sessions of onnxruntime endpoints on worker processes, and the workers started for them.

Each instance of an endpoint is one session of its model, on a different worker process
of its device: the least busy live worker without one, or else a new worker started for
it. Workers started here are "dedicated" and stopped with their last session. A session
load that fails or is given up (``--load-timeout``, in ``worker_endpoints``) is undone
without waiting for the worker: a dedicated worker with nothing else on it is killed, any
other one is sent an unload it handles once it is free.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from hardware import CPU_DEVICE
from oipserve.errors import InvalidInput
from oipserve.models.manager import ModelManager
from oipserve.models.placement import unload_quietly
from oipserve.models.registry import ModelVersion, merge_metadata
from oipserve.pool.handle import WorkerHandle, own_handle
from oipserve.pool.link import WorkerLink
from oipserve.pool.worker_pool import WorkerPool

log = logging.getLogger("oipserve.management")

#: Called with a worker that died; the data plane's ``worker_gone``.
DeathListener = Callable[[WorkerLink], None]


class EndpointSessions:
    """Places endpoint sessions on workers and removes them, starting and stopping workers."""

    def __init__(
        self,
        pool: WorkerPool,
        manager: ModelManager,
        death_listeners: list[DeathListener],
        stop_timeout: float,
        usable_cores: Callable[[], int],
    ) -> None:
        self.pool = pool
        self.manager = manager
        #: The CPUs this server may use (the inventory's ``usable_cores``): a dedicated CPU
        #: worker gets half of them, as the repository's CPU workers share them all.
        self.usable_cores = usable_cores
        #: Given to every worker this module starts, so the data plane hears of its death.
        self.death_listeners = death_listeners
        self.stop_timeout = stop_timeout
        #: Session loads under way per worker id, so concurrent loads spread out.
        self.busy: Counter[int] = Counter()
        #: Unloads sent to workers after an abandoned load; nobody waits for them.
        self.background: set[asyncio.Task[None]] = set()

    async def place_all(
        self, model: ModelVersion, device: str, threads: int | None, instances: int
    ) -> None:
        """``instances`` sessions of ``model``; if one fails, those made so far are dropped."""
        try:
            for _ in range(instances):
                await self.place(model, device, threads)
        except BaseException:
            await self._rollback(model)
            raise

    async def place(self, model: ModelVersion, device: str, threads: int | None) -> None:
        """One more session of ``model``, on a worker of ``device`` without one."""
        worker = await self._free_worker(device, model, threads)
        self.busy[worker.worker_id] += 1
        try:
            loaded = await self.manager.placement.place(model, worker, threads)
            if not model.inputs and not model.outputs:
                try:
                    inputs, outputs = merge_metadata(model.config, loaded, model.name)
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
                threads = max(1, self.usable_cores() // 2)
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
            task = asyncio.get_running_loop().create_task(unload_quietly(worker, model.key))
            self.background.add(task)
            task.add_done_callback(self.background.discard)

    async def _rollback(self, model: ModelVersion) -> None:
        """Undo a failed creation: drop the sessions made so far (and their workers)."""
        for worker in list(model.workers):
            await self.drop(model, own_handle(worker))
        model.state = "UNAVAILABLE"
        model.reason = "load failed"

    async def drop(self, model: ModelVersion, worker: WorkerHandle) -> None:
        """Remove ``model``'s session from ``worker``; a dedicated worker left empty is stopped."""
        if worker in model.workers:
            model.workers.remove(worker)
        model.placements.pop(worker.worker_id, None)
        await worker.unload(model.key)
        if worker.dedicated and not worker.models:
            await self.pool.remove_worker(worker, self.stop_timeout)
            log.info("stopped worker %d: no endpoint uses it", worker.worker_id)
