"""All worker processes: start them, replace the ones that die, stop them all.

Each worker is a ``WorkerHandle`` (``oipserve.pool.handle``): one slot, whose processes
follow one another. A death is noticed by its handle; the pool then starts a replacement
in the same handle, and whoever asked (``on_replaced``) gives it its models again: the
model manager, from the registry's record of what this slot holds (never from what the
dead process held). The rules, which a crash loop (a model that kills its worker, a
client that truncates a region the worker reads) must not get round:

- one replacement at a time per slot: a death while the slot's replacement is under way
  is that replacement's failed attempt, not the start of a second one;
- the dead process is killed if need be and reaped, and its segments swept, before the
  next process of its slot starts (``WorkerHandle.reaped``);
- failed starts in a row are paced: ``FIRST_PAUSE`` (0.5 s) before the second attempt,
  doubling up to ``max_pause`` (``--worker-replacement-max-pause``); a process that dies
  within ``STABLE_AFTER`` seconds of its start is one more failed start, so the pause
  keeps growing; one that served longer starts the count afresh (replaced at once);
- ``stop`` cancels the replacements under way and kills what they started (it never
  served: nothing to drain), so a SIGTERM of the front ends promptly.

The pool also drives the heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from oipserve.errors import ServerError
from oipserve.pool.handle import WorkerHandle
from oipserve.pool.link import WorkerDied, WorkerLink, away
from oipserve.runtime.workerproc import WorkerOptions
from oipserve.wire.shm import owner_prefix, sweep

__all__ = ["FIRST_PAUSE", "MAX_PAUSE", "STABLE_AFTER", "WorkerPool", "replacement_pause"]

log = logging.getLogger("oipserve.pool")

#: Seconds before the second attempt of a slot's failed starts in a row; each further
#: failure doubles it, up to the pool's ``max_pause``.
FIRST_PAUSE = 0.5
#: The default ceiling of that pause (``--worker-replacement-max-pause``).
MAX_PAUSE = 10.0
#: Seconds a worker process must live for its death not to count as a failed start.
STABLE_AFTER = 30.0
#: What a failed start or reload raises when the cause is known (logged without a
#: traceback): the process exited or did not greet in time, a socket failed, a load
#: was refused or the worker died during it.
_EXPECTED = (RuntimeError, OSError, ServerError)
#: Seconds between two looks for the exit of a worker cut off (``replaced``).
_EXIT_POLL = 0.02


def replacement_pause(failures: int, max_pause: float) -> float:
    """Seconds to wait before starting a slot's next process after ``failures`` failed
    starts in a row: none after none, then ``FIRST_PAUSE`` doubling up to ``max_pause``."""
    if failures <= 0:
        return 0.0
    return min(max_pause, FIRST_PAUSE * 2.0 ** min(failures - 1, 32))


class _Slot:
    """One worker slot's replacement state."""

    __slots__ = ("handle", "failures", "up_since", "task")

    def __init__(self, handle: WorkerHandle, up_since: float) -> None:
        self.handle = handle
        #: Failed starts in a row (a death soon after a start counts as one).
        self.failures = 0
        #: Loop time at which the slot's current process finished starting.
        self.up_since = up_since
        #: The slot's replacement, while one is under way (at most one).
        self.task: asyncio.Task[None] | None = None

    @property
    def replacing(self) -> bool:
        return self.task is not None and not self.task.done()


class WorkerPool:
    """All worker processes, by device."""

    def __init__(
        self,
        front_pid: int,
        options: WorkerOptions,
        fronts: int = 1,
        max_pause: float = MAX_PAUSE,
    ) -> None:
        self.prefix = owner_prefix(front_pid)
        #: What each worker process is started with.
        self.options = options
        #: The server's HTTP fronts (``--http-workers``); with more than one, workers also
        #: listen for the others, and this front (the primary, 0) keeps to its own workers.
        self.fronts = fronts
        #: Ceiling of the pause between a slot's failed starts (``replacement_pause``).
        self.max_pause = max_pause
        self.workers: list[WorkerHandle] = []
        self._next_id = 0
        self._replaced: list[Callable[[WorkerHandle], Awaitable[None]]] = []
        self._slots: dict[int, _Slot] = {}  # worker id -> its slot
        self.closing = False

    def start_heartbeats(self, interval: float, timeout: float) -> None:
        """Every ``interval`` s, ping each worker; one silent for ``timeout`` s is replaced.

        A worker answers from a thread of its own (``workers.heartbeat``), so a long
        inference does not silence it; a stopped (SIGSTOP), deadlocked or wedged process
        does. A late ``beat`` (this front's loop stalled, or the front was stopped) costs
        the workers nothing: each check reads the echoes waiting in its socket before it
        judges (``WorkerHandle.check_heartbeat``).
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
        """``callback(new_worker)`` gives a replacement its models before it serves; the
        callbacks run in the order they were added, and one that raises fails the start."""
        self._replaced.append(callback)

    @property
    def replacing(self) -> int:
        """Slots whose replacement is under way now."""
        return sum(1 for slot in self._slots.values() if slot.replacing)

    async def replaced(self, timeout: float) -> None:
        """Wait, at most ``timeout`` s, for the replacements under way to end (each started
        and given its models, or given up on: closing), those of workers cut off included:
        a worker whose socket closed is cut off at once, its replacement starts at its
        exit (``WorkerHandle.connection_closed``, ``EXIT_GRACE`` at most later)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.closing and loop.time() < deadline:
            under_way = [
                slot.task
                for slot in self._slots.values()
                if slot.replacing and slot.task is not None
            ]
            if under_way:
                await asyncio.wait(under_way, timeout=deadline - loop.time())
            elif any(not slot.handle.alive for slot in self._slots.values()):
                await asyncio.sleep(_EXIT_POLL)  # cut off, its exit not seen yet
            else:
                return

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
        loop = asyncio.get_running_loop()
        try:
            await handle.start(loop, self.options)
        except BaseException:
            self.workers.remove(handle)
            handle.kill()
            raise
        self._slots[handle.worker_id] = _Slot(handle, loop.time())
        return handle

    def _on_death(self, dead: WorkerLink) -> None:
        """A worker's process ended: start its slot's replacement, unless one is under way
        (then this was that replacement's process: its failure is counted there)."""
        slot = self._slots.get(dead.worker_id)
        if self.closing or slot is None or slot.handle is not dead or slot.replacing:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - slot.up_since < STABLE_AFTER:
            slot.failures += 1  # NOTE: it died soon after its start: a crash loop is paced
        else:
            slot.failures = 0
        slot.task = loop.create_task(self._replace(slot.handle, slot))

    async def _replace(self, handle: WorkerHandle, slot: _Slot) -> None:
        """Start processes in the dead one's slot until one starts and takes its models."""
        loop = asyncio.get_running_loop()
        while True:
            await handle.reaped()
            pause = replacement_pause(slot.failures, self.max_pause)
            if pause:
                log.warning(
                    "worker %d: %d failed start%s in a row; the next replacement starts in %.1fs",
                    handle.worker_id,
                    slot.failures,
                    "" if slot.failures == 1 else "s",
                    pause,
                )
                await asyncio.sleep(pause)
            try:
                await self._start_again(handle, loop)
            except _EXPECTED as exc:
                slot.failures += 1
                log.error("replacing worker %d failed: %s", handle.worker_id, exc)
                continue
            except Exception:
                slot.failures += 1
                log.exception("replacing worker %d failed", handle.worker_id)
                continue
            slot.up_since = loop.time()
            log.info("worker %d replaced (pid %s)", handle.worker_id, handle.pid)
            return

    async def _start_again(self, handle: WorkerHandle, loop: asyncio.AbstractEventLoop) -> None:
        """One attempt: a new process in ``handle``, given its models by ``on_replaced``."""
        await handle.start(loop, self.options)
        for callback in self._replaced:
            await callback(handle)
        if not handle.alive:  # NOTE: its death was told to _on_death, which left it to us
            raise WorkerDied(f"worker {handle.worker_id} died while it took its models again")

    async def remove_worker(self, handle: WorkerHandle, timeout: float) -> None:
        """Stop one worker for good (no replacement) and forget it."""
        if handle in self.workers:
            self.workers.remove(handle)
        slot = self._slots.pop(handle.worker_id, None)
        replacement = slot.task if slot is not None and slot.replacing else None
        if replacement is not None and replacement is not asyncio.current_task():
            await _cancelled(replacement)
            timeout = 0  # a replacement never served: nothing to drain
        await handle.stop(timeout)

    async def stop(self, timeout: float) -> None:
        """Stop every worker: the ones serving drain for up to ``timeout`` s; replacements
        under way are cancelled and whatever they started is killed at once."""
        self.closing = True
        pending = {
            worker_id: slot.task
            for worker_id, slot in self._slots.items()
            if slot.replacing and slot.task is not None
        }
        await asyncio.gather(*(_cancelled(task) for task in pending.values()))
        await asyncio.gather(
            *(w.stop(0 if w.worker_id in pending else timeout) for w in self.workers),
            return_exceptions=True,
        )
        sweep(self.prefix)


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has ended (its outcome is not raised here)."""
    task.cancel()
    await asyncio.wait([task])
