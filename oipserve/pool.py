"""All worker processes: start them, replace the ones that die, stop them all.

Each worker is a ``WorkerHandle`` (``oipserve.worker_handle``). A death is noticed by
its handle; the pool then starts a replacement in the same handle, gives it the same
models, and tells whoever asked (``on_replaced``). The pool also drives the heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from oipserve.wire.shm import owner_prefix, sweep
from oipserve.worker_handle import WorkerHandle
from oipserve.worker_link import away
from oipserve.workerproc import WorkerOptions

__all__ = ["WorkerPool"]

log = logging.getLogger("oipserve.pool")


class WorkerPool:
    """All worker processes, by device."""

    def __init__(self, front_pid: int, options: WorkerOptions, fronts: int = 1) -> None:
        self.prefix = owner_prefix(front_pid)
        #: What each worker process is started with.
        self.options = options
        #: The server's HTTP fronts (``--http-workers``); with more than one, workers also
        #: listen for the others, and this front (the primary, 0) keeps to its own workers.
        self.fronts = fronts
        self.workers: list[WorkerHandle] = []
        self._next_id = 0
        self._replaced: list[Callable[[WorkerHandle], Awaitable[None]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.closing = False

    def start_heartbeats(self, interval: float, timeout: float) -> None:
        """Every ``interval`` s, ping each worker; one silent for ``timeout`` s is replaced.

        A worker answers from a thread of its own (``workers.heartbeat``), so a long
        inference does not silence it; a stopped (SIGSTOP), deadlocked or wedged process
        does.
        """
        loop = asyncio.get_running_loop()

        def beat() -> None:
            if self.closing:
                return
            now = loop.time()
            for worker in self.workers:
                worker.check_heartbeat(now, timeout)
            loop.call_later(interval, beat)

        loop.call_later(interval, beat)

    def on_replaced(self, callback: Callable[[WorkerHandle], Awaitable[None]]) -> None:
        """``callback(new_worker)`` reloads models on a replacement before it serves."""
        self._replaced.append(callback)

    async def add_worker(self, device: str, threads: int, dedicated: bool = False) -> WorkerHandle:
        self._next_id += 1
        handle = WorkerHandle(
            self._next_id,
            device,
            threads,
            f"{self.prefix}w{self._next_id}-",
            dedicated,
            accepts_fronts=self.fronts > 1,
        )
        handle.away = away(handle.worker_id, 0, self.fronts)
        handle.add_death_listener(self._on_death)
        self.workers.append(handle)
        try:
            await handle.start(asyncio.get_running_loop(), self.options)
        except BaseException:
            self.workers.remove(handle)
            handle.kill()
            raise
        return handle

    def _on_death(self, dead: WorkerHandle) -> None:
        if self.closing:
            return
        task = asyncio.get_running_loop().create_task(self._replace(dead))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replace(self, dead: WorkerHandle) -> None:
        """Start a worker in the dead one's place, with the same models."""
        models = dict(dead.models)
        dead.models = {}
        attempt = 0
        while not self.closing:
            attempt += 1
            try:
                await dead.start(asyncio.get_running_loop(), self.options)
                for key, load in models.items():
                    await dead.load(
                        key, load.path, load.providers, load.intra_op_threads, load.session_options
                    )
                for callback in self._replaced:
                    await callback(dead)
                log.info("worker %d replaced (pid %s)", dead.worker_id, dead.pid)
                return
            except Exception:
                log.exception("replacing worker %d failed (attempt %d)", dead.worker_id, attempt)
                dead.kill()
                await asyncio.sleep(min(5.0, 0.5 * attempt))

    async def remove_worker(self, handle: WorkerHandle, timeout: float) -> None:
        """Stop one worker for good (no replacement) and forget it."""
        if handle in self.workers:
            self.workers.remove(handle)
        await handle.stop(timeout)

    async def stop(self, timeout: float) -> None:
        self.closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(w.stop(timeout) for w in self.workers), return_exceptions=True)
        sweep(self.prefix)
