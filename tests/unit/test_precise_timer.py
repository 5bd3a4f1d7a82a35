"""The loop's timer to the microsecond (oipserve.scheduling.precise_timer), on uvloop."""

from __future__ import annotations

import asyncio
import time

import uvloop

from oipserve.scheduling.precise_timer import PreciseTimer


def _run(scenario):  # type: ignore[no-untyped-def]
    return uvloop.run(scenario())


def test_it_fires_once_after_its_delay_not_at_the_next_millisecond_or_before() -> None:
    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        fired: list[int] = []
        timer = PreciseTimer(loop, lambda: fired.append(time.monotonic_ns()))
        waits = []
        for delay_us in (100, 400, 900):
            start = time.monotonic_ns()
            timer.arm(delay_us / 1e6)
            while len(fired) < len(waits) + 1:
                await asyncio.sleep(0)
            waits.append((fired[-1] - start) // 1000 - delay_us)
        await asyncio.sleep(0.01)
        assert len(fired) == 3  # once each
        timer.close()
        return waits

    lateness = _run(scenario)
    assert all(late >= 0 for late in lateness), lateness


def test_rearming_replaces_the_due_time_and_disarming_cancels_it() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        timer = PreciseTimer(loop, lambda: fired.append(loop.time()))
        timer.arm(0.002)
        timer.arm(0.050)  # replaces the first
        await asyncio.sleep(0.02)
        assert fired == []
        timer.disarm()
        await asyncio.sleep(0.06)
        assert fired == []
        timer.arm(0.001)
        await asyncio.sleep(0.02)
        assert len(fired) == 1
        timer.close()
        timer.close()  # twice is harmless

    _run(scenario)
