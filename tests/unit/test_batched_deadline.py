"""A batched request's deadline, when its queue timeout falls due at the same moment.

A request's own ``timeout`` parameter is both its queue timeout (when the queue policy
allows overriding) and its deadline. The two timers then fire in either order (libuv counts
milliseconds), so the deadline's handler decides: still queued, the request fails as the
queue policy says, with Triton's message; already running, it fails on its deadline.

The deadlines of a front's batched requests share one loop timer while they come in
arrival order (``_Deadlines``); each request still fails at its own.
"""

from __future__ import annotations

import asyncio

import pytest

from oipserve.dataplane.batched import _Deadlines, _expire, _Queued
from oipserve.errors import DeadlineExceeded
from oipserve.scheduling.scheduler import QueueRejected
from oipserve.telemetry.stats import ModelStats


def _failure(queue_due: _Queued | None) -> BaseException | None:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        _expire(future, queue_due)
        return future.exception()
    finally:
        loop.close()


def _queued(taken: bool) -> _Queued:
    queued = _Queued([], [], [], 1, 0, ModelStats("batched", "1"))
    queued.taken = taken
    return queued


def test_still_queued_with_its_queue_timeout_due_it_is_a_queue_timeout() -> None:
    failure = _failure(_queued(taken=False))
    assert isinstance(failure, QueueRejected)
    assert str(failure) == "Request timeout expired"


@pytest.mark.parametrize("queue_due", [None, "taken"])
def test_otherwise_it_is_the_deadline(queue_due: str | None) -> None:
    failure = _failure(_queued(taken=True) if queue_due else None)
    assert isinstance(failure, DeadlineExceeded)


def test_an_answered_request_is_left_alone() -> None:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        future.set_result("answer")
        _expire(future, _queued(taken=False))
        assert future.result() == "answer"
    finally:
        loop.close()


def _waiting(loop: asyncio.AbstractEventLoop, deadline: float) -> _Queued:
    queued = _queued(taken=True)
    queued.future = loop.create_future()
    queued.deadline = deadline
    return queued


async def _failed_by(queued: _Queued) -> float:
    """Loop time when ``queued``'s deadline failed it."""
    assert queued.future is not None
    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(asyncio.shield(queued.future), 5)
    return asyncio.get_running_loop().time()


async def test_deadlines_in_arrival_order_share_one_timer_and_each_fails_at_its_own() -> None:
    loop = asyncio.get_running_loop()
    deadlines = _Deadlines(loop)
    now = loop.time()
    first, answered, last = (_waiting(loop, now + d) for d in (0.05, 0.1, 0.15))
    assert [deadlines.watch(q) for q in (first, answered, last)] == [None, None, None]
    deadlines.forget(answered)
    assert await _failed_by(first) >= first.deadline - 0.0005
    assert not last.future.done()  # type: ignore[union-attr]
    assert await _failed_by(last) >= last.deadline - 0.0005
    assert not answered.future.done()  # type: ignore[union-attr]


async def test_an_earlier_deadline_than_one_watched_gets_a_timer_of_its_own() -> None:
    loop = asyncio.get_running_loop()
    deadlines = _Deadlines(loop)
    now = loop.time()
    late, early = _waiting(loop, now + 5), _waiting(loop, now + 0.05)
    assert deadlines.watch(late) is None
    own = deadlines.watch(early)  # a request's own shorter timeout
    assert own is not None
    assert await _failed_by(early) >= early.deadline - 0.0005
    assert not late.future.done()  # type: ignore[union-attr]
    deadlines.forget(late)
