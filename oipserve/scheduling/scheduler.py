"""The dynamic batcher of one model version: Triton's queue, policies and batch formation.

```
 REST ─┐                    ┌─ level 1: [r7 r9 ...] (+ DELAYed)          ┌─▶ instance A
       ├─▶ enqueue() ─▶ queue┤                            ─▶ form batch ─┤   (a worker)
 gRPC ─┘   (full: 503)      └─ level N: [r3 ...]                         └─▶ instance B
                              timeouts: a timer per request                 (a batch each)
```

Requests wait in one queue per priority level (level 1 first, FIFO within a level). A
level's queue exists only while it holds requests: ``priority_levels`` is a number a
configuration may make large, and what the batcher keeps and walks is sized by the
requests queued, never by the levels configured.
Whenever an instance of the model is free, the batcher walks the queue in that order and
gathers requests while they fit (batch elements ≤ max_batch_size) and agree with the
first on their ``signature`` (every input's dims but the first, datatypes, the inputs
present; not the outputs asked for, as in Triton); it fires, as Triton's
``GetDynamicBatch`` does (``form``):

- the best batch (the last preferred size reached, or what was gathered before the first
  request that would pass the largest preferred size) while the oldest request is within
  its delay, and always with a delay of 0;
- otherwise all it gathered, when the walk stopped at a request that does not fit (too
  large, or another signature), reached the largest preferred size, or the delay is 0
  or over;
- otherwise it sleeps until that delay runs out, or until a request arrives.

A request whose queue timeout expires is answered at that moment (a timer per request,
so a busy instance never delays the answer) with 503 ``Request timeout expired``
(REJECT), or moved behind the requests of its level that have not timed out (DELAY). A
request whose caller went away (its future cancelled) is dropped before it runs. With
``preserve_ordering``, answers are handed back in the order requests arrived.

The batcher knows nothing of tensors: ``execute(entries, instance)`` runs one batch and
returns one result per entry (``oipserve.dataplane.batch_io`` assembles and splits the tensors).
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any, Final, Protocol

from mypy_extensions import mypyc_attr

from oipserve.errors import Unavailable
from oipserve.scheduling.policy import BatchPolicy
from oipserve.scheduling.precise_timer import PreciseTimer

__all__ = ["Admission", "DynamicBatcher", "Entry", "PendingGauge", "QueueRejected"]

log = logging.getLogger("oipserve.scheduler")

#: How often a batcher with queued requests but no live instance (its worker is being
#: replaced) looks again.
_NO_INSTANCE_POLL: Final = 0.1

_QUEUED, _TAKEN, _GONE = 0, 1, 2


class PendingGauge(Protocol):
    """Where a batcher counts its queued requests (``stats.ModelStats`` is one)."""

    pending: int


class _Count:
    pending = 0


class Admission(Protocol):
    """A model's own bound on what joins a batch, past the signature (padded batching's
    waste bound): ``first`` starts a batch with a request, ``admit`` says whether the next
    one may join it (and counts it in only then)."""

    def first(self, request: Any) -> None: ...

    def admit(self, request: Any) -> bool: ...


class QueueRejected(Unavailable):
    """The queue refused or dropped the request (full, or its timeout expired)."""


class _Level:
    """The queue of one priority level that holds requests (made when its first arrives)."""

    __slots__ = ("queue", "delayed", "queued")

    def __init__(self) -> None:
        #: In arrival order; entries that left (taken, withdrawn, DELAYed) are skipped.
        self.queue: deque[Entry] = deque()
        #: Entries whose DELAY timeout expired, served after the others of the level.
        self.delayed: deque[Entry] = deque()
        #: Entries of the level still queued.
        self.queued = 0


class Entry:
    """One request in the queue, and where its answer goes."""

    __slots__ = (
        "request",
        "batch",
        "signature",
        "level",
        "enqueued_ns",
        "future",
        "seq",
        "state",
        "delayed",
        "timer",
        "due_ns",
        "crossed",
    )

    def __init__(
        self,
        request: Any,
        batch: int,
        signature: Hashable,
        level: int,
        future: asyncio.Future[Any],
        seq: int,
    ) -> None:
        #: What ``execute`` needs to run it (opaque here).
        self.request = request
        #: Batch elements it holds (its inputs' first dimension; 1 without batching).
        self.batch = batch
        self.signature = signature
        self.level = level
        self.enqueued_ns = time.monotonic_ns()
        self.future = future
        self.seq = seq
        self.state = _QUEUED
        #: Its DELAY timeout expired: it now waits behind its level's other requests.
        self.delayed = False
        self.timer: asyncio.TimerHandle | None = None
        #: When its queue timeout expires (monotonic ns; 0: it has none).
        self.due_ns = 0
        #: Another front took it: the flush of what crosses back there, called once its
        #: batch's crossed answers are out, before this front's own (``_dispatch``).
        self.crossed: Callable[[], None] | None = None


#: The loop's timers count whole milliseconds and round to the nearest (uvloop): one
#: may fire up to this much early. A timeout found early is set again for what is left,
#: plus this, so that it fires at or after its time.
_HALF_MS: Final = 0.0005

#: The last seconds of a queue delay are waited out going round the loop, not asleep:
#: waking a sleeping process costs tens of µs here (more in a VM), and a batch that
#: fires late costs every request in it. Measured: docs/scheduler.md.
SPIN_WINDOW: Final = 100e-6
_SPIN_WINDOW_NS: Final = 100_000


# NOTE: compiled (mypyc); the unit tests extend it to count its walks and looks.
@mypyc_attr(allow_interpreted_subclasses=True)
class DynamicBatcher:
    """Queue and batch formation for one model version; one batch per free instance."""

    def __init__(
        self,
        name: str,
        policy: BatchPolicy,
        instances: Callable[[], list[Any]],
        execute: Callable[[list[Entry], Any], Awaitable[list[Any]]],
        discard: Callable[[Any], None],
        gauge: PendingGauge | None = None,
        layout: Any = None,
        admission: Admission | None = None,
    ) -> None:
        """``instances()`` lists the instances that can run the model now; ``execute`` runs
        a batch on one and returns a result per entry; ``discard(result)`` frees a result
        whose caller went away; ``gauge.pending`` counts the queued requests (Triton's
        pending request count: the statistics read it from there). ``layout`` is opaque
        here: what the caller keeps with the batcher of a model whose batches it lays out
        its own way (ragged or padded batching); None for the ordinary layout.
        ``admission``, when given, may refuse a request a batch (it then starts the next)."""
        self.name = name
        self.layout = layout
        self._admission = admission
        self.policy = policy
        self._instances = instances
        self._execute = execute
        self._discard = discard
        #: The levels that hold requests, and their numbers in service order.
        self._levels: dict[int, _Level] = {}
        self._order: list[int] = []
        #: The last level emptied, kept for the next one needed: a batcher whose queue
        #: runs empty after each batch makes no new level each time.
        self._spare: _Level | None = None
        self._gauge: PendingGauge = gauge if gauge is not None else _Count()
        self._busy: set[int] = set()
        # PERF: asyncio.get_running_loop() (and asyncio.Event.wait) make a getpid()
        #   system call each time; the loop is looked up once, and the batcher sleeps on
        #   a plain future that _wake() resolves.
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        #: Wakes the batcher when a partial batch's queue delay is over (to the µs: the
        #: loop's own timers count whole milliseconds, see precise_timer.py).
        self._delay_timer = PreciseTimer(self._loop, self._timer_fired)
        #: When the delay timer is set to fire (monotonic ns), 0 when it is not set.
        self._armed_ns = 0
        self._next_seq = 0
        self._deliver_seq = 0
        self._finished: dict[int, tuple[Entry, Any, BaseException | None]] = {}
        self._dispatches: set[asyncio.Task[None]] = set()
        self._closed = False
        self._closed_error = Unavailable(f"model '{name}' is being unloaded")
        # PERF: the policy's values a request or a batch reads, read once here: the policy
        #   is a msgspec Struct, whose methods run interpreted (a call from compiled code
        #   each, ~4 a request). Its rules are the policy's (level, policy, timeout_ns).
        self._largest = policy.largest_batch
        self._delay_ns = policy.max_queue_delay_ns
        self._preserve = policy.preserve_ordering
        self._level_count = policy.priority_levels
        self._default_level = policy.default_priority_level
        #: No level has a policy of its own, and the default one bounds nothing (no
        #: timeout, no queue size): a request then reads no queue policy at all.
        default = policy.default_queue_policy
        self._unbounded = not (
            policy.level_policies or default.default_timeout_ns or default.max_queue_size
        )
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._largest_preferred = (
            policy.preferred_batch_sizes[-1] if policy.preferred_batch_sizes else self._largest
        )
        # (in a context of its own: made at its model's first request, it would carry that
        #  request's, and its batches would count against that client's connection:
        #  ``runtime.abandoned_work``)
        self._task = self._loop.create_task(
            self._run(), name=f"batcher {name}", context=contextvars.Context()
        )
        self._task.add_done_callback(self._stopped)

    @property
    def queued(self) -> int:
        """Requests waiting, not yet in a batch."""
        return self._gauge.pending

    # ---- the callers' side ---------------------------------------------------------

    def enqueue(
        self,
        request: Any,
        batch: int,
        signature: Hashable,
        priority: int,
        timeout_us: int,
        crossed: Callable[[], None] | None = None,
    ) -> Entry:
        """Queue a request; ``entry.future`` resolves to its result. The caller awaits it
        and calls ``withdraw(entry)`` whenever that await ends in an error (cancelled, or
        failed by the caller's deadline): the request then leaves the queue at once.
        ``crossed``: another front took the request (``scaleout.batch_desk``): its batch
        answers it before this front's own, and then calls ``crossed`` (``_dispatch``).

        Raises QueueRejected at once when its level's queue is full.

        PERF: no done callback on the future: it cost every request a partial, a callback
        scheduled when its answer is set and a loop step to run it, to catch the rare one
        that goes away while queued.
        """
        if self._closed:
            raise self._closed_error
        # (BatchPolicy.level's rule)
        level = self._default_level if priority == 0 or priority > self._level_count else priority
        held = self._levels.get(level)
        timeout_ns = 0
        if not self._unbounded:
            policy = self.policy.policy(level)
            size = policy.max_queue_size
            if size and held is not None and held.queued >= size:
                raise QueueRejected("Exceeds maximum queue size")
            timeout_ns = policy.timeout_ns(timeout_us)
        loop = self._loop
        entry = Entry(request, batch, signature, level, loop.create_future(), self._next_seq)
        entry.crossed = crossed
        self._next_seq += 1
        if timeout_ns:
            entry.due_ns = entry.enqueued_ns + timeout_ns
            entry.timer = loop.call_later(timeout_ns / 1e9, self._expire, entry)
        if held is None:
            held = self._levels[level] = self._spare or _Level()
            self._spare = None
            bisect.insort(self._order, level)
        held.queue.append(entry)
        held.queued += 1
        self._gauge.pending += 1
        self._wake()
        return entry

    def close(self, error: Unavailable | None = None) -> None:
        """Answer every queued request 503 (``error``) and stop forming batches; running
        ones finish."""
        self._closed = True
        error = error or Unavailable(f"model '{self.name}' is being unloaded")
        self._closed_error = error
        for held in list(self._levels.values()):
            for entry in (*held.queue, *held.delayed):
                if entry.state == _QUEUED:
                    self._leave_queue(entry)
                    self._answer(entry, None, error)
        self._task.cancel()

    # ---- leaving the queue -----------------------------------------------------------

    def _leave_queue(self, entry: Entry) -> None:
        entry.state = _GONE
        held = self._levels[entry.level]
        held.queued -= 1
        if not held.queued:
            # Whatever its deques still hold has left the queue: the level goes with them.
            del self._levels[entry.level]
            del self._order[bisect.bisect_left(self._order, entry.level)]
            held.queue.clear()
            held.delayed.clear()
            self._spare = held
        self._gauge.pending -= 1
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None

    def withdraw(self, entry: Entry) -> None:
        """The caller gave up on an ``enqueue``d request: it leaves the queue if it is still
        there (nothing happens to one already in a batch or answered)."""
        if entry.state == _QUEUED:
            self._leave_queue(entry)
            self._skip_in_order(entry)

    def _expire(self, entry: Entry) -> None:
        entry.timer = None
        if entry.state != _QUEUED:
            return
        early_ns = entry.due_ns - time.monotonic_ns()
        if early_ns > 0:
            entry.timer = self._loop.call_later(early_ns / 1e9 + _HALF_MS, self._expire, entry)
            return
        if self.policy.policy(entry.level).timeout_action == "DELAY":
            if not entry.delayed:
                entry.delayed = True
                self._levels[entry.level].delayed.append(entry)
            return
        self._leave_queue(entry)
        self._answer(entry, None, QueueRejected("Request timeout expired"))

    # ---- answers, in order when asked to -------------------------------------------

    def _answer(self, entry: Entry, result: Any, error: BaseException | None) -> None:
        if not self._preserve:
            self._settle(entry, result, error)
            return
        self._finished[entry.seq] = (entry, result, error)
        self._flush_in_order()

    def _skip_in_order(self, entry: Entry) -> None:
        if self._preserve:
            self._finished[entry.seq] = (entry, None, None)
            self._flush_in_order()

    def _flush_in_order(self) -> None:
        while self._deliver_seq in self._finished:
            entry, result, error = self._finished.pop(self._deliver_seq)
            self._deliver_seq += 1
            self._settle(entry, result, error)

    def _settle(self, entry: Entry, result: Any, error: BaseException | None) -> None:
        future = entry.future
        if future.done():  # the caller went away meanwhile
            if result is not None:
                self._discard(result)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    # ---- batch formation ---------------------------------------------------------------

    def _walk(self) -> Iterator[Entry]:
        """Queued requests in service order: level 1 first; per level FIFO, DELAYed last."""
        for number in self._order:
            held = self._levels[number]
            queue, delayed = held.queue, held.delayed
            while queue and (queue[0].state != _QUEUED or queue[0].delayed):
                queue.popleft()
            for entry in queue:
                if entry.state == _QUEUED and not entry.delayed:
                    yield entry
            while delayed and delayed[0].state != _QUEUED:
                delayed.popleft()
            for entry in delayed:
                if entry.state == _QUEUED:
                    yield entry

    def form(self, now_ns: int) -> tuple[list[Entry], int | None]:
        """The batch to run now (may be empty) and, if none, when to look again (ns).

        Triton's ``GetDynamicBatch``, rule for rule. The walk gathers requests while
        they fit ``max_batch_size`` and share the first one's signature. ``best`` is
        the batch a preferred size gave, or the batch gathered before the first request
        that would take it past the largest preferred size: within the delay (and
        always with a delay of 0) that is what fires, even when more were gathered. Past
        the delay, or with no ``best``, everything gathered fires when the walk stopped
        at a request that does not fit, reached the largest preferred size, or the delay
        is 0 or over; otherwise the batcher waits for the oldest request's delay.
        """
        limit = self._largest
        largest_preferred = self._largest_preferred
        preferred = self._preferred
        taken: list[Entry] = []
        total = 0
        best = 0
        send_now = False
        settled = False
        signature: Hashable = None
        gate = self._admission
        for entry in self._walk():
            if not taken:
                signature = entry.signature
                if gate is not None:
                    gate.first(entry.request)
            else:
                grown = total + entry.batch
                # NOTE: Triton marks the cap and walks on: past the delay, what was
                #   gathered beyond it fires with the rest.
                if grown > largest_preferred and not best:
                    best = len(taken)
                if (
                    grown > limit
                    or entry.signature != signature
                    or (gate is not None and not gate.admit(entry.request))
                ):
                    send_now = True
                    break
            taken.append(entry)
            total += entry.batch
            if total in preferred:
                best = len(taken)
            if best and total >= largest_preferred and not settled:
                settled = True
                if self._best_is_final(taken[0], now_ns):
                    break
        if not taken:
            return [], None
        delay = self._delay_ns
        deadline = min(e.enqueued_ns for e in taken) + delay
        exceeded = delay != 0 and now_ns >= deadline
        if best and not exceeded:
            return taken[:best], None
        if send_now or total >= largest_preferred or exceeded or not delay:
            return taken, None
        return [], deadline

    def _best_is_final(self, first: Entry, now_ns: int) -> bool:
        """Whether the rest of the walk can no longer change what ``form`` fires, once the
        best batch is known and the rows reached the largest preferred size.

        PERF: Triton walks on up to ``max_batch_size``, and so did this, but what lies
        past the largest preferred size fires only past the delay: a large
        max_batch_size with small preferred sizes made every batch walk hundreds of
        requests to fire a few. The walk stops when the delay cannot be over: it is 0, or
        the requests come in arrival order (one level, none DELAYed: later ones are
        younger) and the first is within it. With levels or DELAYed requests an older
        one may follow, and the walk goes on, as Triton's.
        """
        delay = self._delay_ns
        if not delay:
            return True
        if len(self._order) != 1 or self._levels[self._order[0]].delayed:
            return False
        return now_ns - first.enqueued_ns < delay

    # ---- the loop --------------------------------------------------------------------

    def _free_instance(self) -> Any | None:
        for instance in self._instances():
            if id(instance) not in self._busy:
                return instance
        return None

    def _timer_fired(self) -> None:
        self._armed_ns = 0
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _run(self) -> None:
        loop = self._loop
        while True:
            timeout: float | None = None
            due = 0
            if self._gauge.pending:
                instance = self._free_instance()
                if instance is None:
                    if not self._instances():
                        timeout = _NO_INSTANCE_POLL
                else:
                    now = time.monotonic_ns()
                    batch, again = self.form(now)
                    if batch:
                        self._start(batch, instance)
                        continue
                    if again is not None:
                        due = again
                        timeout = (again - now) / 1e9
            # NOTE: nothing can wake the batcher between its look above and this wait:
            #   arrivals and finished batches run while it is suspended here.
            self._waiter = waiter = loop.create_future()
            if timeout is None:
                await waiter
                continue
            # PERF: it sleeps on a timer of its own: not asyncio.wait_for, which makes a
            #   task per wait (the batcher waits once per arrival under load), nor the loop's
            #   call_later, which counts whole milliseconds (precise_timer.py). The last
            #   SPIN_WINDOW of a wait it goes round the loop instead.
            #   The timer stays set across the arrivals that wake the batcher meanwhile
            #   (set again only when the due time moves): were it set and unset around
            #   each wait, each would cost two ctypes calls. Left set after a batch that
            #   filled up first, it wakes the batcher once for nothing, which looks again.
            if timeout <= SPIN_WINDOW:
                loop.call_soon(self._wake)
                await waiter
                continue
            if not due:  # no instance yet: polled
                due = time.monotonic_ns() + int(timeout * 1e9)
            due -= _SPIN_WINDOW_NS
            if due != self._armed_ns:
                self._delay_timer.arm_at(due)
                self._armed_ns = due
            await waiter

    def _stopped(self, task: asyncio.Task[None]) -> None:
        """The loop ended: by close(), or by a bug, which must not leave callers waiting."""
        self._delay_timer.close()
        if not task.cancelled() and task.exception() is not None:
            log.error("the batcher of %s failed", self.name, exc_info=task.exception())
            self.close()

    def _start(self, batch: list[Entry], instance: Any) -> None:
        for entry in batch:
            self._leave_queue(entry)
            entry.state = _TAKEN
        self._busy.add(id(instance))
        task = self._loop.create_task(self._dispatch(batch, instance))
        self._dispatches.add(task)
        task.add_done_callback(self._dispatches.discard)

    async def _dispatch(self, batch: list[Entry], instance: Any) -> None:
        try:
            results = await self._execute(batch, instance)
        except Exception as exc:
            for entry in batch:
                self._answer(entry, None, exc)
        else:
            # NOTE: the answers that cross to another front first: their done callbacks then
            #   run first in the loop's next turn and queue them (``batch_desk``), the flush
            #   of each front they cross to runs next and writes them, and that front
            #   writes to its clients while this one writes to its own. Behind this front's
            #   responses, at c=16 over two fronts, their next requests came too late for
            #   the next batch (docs/scaling.md, "Batches formed across fronts").
            flushes: list[Callable[[], None]] = []
            for entry, result in zip(batch, results, strict=True):
                flush = entry.crossed
                if flush is not None:
                    self._answer(entry, result, None)
                    if flush not in flushes:
                        flushes.append(flush)
            for flush in flushes:
                self._loop.call_soon(flush)
            for entry, result in zip(batch, results, strict=True):
                if entry.crossed is None:
                    self._answer(entry, result, None)
        finally:
            self._busy.discard(id(instance))
            self._wake()
