"""When a worker's silence means a hang (``WorkerHandle.check_heartbeat``; issue #37).

The check is driven here with the times a stalled loop would give it, against a socket
pair whose far end plays the worker's heartbeat thread (echoing, or silent). The real
processes: tests/e2e/test_heartbeat_stall.py (a stopped front) and
tests/e2e/test_deadlines.py (a stopped worker).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from oipserve.pool.handle import WorkerHandle

TIMEOUT = 5.0
INTERVAL = 1.0


@pytest.fixture
def pair() -> Iterator[tuple[WorkerHandle, socket.socket]]:
    """A ready handle (no process: its ``kill`` does nothing) and the worker's end."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    handle = WorkerHandle(1, "cpu", 1, "oipserve-unit-heartbeat-")
    handle._loop = asyncio.new_event_loop()
    handle.alive = True
    handle.ready = asyncio.Event()
    handle.ready.set()
    handle._heartbeat = ours
    yield handle, theirs
    handle._loop.close()
    ours.close()
    theirs.close()


def _echo(theirs: socket.socket) -> None:
    """The worker's thread answers every heartbeat sent so far."""
    theirs.send(theirs.recv(4096))


def test_a_stalled_front_finds_the_echo_waiting(pair: tuple[WorkerHandle, socket.socket]) -> None:
    handle, theirs = pair
    handle.check_heartbeat(0.0, TIMEOUT)
    _echo(theirs)  # answered at once, while the front's loop is stalled
    # The loop comes back 18 s later and runs its overdue check before polling.
    handle.check_heartbeat(18.0, TIMEOUT)
    assert not handle._hung
    _echo(theirs)
    handle.check_heartbeat(18.0 + INTERVAL, TIMEOUT)
    assert not handle._hung


def test_a_silent_worker_is_hung_a_timeout_after_its_first_unanswered_beat(
    pair: tuple[WorkerHandle, socket.socket],
) -> None:
    handle, theirs = pair
    handle.check_heartbeat(0.0, TIMEOUT)
    _echo(theirs)
    handle.check_heartbeat(INTERVAL, TIMEOUT)  # the worker stops here: never answered
    beat = 2 * INTERVAL
    while beat <= INTERVAL + TIMEOUT:
        handle.check_heartbeat(beat, TIMEOUT)
        assert not handle._hung, beat
        beat += INTERVAL
    handle.check_heartbeat(beat, TIMEOUT)
    assert "hung" in handle._hung


def test_a_stalled_front_still_sees_a_silent_worker(
    pair: tuple[WorkerHandle, socket.socket],
) -> None:
    handle, _ = pair
    handle.check_heartbeat(0.0, TIMEOUT)  # never answered
    handle.check_heartbeat(18.0, TIMEOUT)
    assert "hung" in handle._hung


def test_no_verdict_while_a_load_holds_the_gil(pair: tuple[WorkerHandle, socket.socket]) -> None:
    handle, theirs = pair
    handle.check_heartbeat(0.0, TIMEOUT)
    handle.loading = 1
    handle.check_heartbeat(2 * TIMEOUT, TIMEOUT)
    assert not handle._hung
    handle.loading = 0
    _echo(theirs)  # the GIL released, the thread answers what waited
    handle.check_heartbeat(2 * TIMEOUT + INTERVAL, TIMEOUT)
    assert not handle._hung
