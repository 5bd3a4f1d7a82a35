"""The dynamic batcher's queue, policies and batch formation (oipserve.scheduling.scheduler)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop

from oipserve.errors import Unavailable
from oipserve.runtime.abandoned_work import ABANDONED_WORK, AbandonedWork
from oipserve.scheduling import precise_timer
from oipserve.scheduling.policy import BatchPolicy, QueuePolicy
from oipserve.scheduling.scheduler import SPIN_WINDOW, DynamicBatcher, Entry, QueueRejected
from tests.support.batcher_calls import submit


class Instance:
    """A fake model instance: records each batch and finishes it when told to."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[list[Any]] = []
        self.gates: list[asyncio.Event] = []
        self.hold = False


class CountingBatcher(DynamicBatcher):
    """The batcher, counting the entries its walks visit and noting when it looks at its
    queue (``form``)."""

    visited = 0
    looks: list[int]

    def _walk(self) -> Iterator[Entry]:
        for entry in super()._walk():
            self.visited += 1
            yield entry

    def form(self, now_ns: int) -> tuple[list[Entry], int | None]:
        self.looks.append(time.monotonic_ns())
        return super().form(now_ns)


class Harness:
    def __init__(self, policy: BatchPolicy, instances: int = 1) -> None:
        self.instances = [Instance(f"i{n}") for n in range(instances)]
        self.discarded: list[Any] = []
        self.fail: Exception | None = None
        self.batcher = CountingBatcher(
            "m", policy, lambda: self.instances, self.execute, self.discarded.append
        )
        self.batcher.looks = []

    async def execute(self, entries: list[Entry], instance: Instance) -> list[Any]:
        instance.batches.append([e.request for e in entries])
        gate = asyncio.Event()
        instance.gates.append(gate)
        if instance.hold:
            await gate.wait()
        else:
            await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return [f"done {e.request}" for e in entries]

    def submit(
        self,
        name: str,
        batch: int = 1,
        sig: str = "s",
        priority: int = 0,
        timeout_us: int = 0,
        crossed: Callable[[], None] | None = None,
    ) -> asyncio.Future[Any]:
        return submit(self.batcher, name, batch, sig, priority, timeout_us, crossed)

    def executed(self) -> list[list[Any]]:
        return [b for i in self.instances for b in i.batches]


def policy(**kwargs: Any) -> BatchPolicy:
    kwargs.setdefault("max_batch_size", 8)
    kwargs.setdefault("preferred_batch_sizes", (kwargs["max_batch_size"],))
    return BatchPolicy(**kwargs)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_requests_that_pile_up_while_the_instance_is_busy_form_one_batch() -> None:
    h = Harness(policy())
    h.instances[0].hold = True
    first = h.submit("a")
    await settle()
    rest = [h.submit(n) for n in "bcd"]
    await settle()
    assert h.executed() == [["a"]]  # delay 0: a ran alone at once
    h.instances[0].gates[0].set()
    await settle()
    assert h.executed() == [["a"], ["b", "c", "d"]]
    h.instances[0].gates[1].set()
    assert await first == "done a"
    assert await asyncio.gather(*rest) == ["done b", "done c", "done d"]


async def test_batch_elements_count_and_a_request_that_does_not_fit_starts_the_next() -> None:
    h = Harness(policy(max_batch_size=4))
    h.instances[0].hold = True
    h.submit("x")
    await settle()
    futures = [h.submit("a", 3), h.submit("b", 3), h.submit("c", 1)]
    await settle()
    for _ in range(3):
        h.instances[0].gates[-1].set()
        await settle()
    assert h.executed() == [["x"], ["a"], ["b", "c"]]
    h.instances[0].gates[-1].set()
    await asyncio.gather(*futures)


async def test_another_signature_is_not_an_error_it_starts_the_next_batch() -> None:
    h = Harness(policy())
    h.instances[0].hold = True
    h.submit("x")
    await settle()
    futures = [h.submit("a1", sig="a"), h.submit("a2", sig="a"), h.submit("b1", sig="b")]
    futures.append(h.submit("a3", sig="a"))
    await settle()
    for _ in range(3):
        h.instances[0].gates[-1].set()
        await settle()
    assert h.executed() == [["x"], ["a1", "a2"], ["b1"], ["a3"]]
    h.instances[0].gates[-1].set()
    await asyncio.gather(*futures)


async def test_the_delay_waits_for_a_fuller_batch_then_fires_what_it_has() -> None:
    h = Harness(policy(max_queue_delay_ns=60_000_000))
    started = time.monotonic()
    futures = [h.submit("a"), h.submit("b")]
    await asyncio.sleep(0.02)
    assert h.executed() == []  # within the delay, 2 < 8: it waits
    assert await asyncio.gather(*futures) == ["done a", "done b"]
    assert h.executed() == [["a", "b"]]
    assert time.monotonic() - started >= 0.055


async def test_the_delay_timer_is_set_once_for_a_deadline_not_at_each_arrival(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each arrival wakes the batcher; the partial batch's deadline stays the oldest
    request's, and the timer set for it stays set (it was set and unset at each wake)."""
    sets: list[int] = []
    settime = precise_timer._timerfd_settime

    def counted(fd: int, flags: int, new: Any, old: Any) -> int:
        sets.append(flags)
        return settime(fd, flags, new, old)  # type: ignore[no-any-return]

    monkeypatch.setattr(precise_timer, "_timerfd_settime", counted)
    h = Harness(policy(max_queue_delay_ns=60_000_000))
    futures = []
    for name in "abcd":
        futures.append(h.submit(name))
        await asyncio.sleep(0.005)
    assert await asyncio.gather(*futures) == ["done a", "done b", "done c", "done d"]
    assert h.executed() == [["a", "b", "c", "d"]]
    assert len(sets) == 1, sets


async def test_a_preferred_size_fires_at_once_within_the_delay() -> None:
    h = Harness(policy(preferred_batch_sizes=(2, 4), max_queue_delay_ns=10_000_000_000))
    futures = [h.submit(n) for n in "abc"]
    await settle()
    assert h.executed()[0] == ["a", "b"]  # cut at the best preferred size
    await asyncio.gather(*futures[:2])
    assert h.batcher.queued == 1
    h.batcher.close()
    with pytest.raises(Unavailable, match="being unloaded"):
        await futures[2]


async def test_largest_preferred_size_fires_at_once() -> None:
    h = Harness(policy(max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_ns=10**10))
    futures = [h.submit(n) for n in "abcde"]
    await settle()
    assert h.executed()[0] == ["a", "b", "c", "d"]
    h.batcher.close()
    await asyncio.gather(*futures[:4])


async def _queued_behind_a_busy_instance(h: Harness, sizes: list[int]) -> None:
    """Queue one request of each size while the only instance runs another (of 2: a
    preferred size in these tests, so it does not wait for the delay)."""
    h.instances[0].hold = True
    h.submit("running", 2)
    await settle()
    for n, size in enumerate(sizes):
        h.submit(f"r{n}", size)
    await settle()


async def test_with_no_delay_the_best_preferred_size_is_cut() -> None:
    """Triton's test_preferred_batch_only_unaligned: preferred [4, 6], delay 0, five
    requests of 1 queued: 4 run, then 1 (not all 5 at once)."""
    h = Harness(policy(preferred_batch_sizes=(4, 6)))
    await _queued_behind_a_busy_instance(h, [1] * 5)
    batch, again = h.batcher.form(time.monotonic_ns())
    assert [e.request for e in batch] == ["r0", "r1", "r2", "r3"] and again is None
    h.batcher.close()


async def test_the_largest_preferred_size_caps_a_batch_within_the_delay_only() -> None:
    """Triton's test_multi_batch_sum_gt_max_preferred: preferred [2, 6], 3 then 4 queued:
    3 + 4 passes 6, so within the delay the 3 fire alone; past it, all 7 (max 16)."""
    delay = 10_000_000_000
    h = Harness(policy(max_batch_size=16, preferred_batch_sizes=(2, 6), max_queue_delay_ns=delay))
    await _queued_behind_a_busy_instance(h, [3, 4])
    now = time.monotonic_ns()
    assert [e.request for e in h.batcher.form(now)[0]] == ["r0"]
    assert [e.request for e in h.batcher.form(now + delay)[0]] == ["r0", "r1"]
    h.batcher.close()


async def test_a_preferred_size_reached_before_the_cap_wins() -> None:
    """1, 1, 3, 4 queued, preferred [2, 6]: 2 is preferred; 5 + 4 would pass 6, but the
    cap does not replace a preferred size already found."""
    h = Harness(policy(preferred_batch_sizes=(2, 6), max_queue_delay_ns=10_000_000_000))
    await _queued_behind_a_busy_instance(h, [1, 1, 3, 4])
    assert [e.request for e in h.batcher.form(time.monotonic_ns())[0]] == ["r0", "r1"]
    h.batcher.close()


async def test_the_walk_stops_once_nothing_past_the_largest_preferred_size_can_fire() -> None:
    """max_batch_size 1000, preferred [4]: within the delay the 4 fire, so the walk need
    not visit the 996 behind them (Triton's walks on); past the delay it visits them all."""
    delay = 10_000_000_000
    h = Harness(policy(max_batch_size=1000, preferred_batch_sizes=(2, 4), max_queue_delay_ns=delay))
    await _queued_behind_a_busy_instance(h, [1] * 1000)
    h.batcher.visited = 0
    now = time.monotonic_ns()
    assert len(h.batcher.form(now)[0]) == 4 and h.batcher.visited <= 5
    h.batcher.visited = 0
    assert len(h.batcher.form(now + delay)[0]) == 1000 and h.batcher.visited == 1000
    h.batcher.close()


async def test_full_queue_is_rejected_at_once() -> None:
    h = Harness(policy(default_queue_policy=QueuePolicy(max_queue_size=2)))
    h.instances[0].hold = True
    h.submit("running")
    await settle()
    h.submit("q1")
    h.submit("q2")
    with pytest.raises(QueueRejected, match="Exceeds maximum queue size"):
        h.submit("q3")
    assert h.batcher.queued == 2


async def test_reject_timeout_answers_when_it_expires_even_with_the_instance_busy() -> None:
    h = Harness(policy(default_queue_policy=QueuePolicy(default_timeout_ns=30_000_000)))
    h.instances[0].hold = True
    h.submit("running")
    await settle()
    waiting = h.submit("late")
    started = time.monotonic()
    with pytest.raises(QueueRejected, match="^Request timeout expired$"):
        await waiting
    assert 0.025 <= time.monotonic() - started < 1.0
    assert h.batcher.queued == 0
    h.instances[0].gates[0].set()
    await settle()
    assert h.executed() == [["running"]]  # the timed-out request never ran


async def test_delay_timeout_moves_the_request_behind_its_level() -> None:
    delay = QueuePolicy(timeout_action="DELAY", default_timeout_ns=20_000_000)
    h = Harness(policy(max_batch_size=1, default_queue_policy=delay))
    h.instances[0].hold = True
    h.submit("running", timeout_us=0)
    await settle()
    old = h.submit("old")
    await asyncio.sleep(0.04)  # old's timeout expired: DELAYed
    fresh = submit(h.batcher, "fresh", 1, "s", 0, 0)
    for _ in range(3):
        h.instances[0].gates[-1].set()
        await settle()
    assert h.executed() == [["running"], ["fresh"], ["old"]]
    await asyncio.gather(old, fresh)


async def test_a_cancelled_request_never_runs() -> None:
    h = Harness(policy())
    h.instances[0].hold = True
    h.submit("running")
    await settle()
    gone = h.submit("gone")
    kept = h.submit("kept")
    gone.cancel()
    await settle()
    assert h.batcher.queued == 1
    h.instances[0].gates[0].set()
    await settle()
    assert h.executed() == [["running"], ["kept"]]
    h.instances[0].gates[1].set()
    assert await kept == "done kept"


async def test_a_caller_gone_during_execution_gets_its_result_discarded() -> None:
    h = Harness(policy())
    h.instances[0].hold = True
    future = h.submit("a")
    await settle()
    future.cancel()
    h.instances[0].gates[0].set()
    await settle()
    assert h.discarded == ["done a"]


async def test_an_enqueued_request_withdrawn_while_queued_never_runs_nor_holds_answers() -> None:
    # enqueue: no done callback on the future; the caller withdraws the request itself.
    h = Harness(policy(preserve_ordering=True))
    h.instances[0].hold = True
    running = h.batcher.enqueue("running", 1, "s", 0, 0)
    await settle()
    gone = h.batcher.enqueue("gone", 1, "s", 0, 0)
    kept = h.batcher.enqueue("kept", 1, "s", 0, 0)
    gone.future.cancel()
    h.batcher.withdraw(gone)
    assert h.batcher.queued == 1
    h.batcher.withdraw(running)  # already in a batch: nothing happens to it
    h.instances[0].gates[0].set()
    await settle()
    assert h.executed() == [["running"], ["kept"]]
    h.instances[0].gates[1].set()
    # preserve_ordering: the withdrawn request holds back no later answer
    assert await running.future == "done running"
    assert await kept.future == "done kept"


async def test_priority_levels_serve_level_one_first() -> None:
    h = Harness(policy(max_batch_size=1, priority_levels=2, default_priority_level=2))
    h.instances[0].hold = True
    h.submit("running")
    await settle()
    low = h.submit("low")  # priority 0: the default level, 2
    high = h.submit("high", priority=1)
    for _ in range(3):
        h.instances[0].gates[-1].set()
        await settle()
    assert h.executed() == [["running"], ["high"], ["low"]]
    await asyncio.gather(low, high)


async def test_two_instances_run_two_batches_and_preserve_ordering_holds_answers() -> None:
    h = Harness(policy(max_batch_size=1, preserve_ordering=True), instances=2)
    for instance in h.instances:
        instance.hold = True
    first, second = h.submit("first"), h.submit("second")
    await settle()
    assert sorted(map(tuple, h.executed())) == [("first",), ("second",)]
    by_request = {b[0]: i for i in h.instances for b in i.batches}
    by_request["second"].gates[0].set()  # the later request finishes first
    await settle()
    assert not second.done()  # held until the earlier one is answered
    by_request["first"].gates[0].set()
    await settle()
    assert first.done() and second.done()


async def _answer_order(h: Harness) -> list[str]:
    """Runs a batch of a, b, c, d (b and d taken by another front) behind a running one, and
    gives the order in which their answers were set, and when the other front's flush
    (``Entry.crossed``) was called."""
    h.instances[0].hold = True
    running = h.submit("running")
    await settle()
    answered: list[str] = []

    def flush() -> None:
        answered.append("flush")

    for name in "abcd":
        future = h.submit(name, crossed=flush if name in "bd" else None)
        future.add_done_callback(lambda done: answered.append(done.result()))
    h.instances[0].gates[0].set()
    await settle()
    assert h.executed() == [["running"], ["a", "b", "c", "d"]]
    h.instances[0].gates[1].set()
    await settle()
    assert await running == "done running"
    return answered


async def test_a_batch_answers_the_requests_another_front_took_before_its_own() -> None:
    # Their answers cross back to that front, which writes to its clients meanwhile: they
    # are queued by their futures' callbacks, then written together by the flush, once a
    # batch, before this front's own answers are handled.
    answered = await _answer_order(Harness(policy(max_batch_size=4)))
    assert answered == ["done b", "done d", "flush", "done a", "done c"]


async def test_preserve_ordering_answers_in_arrival_order_whichever_front_took_them() -> None:
    # (the flush finds nothing yet: what is queued later goes at the turn's end)
    answered = await _answer_order(Harness(policy(max_batch_size=4, preserve_ordering=True)))
    assert answered == ["flush", "done a", "done b", "done c", "done d"]


async def test_a_failed_execution_fails_every_request_of_the_batch() -> None:
    h = Harness(policy())
    h.fail = RuntimeError("boom")
    h.instances[0].hold = True
    futures = [h.submit("x")]
    await settle()
    futures += [h.submit("a"), h.submit("b")]
    h.instances[0].gates[0].set()
    await settle()
    h.instances[0].gates[1].set()
    for future in futures:
        with pytest.raises(RuntimeError, match="boom"):
            await future


async def test_requests_wait_while_no_instance_is_alive() -> None:
    h = Harness(policy())
    alive, h.instances = h.instances, []
    future = h.submit("a")
    await asyncio.sleep(0.05)
    assert not future.done()
    h.instances = alive  # a replacement worker came up
    assert await asyncio.wait_for(future, 2) == "done a"


def test_timeout_override_follows_tritons_rule() -> None:
    assert QueuePolicy(default_timeout_ns=0, allow_timeout_override=True).timeout_ns(500) == 0
    policy = QueuePolicy(default_timeout_ns=1_000_000, allow_timeout_override=True)
    assert policy.timeout_ns(500) == 500_000  # shorter: honoured
    assert policy.timeout_ns(5_000) == 1_000_000  # longer: never
    assert QueuePolicy(default_timeout_ns=1_000_000).timeout_ns(500) == 1_000_000


def test_a_sub_millisecond_delay_is_waited_out_asleep_and_in_full() -> None:
    """uvloop's timers count whole milliseconds: 0.4 ms fired at once, so a batcher
    waiting out a short delay went round the loop from the request's arrival to the
    deadline (precise_timer.py). It now sleeps until the last SPIN_WINDOW."""
    delay_ns = 400_000

    async def scenario() -> tuple[list[int], int]:
        h = Harness(policy(max_queue_delay_ns=delay_ns))
        looks = h.batcher.looks
        started = time.monotonic_ns()
        assert await h.submit("a") == "done a"
        waited = time.monotonic_ns() - started
        h.batcher.close()
        await settle()
        return [look - started for look in looks], waited

    looks, waited = uvloop.run(scenario())
    assert waited >= delay_ns
    # NOTE: the first look may come late on a busy machine; from it on, the batcher
    #   sleeps until the deadline's last SPIN_WINDOW.
    asleep_until = delay_ns - SPIN_WINDOW * 1e9
    early = [look for look in looks[1:] if look < asleep_until]
    assert not early or looks[0] >= asleep_until, (
        f"the batcher looked at {early} ns, before {asleep_until:.0f} ns"
    )


def test_a_sub_millisecond_queue_timeout_does_not_expire_early() -> None:
    """uvloop rounds a timer to the nearest millisecond: a 0.3 ms queue timeout fired at
    the next loop iteration and answered "Request timeout expired" at once."""
    timeout_ns = 300_000

    async def scenario() -> int:
        h = Harness(policy(default_queue_policy=QueuePolicy(default_timeout_ns=timeout_ns)))
        h.instances[0].hold = True
        h.submit("busy")
        await settle()
        started = time.monotonic_ns()
        with pytest.raises(QueueRejected, match="Request timeout expired"):
            await h.submit("late")
        answered = time.monotonic_ns() - started
        h.instances[0].gates[0].set()
        h.batcher.close()
        await settle()
        return answered

    assert uvloop.run(scenario()) >= timeout_ns


class ContextHarness(Harness):
    """Notes the abandoned-work count each batch runs with."""

    seen: list[object]

    async def execute(self, entries: list[Entry], instance: Instance) -> list[Any]:
        self.seen.append(ABANDONED_WORK.get())
        return [f"done {e.request}" for e in entries]


async def test_batches_run_outside_the_context_of_the_request_that_made_the_batcher() -> None:
    """The batcher is made at its model's first request, in that request's task: its
    batches ran in that task's context, so a batch's abandoned requests counted against
    that one client's connection (``runtime.abandoned_work``)."""
    token = ABANDONED_WORK.set(AbandonedWork(lambda: None, lambda: None))
    try:
        h = ContextHarness(policy())
    finally:
        ABANDONED_WORK.reset(token)
    h.seen = []
    assert await h.submit("a") == "done a"
    assert h.seen == [None]
