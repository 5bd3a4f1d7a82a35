"""What one client connection may hold of the workers' queues: its share.

A worker takes ``--max-queue-per-worker`` requests of a front (256) before its model
answers 503. One HTTP/2 connection may run 1,024 unary calls and 1,024 stream requests at
once, so a single client connection could fill a worker's queue, and every other client
then got 503 while it held it. So an HTTP/2 connection of one client (gRPC calls, REST
streams over h2c) counts the requests of its own that the workers have: sent, and not yet
answered by the worker (its reply or its death; a request failed at its deadline or
cancelled in the front still counts while the worker has it). Past its share, half a
worker's queue (``share_of``), its next request waits in the front, in the order they
came, until one of its own comes back; other connections are not affected. At most a
share's count of requests waits so (``waiting_full``): past them, a request is refused
503/UNAVAILABLE at once with Retry-After, as every request past the share was before
there was a wait. A waiting request holds its input (placed in the input pool before it
waits) and, for a unary gRPC call, the last part of its message against the connection's
receive window: bounded so, a connection holds at most a worker queue's count of
requests' inputs, half at the workers, half waiting, as one connection could have at a
worker's queue before the share; unbounded, one connection's 1,024 calls and 1,024
stream requests could wait, and their window froze the connection. Requests that
wait in the front for another reason (a dynamic batch, a sequence's slot) are not counted:
their batches are not one client's, and never wait here.

Counted in requests, the share still let 128 messages of 128 KiB at a stopped worker
spend the connection's whole 16 MiB receive window, and its next call, even a ModelReady,
was never read. So it is counted in bytes as well, where the connection gives them
(``window_held``: what its whole requests hold of its window): a request goes to a
worker while they hold at most half the window, waits while at most three quarters, and
is refused past that, so that a quarter stays the client's for its other calls. A request
alone at the workers is never refused for its bytes, nor an ensemble's step for the
waiting (``bounded``): a request must not be refused because of itself.

The HTTP/2 connection (``front.grpc.h2.connection_state``) makes one ``WorkerShare`` and
runs its streams' tasks in a context where ``WORKER_SHARE`` holds it; the requests sent
alone (``dataplane.strategies.Unbatched``, an ensemble's steps and chains) take a place
before they pick their worker, and give it back when the worker answers. One count a
connection, not one per worker: a connection with half a worker's queue at the workers
keeps any of them busy, and nothing per worker is looked up per request. Each front
process counts its own connections (``--http-workers``: each front has its own queue on
each worker too).

An inference another front forwards to the primary (a worker endpoint's model, which
only the primary serves) comes on the primary's private socket, one connection of many
clients, which has no share of its own. The forwarding front counts it in its client's
connection's share until the primary answers, and marks it with that connection
(``WorkerShare.serial``, with the front's pid: ``header_rules.FORWARDED_CONNECTION``);
the primary counts it in the share it keeps for that mark (``ForwardedShares``) from its
send to the worker until the worker answers or dies, as its own connections' requests.
Counted only at the front, a call the primary ended at its deadline gave its place back
while the worker still had it, and one connection on the other front filled the
endpoint worker's queue with such calls.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Final, TypeVar

from oipserve.errors import DeadlineExceeded, Unavailable

__all__ = [
    "WORKER_SHARE",
    "ForwardedShares",
    "WorkerShare",
    "bytes_full",
    "place_in_share",
    "share_of",
    "waiting_full",
    "worker_in_share",
]

_Worker = TypeVar("_Worker")

#: Where the connection of the task that runs a request counts its requests at the
#: workers (an HTTP/2 connection of one client's; None: an HTTP/1.1 request, which has its
#: connection to itself, or a connection of many clients, the private socket's, whose
#: call that another front marked sets its client connection's: ``ForwardedShares``).
WORKER_SHARE: Final[ContextVar[WorkerShare | None]] = ContextVar("worker_share", default=None)

WAITED_TOO_LONG: Final = (
    "the request did not finish within its deadline (--infer-timeout, or the request's "
    "'timeout' parameter): it waited in the front for this connection's earlier requests, "
    "which held its share of the workers' queues (half of --max-queue-per-worker)"
)


def waiting_full(share: int) -> Unavailable:
    """The 503 of a request past its connection's share when a share's count already waits."""
    return Unavailable(
        f"this connection has {share} requests at the workers and {share} more waiting for "
        "them (half of --max-queue-per-worker each); retry when fewer are in flight",
        retry_after=1,
    )


def bytes_full(held: int, window: int) -> Unavailable:
    """The 503 of a request past its connection's share when its requests already hold
    three quarters of its receive window."""
    mib = 1024 * 1024
    return Unavailable(
        f"this connection's requests at the workers and waiting for them hold "
        f"{held / mib:.1f} MiB of its {window // mib} MiB receive window (at most three "
        "quarters, so that its other calls can still be sent); retry when fewer are in flight",
        retry_after=1,
    )


#: Where each ``WorkerShare`` of this process gets its ``serial``.
_SERIALS: Final = itertools.count(1)
#: Marks ``ForwardedShares`` keeps before it first looks for those to drop.
_MIN_SWEEP: Final = 64


def share_of(max_queue: int) -> int:
    """Requests one connection may have at the workers: half a worker's queue, at least 1."""
    return max(1, max_queue // 2)


class WorkerShare:
    """One connection's requests at the workers, and those waiting for a place, in order.

    ``take`` a place (or ``wait`` for one), ``back`` once the worker answered: every place
    taken is given back exactly once.
    """

    __slots__ = ("held", "serial", "_waiting", "_loop", "_window_held", "_window")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        window_held: Callable[[], int] | None = None,
        window: int = 0,
    ) -> None:
        #: Places taken: requests at the workers, or handed a place and on their way there.
        self.held = 0
        #: This share among the process's, never reused: what marks its requests that
        #: another front answers (``ForwardedShares``).
        self.serial = next(_SERIALS)
        #: Requests waiting for a place, the first first.
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._loop = loop
        #: The bytes of the connection's receive window (``window``) its whole requests
        #: hold (the asking one's included); None: counted in requests only.
        self._window_held = window_held
        self._window = window

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def take(self, limit: int) -> bool:
        """A place now, if fewer than ``limit`` are held, nobody waits for one, and the
        connection's requests hold at most half its window (or none is held)."""
        if self.held < limit and not self._waiting:
            held = self._window_held
            if self.held and held is not None and 2 * held() > self._window:
                return False
            self.held += 1
            return True
        return False

    async def wait(self, deadline: float, limit: int, bounded: bool = True) -> None:
        """A place, after those that waited before (``back`` hands it over); past
        ``deadline`` (loop time) DeadlineExceeded. Failed or cancelled, it holds none.
        With ``limit`` requests waiting already, or the connection's requests holding
        over three quarters of its window (some at the workers), Unavailable at once
        (``waiting_full``, ``bytes_full``); never so where not ``bounded`` (the steps of
        an ensemble's request, which its own place bounds)."""
        if bounded:
            self._check_room(limit)
        turn: asyncio.Future[None] = self._loop.create_future()
        self._waiting.append(turn)
        timer = self._loop.call_at(deadline, _too_late, turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self.back()  # handed a place it cannot use now: the next one's
            elif turn in self._waiting:  # (``back`` may have passed it over already)
                self._waiting.remove(turn)
            raise
        finally:
            timer.cancel()

    def _check_room(self, limit: int) -> None:
        if len(self._waiting) >= limit:
            raise waiting_full(limit)
        held = self._window_held
        if self.held and held is not None:  # (a request alone is never refused for bytes)
            nbytes = held()
            if 4 * nbytes > 3 * self._window:
                raise bytes_full(nbytes, self._window)

    def back(self) -> None:
        """A place given back: to the first request waiting, else free."""
        waiting = self._waiting
        while waiting:
            turn = waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.held -= 1


class ForwardedShares:
    """The primary's shares of the other fronts' client connections, by the mark their
    forwarded calls carry (the forwarding front's pid and the connection's ``serial``).

    A mark's share is made at its first call and dropped once it holds nothing and
    nobody waits for it: looked for when the marks reach ``_sweep_at`` (then twice those
    kept, at least ``_MIN_SWEEP``), not when a connection closes, which the primary does
    not hear of. Dropped so, a share is as one made anew: nothing else remembers it.
    Counted in requests only: the forwarding front counts their bytes, against its own
    connection's window.
    """

    __slots__ = ("_shares", "_sweep_at")

    def __init__(self) -> None:
        self._shares: dict[str, WorkerShare] = {}
        self._sweep_at = _MIN_SWEEP

    def __len__(self) -> int:
        return len(self._shares)

    def of(self, mark: str, loop: asyncio.AbstractEventLoop) -> WorkerShare:
        """The share of the connection ``mark`` names (made now if it holds none)."""
        share = self._shares.get(mark)
        if share is None:
            if len(self._shares) >= self._sweep_at:
                self._sweep()
            share = self._shares[mark] = WorkerShare(loop)
        return share

    def _sweep(self) -> None:
        self._shares = {
            mark: share for mark, share in self._shares.items() if share.held or share.waiting
        }
        self._sweep_at = max(_MIN_SWEEP, 2 * len(self._shares))


async def place_in_share(limit: int, deadline: float) -> WorkerShare | None:
    """A place in the share (``limit``) of the connection whose task runs this, waited for
    past it; that share (its ``back`` due once the worker answers), or None without one.
    For a job a request sends a worker before its inference (a large JSON body's parse,
    its ``data``'s decode: ``json_offload``, through ``worker_in_share``; the inference
    takes a place of its own) and an inference another front runs (``call_run``)."""
    share = WORKER_SHARE.get()
    if share is not None and not share.take(limit):
        await share.wait(deadline, limit)
    return share


async def worker_in_share(
    limit: int, deadline: float, pick: Callable[[], _Worker]
) -> tuple[_Worker, Callable[[], None] | None]:
    """A place in the share (``place_in_share``), then the worker ``pick`` names for the
    job: that worker, and what gives the place back once it answers (None without a
    share). The place goes back at once if ``pick`` fails (no worker to answer)."""
    share = await place_in_share(limit, deadline)
    try:
        worker = pick()
    except BaseException:
        if share is not None:
            share.back()
        raise
    return worker, None if share is None else share.back


def _too_late(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_exception(DeadlineExceeded(WAITED_TOO_LONG))
