"""The front's long-lived child processes of one kind: watched, replaced, stopped together.

The other HTTP fronts (``replicas.primary``, ``--http-workers``) are kept by a ``Supervisor``:

- a child is watched from the moment it serves (its pidfd in the event loop);
- one that exits while the server runs is logged (ERROR, or INFO for exit status 0: a
  SIGTERM of its own drains it) and replaced in the same slot, attempt after attempt
  with a growing pause (up to 5 s) until one starts: a replacement that fails once (a
  port briefly taken, a fork refused) must not leave the server short of it for good;
- ``stop`` asks every child to drain, waits for them to exit, and kills any still
  running once the timeout and a grace have passed.

What a child is, how it starts and what is cleaned up after it are the owner's
(``start`` and ``cleanup``). Workers have their own keeper (``pool.py``): a worker's
replacement is the same ``WorkerHandle`` started again, models reloaded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from oipserve.runtime.workerproc import ChildProcess, exit_status

__all__ = ["EXIT_GRACE", "Supervisor"]

#: Beyond the drain's timeout, how long a stopping child gets to exit.
EXIT_GRACE = 5.0
#: The pause before replacement attempt n is ``min(RETRY_MAX, RETRY_STEP * n)`` seconds.
RETRY_STEP = 0.5
RETRY_MAX = 5.0


class Child(Protocol):
    process: ChildProcess


C = TypeVar("C", bound=Child)


class Supervisor(Generic[C]):
    """Children started by ``start(slot)``; ``cleanup(child)`` runs once each has exited.

    ``kind`` names a child in the log ("an HTTP front"), ``describe`` one of them
    ("HTTP front 1 (pid 1234)")."""

    def __init__(
        self,
        log: logging.Logger,
        kind: str,
        describe: Callable[[C], str],
        start: Callable[[int], Awaitable[C]],
        cleanup: Callable[[C], None],
    ) -> None:
        self._log = log
        #: What a child is, for the log: "an HTTP front".
        self._kind = kind
        self._describe = describe
        self._start = start
        self._cleanup = cleanup
        #: The children serving now (``start`` may enlist one before it serves, so that
        #: messages to all of them reach it too; ``watch`` keeps it there).
        self.running: list[C] = []
        self._slots: dict[int, int] = {}  # id(child) -> its slot
        self._replacing: set[asyncio.Task[None]] = set()
        self._emptied = asyncio.Event()
        self.stopping = False

    async def add(self, slot: int) -> C:
        """Start a child in ``slot`` and watch it; raises what ``start`` raises."""
        child = await self._start(slot)
        self.watch(child, slot)
        return child

    def watch(self, child: C, slot: int) -> None:
        if child not in self.running:
            self.running.append(child)
        self._slots[id(child)] = slot
        asyncio.get_running_loop().add_reader(child.process.sentinel, self._exited, child)

    def leave(self, child: C) -> None:
        """``child`` went before it was watched (its start failed, or was cancelled by a
        stop): a stop waiting for the children to go is told when it was the last (it
        waited ``--shutdown-timeout`` and more for it, found by fuzzing)."""
        if child in self.running:
            self.running.remove(child)
        if not self.running:
            self._emptied.set()

    def abandon(self) -> None:
        """Start-up failed: kill every child started so far, replace none."""
        self.stopping = True
        for child in list(self.running):
            child.process.kill()
            self._exited(child, join=EXIT_GRACE)

    def _exited(self, child: C, join: float = 0.0) -> None:
        slot = self._slots.pop(id(child), None)
        if slot is not None and child.process.sentinel >= 0:
            asyncio.get_running_loop().remove_reader(child.process.sentinel)
        child.process.join(join)
        if child in self.running:
            self.running.remove(child)
        if not self.running:
            self._emptied.set()
        self._cleanup(child)
        if self.stopping or slot is None:
            return
        code = child.process.returncode
        # NOTE: a child that exits 0 was stopped on purpose (SIGTERM to it alone: it
        #   drains first), as a worker is; anything else is a death.
        report = self._log.info if code == 0 else self._log.error
        how = "was stopped" if code == 0 else "died"
        report("%s %s%s; starting another", self._describe(child), how, exit_status(code))
        task = asyncio.get_running_loop().create_task(self._replace(slot))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, slot: int) -> None:
        attempt = 0
        while not self.stopping:
            attempt += 1
            try:
                child = await self._start(slot)
            except (RuntimeError, OSError, TimeoutError) as exc:
                self._log.error("cannot start %s (attempt %d): %s", self._kind, attempt, exc)
                await asyncio.sleep(min(RETRY_MAX, RETRY_STEP * attempt))
                continue
            if self.stopping:  # NOTE: stop began while it started: it is not waited for
                child.process.kill()
                self._exited(child, join=EXIT_GRACE)
                return
            self.watch(child, slot)
            return

    async def stop(self, timeout: float, ask_to_stop: Callable[[C], None]) -> None:
        """Every child drains (``ask_to_stop``), then exits; stragglers are killed."""
        self.stopping = True
        for task in list(self._replacing):
            task.cancel()
        running = list(self.running)
        if not running:
            return
        self._emptied.clear()
        for child in running:
            ask_to_stop(child)
        try:
            await asyncio.wait_for(self._emptied.wait(), timeout + EXIT_GRACE)
        except TimeoutError:
            pass
        for child in list(self.running):
            self._log.warning("%s did not stop in time; killing it", self._describe(child))
            child.process.kill()
            self._exited(child, join=EXIT_GRACE)
