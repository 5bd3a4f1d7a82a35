"""One front's connection to one worker: requests by id, their replies, deadlines.

A ``WorkerLink`` is what a front needs to send a worker requests and get answers: ids,
futures, deadlines, and writes coalesced per loop iteration. It knows nothing of the
worker's process. ``oipserve.pool.handle.WorkerHandle`` is the link the front that
started the worker holds, with the process, its heartbeat and its models' loads on top.
A link is cut off when its socket closes: its pending requests fail with 503 and its
death listeners are told.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from time import monotonic_ns
from typing import Final

import msgspec

from oipserve.errors import DeadlineExceeded, Unavailable, WorkerProtocolError, from_kind
from oipserve.wire.framing import FrameSplitter, frame_into
from oipserve.wire.messages import (
    REPLIES,
    Failed,
    Forget,
    ForgetRegions,
    FromWorker,
    InferDone,
    LoadModel,
    ObjectRef,
    Release,
    WorkerReady,
)

__all__ = ["AWAY", "WorkerDied", "WorkerLink", "away"]

_ENCODER: Final = msgspec.msgpack.Encoder()

#: How often a worker's pending requests are checked against their deadlines: a request
#: fails at most this much after its deadline.
DEADLINE_SWEEP: Final = 0.05
#: Seconds a worker has to greet a front that connected to it.
CONNECT_TIMEOUT: Final = 10.0
#: Seconds a housekeeping message (Release, Forget) waits for a request to carry it.
LAZY_FLUSH: Final = 0.002
#: Request ids 1 to this are taken again once their reply came, while fewer than half of
#: them are pending; past that, ids count on from here (never taken again).
#: PERF: CPython has one object for each int up to 256, and mypyc boxes an int at each use
#:   as a dict key or an argument: a request's id past 256 was 4-6 new ints a request in
#:   the front (its dicts, Infer) and more in the worker (decoded, InferDone).
SMALL_RIDS: Final = 256


#: With ``--http-workers``, what a worker that is not one of a front's own counts as
#: beyond its requests in flight. Each front then keeps to its own workers, and turns to
#: another's only when its own have 8 more requests queued. Measured on 2 cores (2 fronts,
#: 2 workers, tiny JSON, 2 x c=8, 3 interleaved rounds): fronts sharing every worker
#: equally (0) served 1.0x one front's requests, at 1.25x its CPU per request (a worker
#: serving two sockets, a front writing to two workers per loop turn); 8 served 1.18x.
AWAY: Final = 8


def away(worker_id: int, front: int, fronts: int) -> int:
    """What worker ``worker_id`` counts as beyond its queue for front ``front`` (0: the
    primary) of ``fronts``: 0 when it is one of that front's own (round-robin by id)."""
    return 0 if (worker_id - 1) % fronts == front % fronts else AWAY


class WorkerDied(Unavailable):
    pass


class WorkerLink:
    """A connection to one worker, the requests in flight on it and the models it holds."""

    def __init__(self, worker_id: int, device: str, prefix: str) -> None:
        self.worker_id = worker_id
        self.device = device
        #: The worker's output segments (of every front's connection) start with this.
        self.segment_prefix = prefix
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[object]] = {}
        #: Per pending infer: callbacks run when the worker no longer reads its inputs.
        self.on_done: dict[int, Callable[[], None]] = {}
        #: Requests failed at their deadline while the worker had them: what to call with
        #: the worker's InferDone if it ran them after all (``on_late_reply``).
        self.late: dict[int, Callable[[InferDone], None]] = {}
        #: The model versions (keys) the worker holds a session for, and how each was loaded.
        self.models: dict[str, LoadModel] = {}
        self.alive = False
        #: Added to its requests in flight when a front picks a worker: 0 for the workers
        #: that are this front's own (``--http-workers``: ``away()``), more for the others.
        self.away = 0
        self.ready = asyncio.Event()
        self.pid: int | None = None
        #: The last small request id given (``_rid``), and the last past them.
        self._small_rid = 0
        self._next_rid = SMALL_RIDS
        #: The frames queued for the next write (``wire.framing.frame_into``).
        self._outbox = bytearray()
        #: A flush is scheduled for this loop iteration.
        self._flush_soon = False
        #: The timer that sends housekeeping messages no request came to carry.
        self._lazy_flush: asyncio.TimerHandle | None = None
        #: Loop time the oldest housekeeping message still waiting was queued; 0: none.
        self._lazy_since = 0.0
        #: The running loop, from ``connect`` (``WorkerHandle``: ``start``) on.
        #: PERF: asyncio.get_running_loop() makes a getpid() system call on each use.
        self._loop: asyncio.AbstractEventLoop
        self._death_listeners: list[Callable[[WorkerLink], None]] = []
        #: Per pending request with a deadline: that deadline (loop time). PERF: one sweep
        #:   timer per worker checks them, rather than a timer per request.
        self._deadlines: dict[int, float] = {}
        self._sweep: asyncio.TimerHandle | None = None
        #: Why requests fail once the link is cut off, when there is more to say (a hang).
        self._hung = ""
        #: Steps in progress during which the worker's heartbeat thread may be silent for a
        #: while, because the step holds the GIL: loads (ONNX Runtime building a session)
        #: and large JSON bodies (msgspec and simdjson, ~1.6 ms per MiB; ``json_offload``).
        #: The heartbeat is the starting front's (``WorkerHandle``); another front's steps
        #: are counted on its own link, and at ~1.6 ms per MiB of a body capped by
        #: ``--max-request-bytes`` they stay far below the heartbeat's timeout.
        self.loading = 0

    async def connect(self, address: str) -> None:
        """Connect to the worker's listener for other fronts (``WorkerHandle.front_address``)
        and wait for its greeting. Raises OSError or TimeoutError when it cannot."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.ready = asyncio.Event()  # NOTE: before connecting: the greeting comes at once
        self.alive = True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            transport, _ = await loop.create_unix_connection(
                lambda: MessageProtocol(self), sock=sock
            )
        except BaseException:
            self.alive = False
            sock.close()
            raise
        self.transport = transport
        try:
            await asyncio.wait_for(self.ready.wait(), CONNECT_TIMEOUT)
        except BaseException:
            self._cut_off("it did not greet this front")
            raise
        if not self.alive:
            raise OSError(f"worker {self.worker_id} closed the connection at once")

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def _rid(self) -> int:
        """A request id no pending request has: the next free one of ``SMALL_RIDS``, or
        one never given before when many are pending. NOTE: a worker answers a request
        once, and an id is taken again only after its answer came."""
        pending = self.pending
        if len(pending) < SMALL_RIDS // 2:
            rid = self._small_rid
            while True:  # (ends: fewer than half are pending)
                rid = rid % SMALL_RIDS + 1
                if rid not in pending:
                    self._small_rid = rid
                    return rid
        self._next_rid += 1
        return self._next_rid

    def add_death_listener(self, listener: Callable[[WorkerLink], None]) -> None:
        self._death_listeners.append(listener)

    def on_message(self, message: object) -> None:
        if isinstance(message, REPLIES):
            self._deadlines.pop(message.rid, None)
            done = self.on_done.pop(message.rid, None)
            if done is not None:
                done()
            future = self.pending.pop(message.rid, None)
            if future is not None and not future.done():
                future.set_result(message)
            elif type(message) is InferDone:
                # NOTE: nobody waits for these outputs any more (the request was
                #   cancelled, or failed at its deadline); hand the segment straight back.
                late = self.late.pop(message.rid, None) if self.late else None
                if late is not None:
                    late(message)
                self.release_outputs(message.segment)
            elif self.late:
                self.late.pop(message.rid, None)
        elif type(message) is WorkerReady:
            self.pid = message.pid
            self.ready.set()

    def connection_closed(self) -> None:
        """The worker closed this connection: it is gone (or going) for this front."""
        if self.alive:
            self._cut_off("its connection closed")
            for listener in self._death_listeners:
                listener(self)

    def _cut_off(self, why: str) -> None:
        """Fail everything in flight and take no more (once): it can no longer answer."""
        if not self.alive:
            return
        self.alive = False
        if self.transport is not None:
            self.transport.abort()
        self._deadlines.clear()
        self.late.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        why = self._hung or why
        self.ready.set()  # wake a start() that waits
        error = WorkerDied(
            f"worker {self.worker_id} ({self.device}) stopped while handling this request: {why}"
        )
        for rid, future in list(self.pending.items()):
            done = self.on_done.pop(rid, None)
            if done is not None:
                done()
            if not future.done():
                future.set_exception(error)
        self.pending.clear()

    def send(self, message: object, urgent: bool = True) -> None:
        """Queue a message; everything queued in one loop iteration goes out in one write.

        A message that is not ``urgent`` (housekeeping: Release, Forget) waits for the next
        urgent one to ride along with, or ``LAZY_FLUSH`` seconds (up to half that more:
        ``_flush_lazily``).
        """
        if self.transport is None or not self.alive:
            return
        # PERF: one socket write per request (Infer) and one per response (Release)
        #   cost a fifth of the front's time under load; coalescing them per event
        #   loop iteration turns many into one. A Release alone also woke the worker
        #   for nothing: under load it now rides with the next Infer.
        frame_into(_ENCODER, message, self._outbox)
        if urgent:
            if not self._flush_soon:
                self._flush_soon = True
                self._loop.call_soon(self._flush)
            return
        if not self._lazy_since:
            self._lazy_since = self._loop.time()
        if self._lazy_flush is None:
            self._lazy_flush = self._loop.call_later(LAZY_FLUSH, self._flush_lazily)

    def _flush(self) -> None:
        self._flush_soon = False
        self._lazy_since = 0.0
        outbox = self._outbox
        if not outbox:
            return
        # NOTE: a copy to write: a transport may keep what it could not send at once.
        payload = bytes(outbox)
        outbox.clear()
        if self.transport is not None and self.alive:
            self.transport.write(payload)

    def _flush_lazily(self) -> None:
        """The lazy timer: writes what waits once the oldest of it waited ``LAZY_FLUSH``.

        PERF: the timer stays armed when what it waited for rode along with a request,
        and is moved on to the next waiting message's time when it goes off: written
        at the first timer's time, a Release queued just before went alone and woke a
        sleeping worker for nothing (at c=1 one write in four); cancelled at each
        write, the timer was made again for every request's Release.
        """
        self._lazy_flush = None
        since = self._lazy_since
        if not since:
            return  # everything rode along
        wait = since + LAZY_FLUSH - self._loop.time()
        if wait <= 0:
            self._flush()
            return
        # NOTE: never a timer under half the delay: uvloop runs a delay under 0.5 ms at
        #   the next loop iteration, so re-arming for the last few hundred microseconds
        #   would turn the loop without sleeping until then. Such a message waits up to
        #   half a delay longer, for a request to ride with still (written alone then,
        #   the Release of a call ~1 ms apart woke its worker every other call).
        self._lazy_flush = self._loop.call_later(max(wait, LAZY_FLUSH / 2), self._flush_lazily)

    def call(
        self,
        make: Callable[[int], object],
        on_done: Callable[[], None] | None = None,
        deadline: float | None = None,
    ) -> Awaitable[object]:
        """Send a request built with a fresh id; the awaitable resolves to the reply.

        At ``deadline`` (loop time) the awaitable fails with DeadlineExceeded; the request
        stays pending until the worker answers it (the worker may still be reading its
        inputs, and its outputs go straight back to it).
        """
        if not self.alive:
            raise WorkerDied(f"worker {self.worker_id} ({self.device}) is not running")
        rid = self._rid()
        loop = self._loop
        future: asyncio.Future[object] = loop.create_future()
        self.pending[rid] = future
        if on_done is not None:
            self.on_done[rid] = on_done
        if deadline is not None:
            self._deadlines[rid] = deadline
            if self._sweep is None:
                self._sweep = loop.call_later(DEADLINE_SWEEP, self._expire_overdue)
        message = make(rid)
        if len(self.pending) == 1 and self.transport is not None:
            # PERF: an idle worker gets its request at once (one loop iteration less
            #   of latency); a busy one cannot start it sooner, so it is batched. Written
            #   here, with no flush scheduled for it as well (a handle, two bound methods).
            frame_into(_ENCODER, message, self._outbox)
            self._flush()
        else:
            self.send(message)
        return future

    def expires(self, deadline: float) -> int:
        """``deadline`` (this loop's time) on the clock a worker reads, ``monotonic_ns``:
        when it may skip the request (``Infer.expires``)."""
        return monotonic_ns() + int((deadline - self._loop.time()) * 1e9)

    def while_pending(
        self, waiting: Awaitable[object], start: Callable[[], Callable[[], None]]
    ) -> None:
        """If the worker has not answered the request that ``call`` returned ``waiting``
        for: ``start()`` now, and what it returns once the worker answers or dies. Looked
        up by the awaitable: called only for a request its caller gave up on."""
        rid = self._rid_of(waiting)
        if rid is not None:
            before, after = self.on_done.get(rid), start()
            self.on_done[rid] = after if before is None else _both(before, after)

    def on_late_reply(self, waiting: Awaitable[object], ran: Callable[[InferDone], None]) -> None:
        """``ran(reply)`` if the worker runs the request ``call`` returned ``waiting`` for
        after all, its caller having given up (at its deadline, or cancelled): a run
        counts as an execution, answered or not."""
        rid = self._rid_of(waiting)
        if rid is not None:
            self.late[rid] = ran

    def _rid_of(self, waiting: Awaitable[object]) -> int | None:
        """The id of the pending request ``call`` returned ``waiting`` for (None: answered)."""
        for rid, future in self.pending.items():
            if future is waiting:
                return rid
        return None

    def _expire_overdue(self) -> None:
        """Fail the pending requests past their deadline; look again while any are left."""
        self._sweep = None
        loop = self._loop
        now = loop.time()
        overdue = [rid for rid, deadline in self._deadlines.items() if deadline <= now]
        for rid in overdue:
            del self._deadlines[rid]
            future = self.pending.get(rid)
            if future is not None and not future.done():
                future.set_exception(DeadlineExceeded())
        if self._deadlines:
            self._sweep = loop.call_later(DEADLINE_SWEEP, self._expire_overdue)

    def inferred(self, reply: object) -> InferDone:
        """The worker's reply to an ``Infer``: its ``InferDone``, or the error it answered
        (raised with its kind); anything else is a broken worker."""
        if type(reply) is InferDone:
            return reply
        if type(reply) is Failed:
            raise from_kind(reply.kind, reply.message)
        raise WorkerProtocolError(
            f"worker {self.worker_id} answered {type(reply).__name__} to Infer"
        )

    def release_outputs(self, segment: str) -> None:
        self.send(Release([segment]), urgent=False)

    def forget_inputs(self, segments: list[str]) -> None:
        self.send(Forget(segments), urgent=False)

    def forget_regions(self, objects: list[ObjectRef]) -> None:
        if self.alive:
            self.send(ForgetRegions(objects))


_DECODER: Final = msgspec.msgpack.Decoder(FromWorker)


class MessageProtocol(asyncio.Protocol):
    """Frames from the worker's message socket, decoded and handed to its link."""

    __slots__ = ("worker", "splitter")

    def __init__(self, worker: WorkerLink) -> None:
        self.worker = worker
        self.splitter = FrameSplitter()

    def data_received(self, data: bytes) -> None:
        for body in self.splitter.feed(data):
            self.worker.on_message(_DECODER.decode(body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.worker.connection_closed()


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        then()

    return both
