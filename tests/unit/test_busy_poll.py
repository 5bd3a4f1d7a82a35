"""Busy polling at low load (oipserve.runtime.busy_poll), on uvloop, with its turns counted.

Behind the `perf` marker (benchmarks/README.md): the turns counted in a wall-clock window
depend on the machine's load, so the default run skips them.
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from oipserve.runtime import busy_poll
from oipserve.runtime.busy_poll import MAX_IN_FLIGHT, NEXT_REQUEST_WINDOW, BusyPoll

pytestmark = pytest.mark.perf


@pytest.fixture
def turns(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many polling turns ran: each yields the CPU once."""
    count = [0]

    def counted() -> None:
        count[0] += 1

    monkeypatch.setattr(busy_poll.os, "sched_yield", counted)
    return count


def _run(scenario):  # type: ignore[no-untyped-def]
    return uvloop.run(scenario())


def test_a_request_in_flight_keeps_the_loop_polling_until_its_window_ends(
    turns: list[int],
) -> None:
    async def scenario() -> None:
        poll = BusyPoll(asyncio.get_running_loop(), 0.05)
        poll.ended(poll.started())  # the loop polls for the next request
        poll.started()  # which came: its reply is polled for
        await asyncio.sleep(0.01)  # the loop would sleep here; it turns instead
        assert poll.polling
        assert turns[0] >= 5
        await asyncio.sleep(0.08)
        assert not poll.polling
        seen = turns[0]
        await asyncio.sleep(0.01)
        assert turns[0] == seen  # asleep again: no more turns

    _run(scenario)


def test_the_end_of_the_last_request_polls_only_for_the_next_request_window(
    turns: list[int],
) -> None:
    async def scenario() -> None:
        poll = BusyPoll(asyncio.get_running_loop(), 0.05)
        assert poll.next_window == NEXT_REQUEST_WINDOW
        since = poll.started()
        await asyncio.sleep(0)
        poll.ended(since)
        await asyncio.sleep(0.01)  # far past 150 us, far short of 50 ms
        assert not poll.polling
        assert poll.in_flight == 0

    _run(scenario)


def test_more_requests_in_flight_than_the_limit_stop_polling(turns: list[int]) -> None:
    async def scenario() -> None:
        poll = BusyPoll(asyncio.get_running_loop(), 0.05)
        starts = [poll.started() for _ in range(MAX_IN_FLIGHT + 1)]
        await asyncio.sleep(0.01)
        assert not poll.polling
        assert turns[0] == 0  # the turn scheduled by the first start saw too many and ended
        poll.ended(starts[0])  # back to the limit: polls again
        await asyncio.sleep(0.005)
        assert poll.polling
        assert turns[0] >= 1

    _run(scenario)


def test_a_window_of_zero_never_polls(turns: list[int]) -> None:
    async def scenario() -> None:
        poll = BusyPoll(asyncio.get_running_loop(), 0.0)
        poll.ended(poll.started())
        await asyncio.sleep(0.005)
        assert not poll.polling
        assert turns[0] == 0

    _run(scenario)


def test_a_front_whose_requests_take_longer_than_the_window_polls_only_for_the_next(
    turns: list[int],
) -> None:
    async def scenario() -> None:
        poll = BusyPoll(asyncio.get_running_loop(), 0.002)
        for _ in range(30):  # requests of 5 ms: longer than the 2 ms window
            since = poll.started()
            await asyncio.sleep(0.005)
            poll.ended(since)
        assert poll.typical > 0.002
        await asyncio.sleep(0.005)
        seen = turns[0]
        first = poll.started()  # woke the loop
        since = poll.started()  # beside it, to an awake loop
        await asyncio.sleep(0.005)
        assert not poll.polling
        assert turns[0] == seen  # no polling for these replies
        poll.ended(first)
        assert not poll.polling
        poll.ended(since)
        assert poll.polling  # but for the client's next request
        await asyncio.sleep(0.005)
        assert not poll.polling

    _run(scenario)
