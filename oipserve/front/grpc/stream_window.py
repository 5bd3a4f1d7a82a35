"""How much of one ModelStreamInfer stream may be read and not yet answered
(``streaming.ordered_responses`` asks before it reads each request), and what the stream
charges its connection's budget (``runtime.stream_budget``)."""

from __future__ import annotations

import asyncio

from oipserve.runtime.stream_budget import ANSWER_COST, StreamBudget

__all__ = ["StreamWindow"]

#: Requests of one stream that may run at once before reading the stream waits.
_RUNNING = 64
#: Answers of one stream that may wait for an earlier request's (answers leave in order)
#: before reading the stream waits: so many, and so many bytes (at least one, however large).
#: Not while one of the stream's requests waits for a sequence slot and the answers wait
#: for a request still running (``StreamWindow.behind_a_wait``): the connection's budget
#: bounds those, by their bytes (``runtime.stream_budget.BEHIND_BYTES``).
_HELD = 1024
_HELD_BYTES = 64 << 20


class StreamWindow:
    """How much of a stream may be read and not yet answered: requests running, and answers
    waiting for an earlier request's. Reading waits while either is full, or while the
    connection's ``budget`` is.

    Answers waiting used to count as running (64 in all): a request that waits long (a
    sequence's START waiting for a slot) with 64 answered behind it stopped the reading,
    and the request that would free the slot (another sequence's END, later on the same
    stream) was never read until that sequence expired (found by fuzzing). Requests waiting
    for a slot (``parked``) counted as running too: 64 of them (more sequences started on
    the stream than the model has slots) stopped the reading just as well.

    What the stream holds is charged to its connection's budget (``_charge``): its running
    requests, and its answers waiting, as the client's while the stream sends (its window
    may be closed: the client holds them back), as the server's while it waits for a request
    still running (the budget's ``behind``). One stream's answers waiting behind a START
    held the budget that another stream's END, which would free the slot, needed to be
    read (found by fuzzing).
    """

    def __init__(self, budget: StreamBudget | None) -> None:
        self.running = 0
        #: Requests waiting for a sequence slot (``parked``): not counted in ``running``.
        self.waiting = 0
        self.held = 0
        self.held_bytes = 0
        #: The oldest request, whose answer goes next, is still running.
        self.head_running = False
        self._budget = budget
        #: What is charged to ``budget`` now: requests, answers behind a running head,
        #: bytes of the answers held back by the client, and what the answers behind a
        #: running head cost.
        self._charged = (0, 0, 0, 0)
        self._room = asyncio.Event()
        self._room.set()

    def started(self, task: asyncio.Task[bytes | memoryview]) -> None:
        self.running += 1
        task.add_done_callback(self._finished)
        self._update()

    def parked(self, waiting: bool) -> None:
        """A running request started (``waiting``) or stopped waiting for a place that only
        another request frees (a sequence's slot, ``Inference.parked``): while it waits it
        does not count as running, so that the stream reads on to the request that frees
        the place (the sequence batcher's backlog bounds those waiting)."""
        self.running += -1 if waiting else 1
        self.waiting += 1 if waiting else -1
        self._update()

    def _finished(self, task: asyncio.Task[bytes | memoryview]) -> None:
        self.running -= 1
        self.held += 1
        self.held_bytes += _answer_bytes(task)
        self._update()

    def awaiting(self, task: asyncio.Task[bytes | memoryview]) -> None:
        """The answer to send next is ``task``'s."""
        self.head_running = not task.done()
        self._update()

    def sent(self, task: asyncio.Task[bytes | memoryview]) -> None:
        """``task``'s answer has left (the counts may pass below 0 for a moment: a task's
        done callbacks may run after its awaiter resumed)."""
        self.held -= 1
        self.held_bytes -= _answer_bytes(task)
        self.head_running = False
        self._update()

    def close(self) -> None:
        """The stream is over: what it still holds leaves the connection's budget."""
        self.running = self.waiting = self.held = self.held_bytes = 0
        self._charge()
        self._budget = None

    @property
    def behind_a_wait(self) -> bool:
        """The answers wait for a request still running while one of the stream's requests
        waits for a sequence slot: perhaps the one they wait for, whose slot only a later
        request frees (an earlier sequence's END, on this stream). Their count does not
        stop the reading then; the connection's budget bounds their bytes. Stopped at
        1,024 answers (or 64 MiB), the stream did not read that END, and a client that
        sent more steps of the running sequence before it stalled until the sequence
        expired (60 s idle: every step after it failed) or the waiting request's deadline.
        """
        return self.head_running and self.waiting > 0

    def _update(self) -> None:
        self._charge()
        held = self.behind_a_wait or (self.held < _HELD and self.held_bytes < _HELD_BYTES)
        if self.running < _RUNNING and held:
            self._room.set()
        else:
            self._room.clear()

    def _charge(self) -> None:
        budget = self._budget
        if budget is None:
            return
        held = max(self.held, 0)
        nbytes = max(self.held_bytes, 0)
        if self.head_running:
            charge = (self.running, held, 0, nbytes + held * ANSWER_COST)
        else:
            charge = (self.running + held, 0, nbytes, 0)
        charged = self._charged
        if charge != charged:
            budget.change(
                charge[0] - charged[0],
                charge[1] - charged[1],
                charge[2] - charged[2],
                charge[3] - charged[3],
            )
            self._charged = charge

    async def room(self) -> None:
        """Return once this stream and its connection have room for one more request."""
        while True:
            await self._room.wait()
            if self._budget is None:
                return
            await self._budget.room()
            if self._room.is_set():
                return


def _answer_bytes(task: asyncio.Task[bytes | memoryview]) -> int:
    if task.cancelled() or task.exception() is not None:
        return 0
    return memoryview(task.result()).nbytes
