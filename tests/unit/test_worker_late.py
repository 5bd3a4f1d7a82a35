"""A worker that comes to a request too late to end it by its deadline answers it without
running it (``workers.late``, ``Infer.expires``); and its replies do not wait behind long
runs (``workers.worker.REPLY_HOLD_NS``)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from time import monotonic_ns

import msgspec
import pytest

from oipserve.wire.framing import frame
from oipserve.wire.messages import ErrorKind, Failed, FromWorker, Infer
from tests.support.worker_replies import only_reply, paired_worker
from workers import late, runtime
from workers.worker import REPLY_HOLD_NS, Worker

_SECOND = 1_000_000_000


class _Session(runtime.ModelSession):
    """Stands in for runtime.ModelSession: counts its runs, and fails them (no model)."""

    def __init__(self, run_for: float = 0.0, then: object = None) -> None:
        # NOTE: no session to load; a subclass, as the compiled worker takes no other.
        self.outputs = []
        self.runs = 0
        self.run_for = run_for
        self.then = then

    def run(self, names: list[str], feeds: dict[str, object]) -> list[object]:
        self.runs += 1
        time.sleep(self.run_for)
        if callable(self.then):
            self.then()
        raise RuntimeError("ran")


@pytest.fixture
def worker() -> Iterator[Worker]:
    with paired_worker("oipserve-test-late-") as worker:
        yield worker


def _answer(worker: Worker, expires: int) -> tuple[Failed, int]:
    session = _Session()
    worker.sessions["m/1"] = session
    worker.handle(Infer(3, "m/1", [], ["y"], expires=expires), worker.starter)
    reply = only_reply(worker)
    assert isinstance(reply, Failed) and reply.rid == 3
    return reply, session.runs


def test_a_request_past_its_deadline_is_answered_without_running(
    worker: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "oipserve.worker"):
        reply, runs = _answer(worker, monotonic_ns() - 1)
    assert (reply.kind, reply.message, runs) == (ErrorKind.DEADLINE_EXCEEDED, late.MESSAGE, 0)
    assert worker.late.skipped == 1
    assert "1 request(s) not run: too late to end by their deadline" in caplog.text


def test_a_request_that_cannot_end_in_time_at_the_models_pace_is_not_run(
    worker: Worker,
) -> None:
    worker.late.ran("m/1", 2 * _SECOND)  # the model's runs take 2 s
    reply, runs = _answer(worker, monotonic_ns() + _SECOND)
    assert (reply.kind, runs) == (ErrorKind.DEADLINE_EXCEEDED, 0)
    _, runs = _answer(worker, monotonic_ns() + 3 * _SECOND)
    assert runs == 1


@pytest.mark.parametrize("expires", [0, 60 * _SECOND], ids=["no-deadline", "in-time"])
def test_a_request_in_time_or_without_a_deadline_runs(worker: Worker, expires: int) -> None:
    _, runs = _answer(worker, monotonic_ns() + expires if expires else 0)
    assert runs == 1 and worker.late.skipped == 0


def test_the_models_pace_follows_its_runs() -> None:
    tally = late.LateRequests()
    now = 10 * _SECOND
    assert not tally.too_late("m/1", now + 1, now)  # no run yet: only the past is late
    for _ in range(40):
        tally.ran("m/1", _SECOND)
    assert tally.too_late("m/1", now + _SECOND // 2, now)
    assert not tally.too_late("m/1", now + 2 * _SECOND, now)
    tally.forget("m/1")
    assert not tally.too_late("m/1", now + 1, now)


def test_a_slow_first_run_does_not_make_the_next_requests_late() -> None:
    """ONNX Runtime's first run of a session can take ten times the next ones: the pace
    is the lower of the typical time and the last run's."""
    tally = late.LateRequests()
    now = 10 * _SECOND
    tally.ran("m/1", 10 * _SECOND)
    assert tally.too_late("m/1", now + 2 * _SECOND, now)
    tally.ran("m/1", _SECOND)
    assert not tally.too_late("m/1", now + 2 * _SECOND, now)


def test_the_log_counts_skips_between_its_lines(caplog: pytest.LogCaptureFixture) -> None:
    tally = late.LateRequests()
    step = int(late.LOG_EVERY * 1e9)
    with caplog.at_level(logging.INFO, "oipserve.worker"):
        for now in (step, step + 1, step + 2, 2 * step + 5):
            assert tally.skip(1, 0, now) == (ErrorKind.DEADLINE_EXCEEDED, late.MESSAGE)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert [line.split(" request")[0] for line in said] == ["1", "3"]
    assert tally.skipped == 4 and "(4 since it started" in said[-1]


def test_a_reply_leaves_before_the_next_long_run_of_the_same_read() -> None:
    """Two requests in one read, each run longer than ``REPLY_HOLD_NS``: the first one's
    answer reached the front while the second ran (held for the whole read until
    2026-11-29, so a queue of long runs delayed every answer to its end)."""
    front, theirs = socket.socketpair()
    worker = Worker(theirs, "oipserve-test-late-hold-")
    seen_while_running: list[bytes] = []

    def look() -> None:
        try:
            seen_while_running.append(front.recv(1 << 16, socket.MSG_DONTWAIT))
        except BlockingIOError:
            seen_while_running.append(b"")

    try:
        worker.sessions["m/1"] = _Session(2 * REPLY_HOLD_NS / 1e9, look)
        encoder = msgspec.msgpack.Encoder()
        front.sendall(b"".join(frame(encoder, Infer(r, "m/1", [], ["y"])) for r in (1, 2)))
        assert worker.receive(worker.starter, 0)
        first, second = seen_while_running
        assert first == b"" and second, "the first answer waited for the second run"
        reply = msgspec.msgpack.Decoder(FromWorker).decode(second[4:])
        assert isinstance(reply, Failed) and reply.rid == 1
    finally:
        worker.close()
        front.close()
        theirs.close()
