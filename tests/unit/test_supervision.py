"""The supervisor of the front's other HTTP fronts, on real child processes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from oipserve.runtime.workerproc import ChildProcess
from oipserve.scaleout import supervision
from oipserve.scaleout.supervision import Supervisor

#: A child that sleeps until it is signalled (``python -P -m timeit``: nothing of ours).
_SLEEPER = ["-n", "1", "import time; time.sleep(120)"]


class Sleeper:
    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.process = ChildProcess("timeit", _SLEEPER, ())


class Keeper:
    """A ``Supervisor`` of sleepers, recording what it was asked to do."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.started: list[Sleeper] = []
        self.cleaned: list[Sleeper] = []
        self.supervisor: Supervisor[Sleeper] = Supervisor(
            logging.getLogger("test.supervision"),
            "a sleeper",
            lambda child: f"sleeper {child.slot}",
            self.start,
            self.cleaned.append,
        )

    async def start(self, slot: int) -> Sleeper:
        if self.failures:
            self.failures -= 1
            raise RuntimeError(f"slot {slot} cannot start yet")
        child = Sleeper(slot)
        self.started.append(child)
        return child


async def _until(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _terminate(child: Sleeper) -> None:
    os.kill(child.process.pid, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "RETRY_STEP", 0.01)
    monkeypatch.setattr(supervision, "EXIT_GRACE", 0.2)


def test_a_child_that_dies_is_replaced_in_its_slot(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        keeper = Keeper()
        first = await keeper.supervisor.add(1)
        second = await keeper.supervisor.add(2)
        first.process.kill()
        await _until(lambda: len(keeper.started) == 3 and len(keeper.supervisor.running) == 2)
        assert keeper.cleaned == [first]
        assert keeper.started[2].slot == 1
        assert keeper.supervisor.running == [second, keeper.started[2]]
        await keeper.supervisor.stop(5.0, _terminate)
        assert keeper.supervisor.running == []
        assert sorted(c.slot for c in keeper.cleaned) == [1, 1, 2]

    with caplog.at_level(logging.INFO, "test.supervision"):
        asyncio.run(scenario())
    assert "sleeper 1 died (killed by SIGKILL); starting another" in caplog.text


def test_a_replacement_that_fails_is_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        keeper = Keeper()
        first = await keeper.supervisor.add(1)
        keeper.failures = 3
        first.process.kill()
        await _until(lambda: len(keeper.supervisor.running) == 1 and keeper.failures == 0)
        assert keeper.supervisor.running[0] is keeper.started[1]
        assert keeper.started[1].process.is_alive()
        await keeper.supervisor.stop(5.0, _terminate)

    with caplog.at_level(logging.INFO, "test.supervision"):
        asyncio.run(scenario())
    for attempt in (1, 2, 3):
        assert f"cannot start a sleeper (attempt {attempt}): slot 1 cannot start yet" in caplog.text


def test_stop_kills_a_child_that_does_not_stop_and_replaces_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        keeper = Keeper()
        obeys = await keeper.supervisor.add(1)
        ignores = await keeper.supervisor.add(2)
        asked: list[int] = []

        def ask(child: Sleeper) -> None:
            asked.append(child.slot)
            if child is obeys:
                _terminate(child)

        await keeper.supervisor.stop(0.1, ask)
        assert asked == [1, 2]
        assert keeper.supervisor.running == []
        assert obeys.process.returncode == -signal.SIGTERM
        assert ignores.process.returncode == -signal.SIGKILL
        assert keeper.cleaned == [obeys, ignores]
        await asyncio.sleep(0.1)
        assert len(keeper.started) == 2  # nothing replaced

    with caplog.at_level(logging.INFO, "test.supervision"):
        asyncio.run(scenario())
    assert "sleeper 2 did not stop in time; killing it" in caplog.text
    assert "starting another" not in caplog.text


def test_abandon_kills_what_started() -> None:
    async def scenario() -> None:
        keeper = Keeper()
        children = [await keeper.supervisor.add(slot) for slot in (1, 2)]
        keeper.supervisor.abandon()
        assert keeper.supervisor.running == []
        assert [c.process.returncode for c in children] == [-signal.SIGKILL] * 2
        assert keeper.cleaned == children
        await asyncio.sleep(0.1)
        assert len(keeper.started) == 2

    asyncio.run(scenario())
