"""A front's writes to a worker (``WorkerLink.send``): housekeeping messages (Release,
Forget) ride with the next request, or go alone ``LAZY_FLUSH`` seconds after they were
queued when none came; never alone while requests keep coming. Request ids
(``WorkerLink.call``) are small and taken again once answered."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import msgspec
import pytest

from oipserve.pool.link import LAZY_FLUSH, SMALL_RIDS, WorkerLink
from oipserve.wire.framing import FrameSplitter
from oipserve.wire.messages import Infer, InferDone, Release, ToWorker


class _Timer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _Future:
    def __init__(self) -> None:
        self.result: object = None

    def done(self) -> bool:
        return self.result is not None

    def set_result(self, result: object) -> None:
        self.result = result


class _Loop:
    """A loop whose clock the test moves: callbacks run when ``run_until`` reaches them."""

    def __init__(self) -> None:
        self.start = self.now = 1000.0  # (a monotonic clock's time: never 0)
        self.soon: list[Callable[[], None]] = []
        self.timers: list[_Timer] = []
        #: Every timer's delay, as asked.
        self.delays: list[float] = []

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def create_future(self) -> _Future:
        return _Future()

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        self.delays.append(delay)
        timer = _Timer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def run_until(self, when: float) -> None:
        """Run what is due up to ``when`` seconds from the start (the loop iteration's
        callbacks first, then the timers in order, those they arm too)."""
        when += self.start
        while self.soon:
            self.soon.pop(0)()
        due = [t for t in self.timers if t.when <= when and not t.cancelled]
        while due:
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = timer.when
            timer.callback()
            due = [t for t in self.timers if t.when <= when and not t.cancelled]
        self.now = when


def _link() -> tuple[WorkerLink, _Loop, list[list[object]]]:
    """A live link on a loop the test drives; each write, decoded."""
    link = WorkerLink(1, "cpu", "oipserve-0-w1-")
    loop = _Loop()
    writes: list[list[object]] = []
    decoder = msgspec.msgpack.Decoder(ToWorker)

    def write(data: bytes) -> None:
        writes.append([decoder.decode(body) for body in FrameSplitter().feed(data)])

    link.alive, link._loop = True, loop  # type: ignore[assignment]
    link.transport = SimpleNamespace(write=write)  # type: ignore[assignment]
    return link, loop, writes


def _infer(rid: int) -> Infer:
    return Infer(rid, "simple/1", [], [], [], [])


def test_a_release_rides_with_the_next_request() -> None:
    link, loop, writes = _link()
    link.send(Release(["out-1"]), urgent=False)
    loop.run_until(LAZY_FLUSH / 2)
    assert writes == []
    link.send(_infer(1))
    loop.run_until(LAZY_FLUSH * 3)
    assert writes == [[Release(["out-1"]), _infer(1)]]


def test_a_release_no_request_came_for_goes_alone_after_the_lazy_delay() -> None:
    link, loop, writes = _link()
    link.send(Release(["out-1"]), urgent=False)
    loop.run_until(LAZY_FLUSH * 0.9)
    assert writes == []
    loop.run_until(LAZY_FLUSH)
    assert writes == [[Release(["out-1"])]]


@pytest.mark.parametrize("every", [0.4, 0.6, 0.9])
def test_requests_every_while_carry_every_release(every: float) -> None:
    """One request every ``every`` of the delay, each answered by a Release: the Releases
    ride with the requests, none is written alone (a timer left armed by one that rode
    wrote a later one alone, waking a sleeping worker for it)."""
    link, loop, writes = _link()
    for rid in range(1, 11):
        loop.run_until(rid * LAZY_FLUSH * every)
        link.send(_infer(rid))
        loop.run_until(rid * LAZY_FLUSH * every + LAZY_FLUSH * 0.1)  # its reply
        link.send(Release([f"out-{rid}"]), urgent=False)
    loop.run_until(11 * LAZY_FLUSH * every - LAZY_FLUSH * 0.05)
    assert all(isinstance(message, Infer) for write in writes for message in write[-1:])
    assert [len(write) for write in writes] == [1] + [2] * 9


def _second_release_at(link: WorkerLink, loop: _Loop, at: float) -> None:
    """A Release that arms the timer (due at 1.0 delay) and rides with a request at 0.05;
    then another Release at ``at`` delays, while that timer is still armed."""
    link.send(Release(["out-1"]), urgent=False)
    loop.run_until(LAZY_FLUSH * 0.05)
    link.send(_infer(1))
    loop.run_until(LAZY_FLUSH * at)
    link.send(Release(["out-2"]), urgent=False)


def test_the_lazy_timer_is_never_set_for_a_short_remainder() -> None:
    """When the timer goes off with a Release that has waited most of the delay, it is
    set again for half the delay, not the remainder: uvloop runs a timer under 0.5 ms at
    the next loop iteration, so a timer for the rest would keep the loop turning until
    then. (Times in delays.)"""
    link, loop, writes = _link()
    _second_release_at(link, loop, 0.75)
    loop.run_until(LAZY_FLUSH * 1.5)  # at 1.0 out-2 had 0.75 left: the timer moved on
    assert writes == [[Release(["out-1"]), _infer(1)]]
    link.send(_infer(2))  # out-2 rides along; at 1.75 nothing waits: no timer
    loop.run_until(LAZY_FLUSH * 2.0)
    link.send(Release(["out-3"]), urgent=False)  # the timer: due at 3.0
    loop.run_until(LAZY_FLUSH * 2.1)
    link.send(_infer(3))  # out-3 rides along
    loop.run_until(LAZY_FLUSH * 2.2)
    link.send(Release(["out-4"]), urgent=False)
    loop.run_until(LAZY_FLUSH * 3.4)  # at 3.0 out-4 had 0.2 left: the timer, for 0.5
    assert writes[-1] == [Release(["out-3"]), _infer(3)]
    loop.run_until(LAZY_FLUSH * 3.5)
    assert writes[-1] == [Release(["out-4"])]
    assert min(loop.delays) >= LAZY_FLUSH / 2


def test_a_release_that_waited_most_of_the_delay_still_rides_with_the_next_request() -> None:
    """The timer goes off for an earlier Release (which rode along) while a later one has
    waited 0.7 of the delay: set again for half the delay, it lets the request that comes
    0.9 after that one carry it. (Writing what had waited half the delay at once woke
    the worker for it every other call at ~1 ms between calls.)"""
    link, loop, writes = _link()
    _second_release_at(link, loop, 0.3)
    loop.run_until(LAZY_FLUSH * 1.2)  # at 1.0 out-2 had 0.3 left: the timer, for 0.5
    link.send(_infer(2))
    loop.run_until(LAZY_FLUSH * 3)
    assert writes == [[Release(["out-1"]), _infer(1)], [Release(["out-2"]), _infer(2)]]


def _ids(writes: list[list[object]]) -> list[int]:
    return [m.rid for write in writes for m in write if isinstance(m, Infer)]


def test_request_ids_are_taken_again_once_answered() -> None:
    """An answered request's id is given again (ints up to 256 are no new objects), never
    one a pending request has; with half of them pending, ids count on past them."""
    link, loop, writes = _link()
    link.call(_infer)  # stays pending throughout
    for _ in range(3 * SMALL_RIDS):
        link.call(_infer)
        loop.run_until(0)
        link.on_message(InferDone(_ids(writes)[-1], "out-1", [], []))
    ids = _ids(writes)
    assert max(ids) == SMALL_RIDS
    assert ids[0] not in ids[1:]
    for _ in range(SMALL_RIDS):  # none answered
        link.call(_infer)
    loop.run_until(0)
    pending = _ids(writes)[len(ids) :]
    assert len(set(pending)) == len(pending)
    assert max(pending[: SMALL_RIDS // 2 - 1]) <= SMALL_RIDS  # (the first one is pending too)
    assert pending[SMALL_RIDS // 2 - 1 :] == list(range(SMALL_RIDS + 1, SMALL_RIDS * 3 // 2 + 2))
