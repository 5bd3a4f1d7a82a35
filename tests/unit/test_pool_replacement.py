"""The worker pool's replacement rules (issue #35, row 2), with fake worker handles.

One replacement at a time per slot, the dead process reaped before the next starts,
a growing pause between failed starts up to a ceiling (a process that dies right after
its start counts as one), models given back by the ``on_replaced`` callbacks (the
registry's record), and a stop that does not wait for replacements under way. The real
processes are in tests/e2e/test_worker_supervision.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

import pytest

from oipserve.pool import worker_pool as pool_module
from oipserve.pool.worker_pool import WorkerPool, replacement_pause
from oipserve.runtime.workerproc import WorkerOptions

PAUSED = re.compile(r"worker (\d+): (\d+) failed starts? in a row; the next replacement starts in")


class FakeHandle:
    """A worker slot whose "processes" are flags: started, running until reaped, dead."""

    def __init__(
        self,
        worker_id: int,
        device: str,
        threads: int,
        prefix: str,
        dedicated: bool = False,
        accepts_fronts: bool = False,
    ) -> None:
        self.worker_id = worker_id
        self.device = device
        self.away = 0
        self.alive = False
        self.pid: int | None = None
        self.models: dict[str, object] = {}
        self.listeners: list[Callable[[FakeHandle], None]] = []
        #: Processes started in this slot; the one started last is not reaped yet.
        self.starts = 0
        self.unreaped = False
        #: While set, a start waits for it (the process imports ONNX Runtime).
        self.gate: asyncio.Event | None = None
        #: The process being started died (it exits during start-up).
        self.crashed = False
        #: Starts that overlapped an unreaped process of the same slot.
        self.overlaps = 0
        self.stopped_with: float | None = None

    def add_death_listener(self, listener: Callable[[FakeHandle], None]) -> None:
        self.listeners.append(listener)

    async def start(self, loop: asyncio.AbstractEventLoop, options: WorkerOptions) -> None:
        if self.unreaped:
            self.overlaps += 1
        self.starts += 1
        self.pid = 1000 + self.starts
        self.unreaped = True
        self.crashed = False
        self.alive = True
        if self.gate is not None:
            await self.gate.wait()
        if self.crashed:
            raise RuntimeError(f"worker {self.worker_id} exited during start-up")

    def die(self) -> None:
        """The current process ends (SIGKILL): what ``WorkerHandle.on_exit`` tells."""
        self.crashed = True
        self.alive = False
        self.models = {}
        for listener in list(self.listeners):
            listener(self)

    async def reaped(self, timeout: float | None = None) -> None:
        self.alive = False
        self.unreaped = False

    def kill(self) -> None:
        self.alive = False

    async def stop(self, timeout: float) -> None:
        self.stopped_with = timeout
        self.alive = False
        self.unreaped = False


class Record:
    """What the registry says the slot holds, given back by an ``on_replaced`` callback."""

    def __init__(self) -> None:
        self.holds = {"simple/1": "load", "identity_fp32/1": "load"}
        self.given: list[int | None] = []

    async def __call__(self, handle: FakeHandle) -> None:  # type: ignore[override]
        handle.models = dict(self.holds)
        self.given.append(handle.pid)


@pytest.fixture(autouse=True)
def _fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "WorkerHandle", FakeHandle)
    monkeypatch.setattr(pool_module, "FIRST_PAUSE", 0.01)


def make_pool(max_pause: float = 0.04) -> tuple[WorkerPool, Record]:
    pool = WorkerPool(4242, WorkerOptions(), max_pause=max_pause)
    record = Record()
    pool.on_replaced(record)  # type: ignore[arg-type]
    return pool, record


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.002)


def pauses(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The failure counts the pool paused after, in order."""
    return [int(m.group(2)) for r in caplog.records if (m := PAUSED.search(r.getMessage()))]


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_the_pause_doubles_up_to_its_ceiling() -> None:
    steps = [replacement_pause(n, 10.0) for n in range(8)]
    assert steps == [0.0, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64]  # FIRST_PAUSE is 0.01 here
    assert replacement_pause(10_000, 10.0) == 10.0  # no overflow, the ceiling holds
    assert replacement_pause(3, 0.015) == 0.015


def test_deaths_while_a_replacement_starts_make_one_replacement(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "oipserve.pool")

    async def scenario() -> None:
        pool, record = make_pool()
        handle: FakeHandle = await pool.add_worker("cpu", 1)  # type: ignore[assignment]
        handle.models = dict(record.holds)
        handle.gate = asyncio.Event()
        handle.die()
        await until(lambda: handle.starts == 2)
        # The new process dies while it starts, twice (its death, and the socket's).
        handle.die()
        handle.die()
        await asyncio.sleep(0.05)
        assert pool.replacing == 1
        assert handle.starts == 2
        handle.gate.set()
        handle.gate = None
        await until(lambda: pool.replacing == 0)
        assert handle.alive
        assert handle.starts == 3  # the failed start, then one more: never two at once
        assert handle.overlaps == 0  # each process reaped before the next started
        assert handle.models == record.holds  # from the record, not the emptied handle
        assert record.given == [handle.pid]
        await pool.stop(1.0)

    run(scenario)
    assert "worker 1 replaced (pid 1003)" in caplog.text
    assert "replacing worker 1 failed: worker 1 exited during start-up" in caplog.text
    # Killed within STABLE_AFTER of its start: a failure already; the failed start, another.
    assert pauses(caplog) == [1, 2]


def test_a_process_that_dies_right_after_its_start_makes_the_pause_grow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "oipserve.pool")

    async def scenario() -> None:
        pool, record = make_pool(max_pause=0.03)
        handle: FakeHandle = await pool.add_worker("cpu", 1)  # type: ignore[assignment]
        for replaced in range(1, 6):
            handle.die()
            await until(lambda replaced=replaced: len(record.given) == replaced)  # type: ignore[misc]
            await until(lambda: pool.replacing == 0)
        assert handle.starts == 6 and handle.overlaps == 0
        await pool.stop(1.0)

    run(scenario)
    # Each death came right after a start: the count, and with it the pause, grows.
    assert pauses(caplog) == [1, 2, 3, 4, 5]
    assert [replacement_pause(n, 0.03) for n in range(1, 6)] == [0.01, 0.02, 0.03, 0.03, 0.03]


def test_a_worker_that_served_long_enough_is_replaced_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pool_module, "STABLE_AFTER", 0.0)
    caplog.set_level(logging.INFO, "oipserve.pool")

    async def scenario() -> None:
        pool, record = make_pool()
        handle: FakeHandle = await pool.add_worker("cpu", 1)  # type: ignore[assignment]
        for replaced in (1, 2):
            handle.die()
            await until(lambda replaced=replaced: len(record.given) == replaced)  # type: ignore[misc]
            await until(lambda: pool.replacing == 0)
        await pool.stop(1.0)

    run(scenario)
    assert pauses(caplog) == []


def test_stop_does_not_wait_for_a_replacement_under_way() -> None:
    async def scenario() -> None:
        pool, _ = make_pool()
        serving: FakeHandle = await pool.add_worker("cpu", 1)  # type: ignore[assignment]
        starting: FakeHandle = await pool.add_worker("cpu", 1)  # type: ignore[assignment]
        starting.gate = asyncio.Event()  # its replacement never finishes starting
        starting.die()
        await until(lambda: starting.starts == 2)
        await asyncio.wait_for(pool.stop(30.0), 1.0)
        assert pool.replacing == 0
        assert starting.stopped_with == 0  # killed: it never served
        assert serving.stopped_with == 30.0  # drained
        starting.die()  # a death after stop starts nothing
        await asyncio.sleep(0.05)
        assert starting.starts == 2

    run(scenario)


def test_removing_a_worker_cancels_its_replacement() -> None:
    async def scenario() -> None:
        pool, _ = make_pool()
        handle: FakeHandle = await pool.add_worker("cpu", 1, dedicated=True)  # type: ignore[assignment]
        handle.gate = asyncio.Event()
        handle.die()
        await until(lambda: handle.starts == 2)
        await asyncio.wait_for(pool.remove_worker(handle, 30.0), 1.0)  # type: ignore[arg-type]
        assert pool.replacing == 0 and pool.workers == []
        assert handle.stopped_with == 0
        handle.gate.set()
        await asyncio.sleep(0.05)
        assert handle.starts == 2

    run(scenario)
