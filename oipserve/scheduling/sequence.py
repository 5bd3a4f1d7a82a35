"""The sequence batcher's bookkeeping, without I/O: sequences, the lanes they stick to, and
which requests form the next batch of a lane.

A *lane* is one instance of a sequence model (one worker that holds it). A sequence gets
a lane and a place on it (a *slot*) at its START and keeps both until its END, its idle
expiry, or the lane's worker stopping; a START with no free place waits in the backlog
for one. A lane runs one batch at a time, with at most one request of each sequence, so
the requests of a sequence run in order and see each other's state.

- ``direct``: a lane has ``max_batch_size`` slots (1 without batching); a batch holds,
  per slot up to the highest one with a request ready, the slot's next request, or an
  empty slot (READY false) where its sequence has none ready (``direct_rows``).
- ``oldest``: a lane has ``max_candidate_sequences`` places; a batch holds the oldest
  ready requests of up to ``max_batch_size`` of them, and fires at a preferred batch size
  or when the oldest has waited ``max_queue_delay`` (``oldest_rows``, ``oldest_due``).

``dataplane.sequenced`` drives these with the event loop, the workers and the timers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Lane", "Sequence", "Step", "direct_due", "direct_rows", "oldest_due", "oldest_rows"]

W = TypeVar("W")


class Step:
    """One request of a sequence waiting for, or in, a batch."""

    __slots__ = ("enqueued_ns", "signature", "ready", "taken")

    def __init__(self, enqueued_ns: int, signature: Hashable) -> None:
        #: When the scheduler got it (``monotonic_ns``): its queue time counts from here.
        self.enqueued_ns = enqueued_ns
        #: What requests of one batch must agree on (inputs, their dims past the first).
        self.signature = signature
        #: False while its inputs are still being made ready (JSON decoded by a worker):
        #: it holds back its sequence, never others.
        self.ready = True
        #: In a batch: it no longer waits.
        self.taken = False


S = TypeVar("S", bound=Step)


class Sequence(Generic[S, W]):
    """One live sequence: its requests in order and where it runs."""

    __slots__ = (
        "handle", "sequence_id", "queue", "lane", "slot", "in_batch", "ending", "end_taken",
    )  # fmt: skip

    def __init__(self, handle: int, sequence_id: int | str) -> None:
        #: The front's number for it, unique in this process (the worker's state key).
        self.handle = handle
        self.sequence_id = sequence_id
        self.queue: deque[S] = deque()
        #: Its lane and place there; None while it waits in the backlog.
        self.lane: Lane[S, W] | None = None
        self.slot = -1
        #: A request of it is in the lane's running batch.
        self.in_batch = False
        #: Its END request was received: no request joins it any more.
        self.ending = False
        #: Its END request went into a batch: the worker frees its state when it runs it.
        self.end_taken = False

    def head(self) -> S | None:
        """Its next request, when one is ready to run."""
        if self.in_batch or not self.queue:
            return None
        step = self.queue[0]
        return step if step.ready else None

    @property
    def idle(self) -> bool:
        return not self.queue and not self.in_batch


class Lane(Generic[S, W]):
    """One instance of the model (a worker) and the places of its sequences."""

    __slots__ = ("worker", "pid", "places", "slots", "busy", "dead")

    def __init__(self, worker: W, pid: int, places: int) -> None:
        self.worker = worker
        #: The worker process it was made for: a restarted worker is a new lane.
        self.pid = pid
        #: How many sequences it may hold (a number of the configuration: the list of
        #: slots grows to it as sequences come, never allocated ahead).
        self.places = places
        self.slots: list[Sequence[S, W] | None] = []
        #: A batch of it is running.
        self.busy = False
        #: Its worker stopped: its sequences failed.
        self.dead = False

    def free_slot(self) -> int:
        """The lowest free place, or -1."""
        for index, held in enumerate(self.slots):
            if held is None:
                return index
        return len(self.slots) if len(self.slots) < self.places else -1

    @property
    def used(self) -> int:
        return sum(held is not None for held in self.slots)

    def take(self, sequence: Sequence[S, W], slot: int) -> None:
        while len(self.slots) <= slot:  # (at most ``places``: free_slot's answer)
            self.slots.append(None)
        self.slots[slot] = sequence
        sequence.lane = self
        sequence.slot = slot

    def release(self, sequence: Sequence[S, W]) -> None:
        if 0 <= sequence.slot < len(self.slots) and self.slots[sequence.slot] is sequence:
            self.slots[sequence.slot] = None
        sequence.lane = None
        sequence.slot = -1


def direct_rows(lane: Lane[S, W]) -> list[Sequence[S, W] | None]:
    """The rows of a lane's next batch (direct): per slot up to the highest one with a
    ready request of the same signature as the lowest one's, that sequence; None for an
    empty slot (READY false). Empty when no slot has a request ready."""
    rows: list[Sequence[S, W] | None] = []
    signature: Hashable = None
    last = -1
    for held in lane.slots:
        step = held.head() if held is not None else None
        if step is not None and (last < 0 or step.signature == signature):
            if last < 0:
                signature = step.signature
            rows.append(held)
            last = len(rows) - 1
        else:
            rows.append(None)
    return rows[: last + 1]


def direct_due(
    rows: list[Sequence[S, W] | None], slots: int, utilization: float, delay_ns: int, now: int
) -> int:
    """0 when a direct batch of ``rows`` should run now; else when (ns) to look again.

    It waits only while fewer than ``minimum_slot_utilization`` of the slots have a
    request, and no longer than ``max_queue_delay`` after its oldest one came.
    """
    ready = [row for row in rows if row is not None]
    if not ready or utilization <= 0 or len(ready) >= utilization * slots:
        return 0
    oldest = min(row.queue[0].enqueued_ns for row in ready)
    due = oldest + delay_ns
    return 0 if due <= now else due


def oldest_rows(lane: Lane[S, W], max_batch: int) -> list[Sequence[S, W]]:
    """The sequences of a lane's next batch (oldest): those with a ready request, the
    oldest request first, of the oldest one's signature, at most ``max_batch``."""
    ready = []
    for held in lane.slots:
        if held is not None:
            step = held.head()
            if step is not None:
                ready.append((step.enqueued_ns, held.slot, held, step.signature))
    if not ready:
        return []
    ready.sort(key=lambda entry: (entry[0], entry[1]))
    signature = ready[0][3]
    return [held for _, _, held, sig in ready if sig == signature][: max(max_batch, 1)]


def oldest_due(
    rows: list[Sequence[S, W]], preferred: tuple[int, ...], delay_ns: int, now: int
) -> int:
    """0 when an oldest batch of ``rows`` should run now (a preferred size reached, no
    delay, or the oldest request waited ``max_queue_delay``); else when (ns) to look again."""
    if not rows or delay_ns <= 0 or len(rows) >= max(preferred) or len(rows) in preferred:
        return 0
    due = min(row.queue[0].enqueued_ns for row in rows) + delay_ns
    return 0 if due <= now else due
