"""A worker's busy polling for its next request (workers.busy_poll): when, and how it polls."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from time import monotonic_ns

import pytest

from workers import busy_poll
from workers.busy_poll import NextRequestPoll, next_events

WINDOW = 400_000  # ns


def _gaps(poll: NextRequestPoll, gap: int, count: int) -> None:
    """``count`` replies, each followed by a request ``gap`` ns later."""
    now = 1_000_000_000
    for _ in range(count):
        poll.idle(now, light=False)
        now += gap
        poll.woken(now)


def test_a_worker_polls_for_the_window_after_each_reply() -> None:
    poll = NextRequestPoll(WINDOW)
    assert poll.idle(5_000, light=False) == 5_000 + WINDOW
    _gaps(poll, WINDOW // 4, 20)
    assert poll.idle(7_000, light=False) == 7_000 + WINDOW


def test_a_worker_does_not_poll_after_a_request_its_front_sent_at_light_load() -> None:
    """The front had nothing else in flight (``Infer.light``): its one client waits on the
    reply, and polling would only buy latency with CPU; the gap is still counted."""
    poll = NextRequestPoll(WINDOW)
    _gaps(poll, WINDOW // 4, 20)
    assert poll.idle(5_000, light=True) == 0
    poll.woken(5_000 + WINDOW // 4)
    assert poll.within > 0.9
    assert poll.idle(9_000, light=False) == 9_000 + WINDOW


def test_a_window_of_zero_never_polls() -> None:
    poll = NextRequestPoll(0)
    _gaps(poll, 1_000, 20)
    assert poll.idle(5_000, light=False) == 0


def test_requests_further_apart_than_the_window_stop_the_polling() -> None:
    poll = NextRequestPoll(WINDOW)
    _gaps(poll, 3 * WINDOW, 5)
    assert poll.idle(5_000, light=False) != 0, "a few long gaps leave most recent ones within"
    _gaps(poll, 3 * WINDOW, 10)
    assert poll.idle(5_000, light=False) == 0


def test_requests_in_bursts_keep_the_polling() -> None:
    """Behind busy fronts every other gap is a front's loop turn, longer than the window."""
    poll = NextRequestPoll(WINDOW)
    for _ in range(20):
        _gaps(poll, WINDOW // 40, 1)
        _gaps(poll, 2 * WINDOW, 1)
        assert poll.idle(5_000, light=False) != 0


def test_gaps_counted_while_asleep_bring_the_polling_back() -> None:
    poll = NextRequestPoll(WINDOW)
    _gaps(poll, 10 * WINDOW, 30)
    assert poll.idle(5_000, light=False) == 0
    _gaps(poll, WINDOW // 2, 10)
    assert poll.idle(5_000, light=False) != 0


def test_one_idle_second_among_close_requests_does_not_stop_the_polling() -> None:
    poll = NextRequestPoll(WINDOW)
    _gaps(poll, WINDOW // 2, 10)
    _gaps(poll, 1_000_000_000, 1)
    assert poll.idle(5_000, light=False) != 0


class _Epoll:
    """A real epoll that counts its polls (timeout 0) and its waits (no timeout); once
    ``blind`` is set, its polls see nothing. (``select.epoll`` takes no subclass.)"""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.blind = False
        self.polls = 0
        self.waits = 0

    def poll(self, timeout: float | None = None, maxevents: int = -1) -> list[tuple[int, int]]:
        if timeout == 0:
            self.polls += 1
            if self.blind:
                return []
            return self.epoll.poll(0, maxevents)
        self.waits += 1
        # NOTE: a wait with no timeout is bounded here, so that a broken poll fails the
        #   test instead of hanging it.
        return self.epoll.poll(2.0 if timeout is None else timeout, maxevents)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


@pytest.fixture
def selector(pair: tuple[socket.socket, socket.socket]) -> Iterator[_Epoll]:
    """A counting epoll watching the worker's end of ``pair`` (the first) for reads."""
    watching = _Epoll()
    watching.epoll.register(pair[0].fileno(), select.EPOLLIN)
    yield watching
    watching.epoll.close()


def test_a_request_that_comes_while_polling_is_taken_without_sleeping(
    pair: tuple[socket.socket, socket.socket],
    selector: _Epoll,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours, theirs = pair
    yields = [0]

    def sched_yield() -> None:  # the front writes during the worker's third poll
        yields[0] += 1
        if yields[0] == 3:
            theirs.send(b"x")

    monkeypatch.setattr(busy_poll.os, "sched_yield", sched_yield)
    events = next_events(selector, monotonic_ns() + 1_000_000_000)
    assert [fd for fd, _ in events] == [ours.fileno()]
    assert (selector.polls, selector.waits, yields[0]) == (4, 0, 3)


def test_past_the_window_the_worker_sleeps_until_a_request_comes(
    pair: tuple[socket.socket, socket.socket],
    selector: _Epoll,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours, theirs = pair
    selector.blind = True
    monkeypatch.setattr(busy_poll.os, "sched_yield", lambda: None)
    theirs.send(b"x")
    started = monotonic_ns()
    events = next_events(selector, started + 2_000_000)
    assert monotonic_ns() - started >= 2_000_000, "polled for the whole window"
    assert [fd for fd, _ in events] == [ours.fileno()]
    assert selector.polls > 1
    assert selector.waits == 1


def test_with_no_window_the_worker_sleeps_at_once(
    pair: tuple[socket.socket, socket.socket], selector: _Epoll
) -> None:
    ours, theirs = pair
    theirs.send(b"x")
    events = next_events(selector, 0)
    assert [fd for fd, _ in events] == [ours.fileno()]
    assert (selector.polls, selector.waits) == (0, 1)


def test_a_bounded_sleep_ends_with_no_events_when_nothing_comes(selector: _Epoll) -> None:
    """A pinned worker sleeps at most so long (``workers.colocation.IDLE_UNPIN``)."""
    started = monotonic_ns()
    assert next_events(selector, 0, 0.05) == []
    assert monotonic_ns() - started >= 40_000_000
    assert (selector.polls, selector.waits) == (0, 1)
