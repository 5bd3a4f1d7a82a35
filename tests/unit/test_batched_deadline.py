"""A batched request's deadline, when its queue timeout falls due at the same moment.

A request's own ``timeout`` parameter is both its queue timeout (when the queue policy
allows overriding) and its deadline. The two timers then fire in either order (libuv counts
milliseconds), so the deadline's handler decides: still queued, the request fails as the
queue policy says, with Triton's message; already running, it fails on its deadline.
"""

from __future__ import annotations

import asyncio

import pytest

from oipserve.dataplane.batched import _expire, _Queued
from oipserve.errors import DeadlineExceeded
from oipserve.scheduling.scheduler import QueueRejected


def _failure(queue_due: _Queued | None) -> BaseException | None:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        _expire(future, queue_due)
        return future.exception()
    finally:
        loop.close()


def _queued(taken: bool) -> _Queued:
    queued = _Queued([], [], [], 1, 0, None)  # type: ignore[arg-type]
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
