"""Busy polling: at low load the front's loop polls, instead of sleeping, for what is due soon.

With one or two requests in flight, a front's event loop has nothing to do twice a request:
while a worker runs the model, and between sending a response and the client's next
request. It then sleeps in ``epoll_wait``, and waking it costs both sides: the worker's
(or client's) write must wake a sleeping task, and on a virtual machine a sleeping vCPU
(the guest executes HLT) is woken with an interrupt that exits to the hypervisor. On this
project's 2-core VM the front spent ~60 us of CPU a request on that, and the request
waited for it (``benchmarks/results/2026-11-27-busy-poll.md``).

So while a front has at most ``MAX_IN_FLIGHT`` requests in flight, each start and each end
of a request keeps its loop turning without sleeping (``epoll_wait`` with no timeout; one
``call_soon`` a turn):

- for a worker's reply, for up to ``reply_window`` seconds, but only while this front's
  requests typically take no longer than that (``typical``, a moving average): polling for
  a reply that comes later only takes a core from the workers (a MatMul that ONNX Runtime
  runs on every core read 0.91x at c=4 over two fronts when the front polled for it);
  and only for a request that found the loop awake: polling for the client's next request
  when it came, or with another request in flight. A front that slept before the request
  has paid the wake-up already, and polling for its reply bought no latency: behind
  Python's gRPC client at c=1 (its next call ~320 us after a reply, past the next
  request's window) the front spent 454 us of CPU a call polling for replies and 362
  without, p50 0.59 and 0.60 ms (Triton 391 us, 0.56 ms); paced at 2,000 tiny REST
  requests a second, 386 and 361 us, p50 0.29 and 0.28 ms
  (``benchmarks/results/2026-12-01-reply-poll-when-awake.md``). But a request that
  woke the loop after more than ``LONG_SLEEP`` (1 ms) is polled for again, as is the
  first: paced at 600 a second (1.7 ms apart) polling for each reply cost the front less
  than not (298 against 315 us a request, p50 0.41 against 0.45 ms), a cold reply costing
  more the longer the front slept;
- for the client's next request, for ``next_window`` seconds once none is in flight, but
  only while that mostly pays: while at least half of the recent gaps between the last
  request's end and the next one's start (``next_within``, a moving share) were within
  the window. Python's gRPC client at c=1 sends its next call ~320 us after the last ends
  (wrk: ~72 us), so the loop polled 150 us a call for nothing and slept anyway. Paced at
  2,000 tiny REST requests a second the gaps straddle the window (~100-200 us). With a
  quarter as the bar (the worker's rule, ``workers.busy_poll``), half, and three quarters,
  6 rounds beside Triton (2026-12-01, ``benchmarks/results/2026-12-01-issue40-allocations.md``),
  server CPU a request (us) and p50 (ms): wrk's closed loop 331/0.247, 335/0.254, 323/0.264
  (Triton 309/0.317); paced 2,000/s 362/0.306, 356/0.310, 346/0.334 (335/0.340); binary
  c=1 340/0.259, 326/0.255, 317/0.317 (308/0.319). Three quarters lost binary c=1's latency
  in the harness (p50 0.40 against Triton's 0.36 ms); half kept it everywhere. The gaps are measured
  while the loop sleeps too, so polling resumes when requests come close together again.
  The reply's window ends with the last reply in flight: polled to its end, it took the
  gRPC client's gap too (``benchmarks/results/2026-11-29-issue40-next-request-poll.md``).

Every turn yields the CPU (``sched_yield``) so that a task waiting for this core runs
first. With more requests in flight the loop is fed by their arrivals anyway, and polling
took CPU the workers needed (0.79x on that MatMul).

Like Linux's ``SO_BUSY_POLL`` or ONNX Runtime's spinning thread pool, it spends an idle
core to answer sooner: a front at low load shows more CPU busy than it serves.
``--busy-poll-us 0`` turns it off.

With ``--low-load-colocation true`` a worker at light load runs on this front's CPU, and the
loop with it (``workers.colocation``, ``runtime.colocation``): both still poll, each
``sched_yield`` handing the one core to the other.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Final

__all__ = ["MAX_IN_FLIGHT", "NEXT_MIN_WITHIN", "NEXT_REQUEST_WINDOW", "BusyPoll"]

#: Requests in flight in one front above which it never polls (see the module's text).
MAX_IN_FLIGHT: Final = 2
#: Seconds the loop polls for the client's next request after the last one in flight
#: ends (at most ``--busy-poll-us``): a client that sends again at once does so within
#: tens of microseconds.
NEXT_REQUEST_WINDOW: Final = 150e-6
#: Seconds of sleep after which a request's reply is polled for again: measured, see the
#: module's text.
LONG_SLEEP: Final = 1e-3
#: Weight of the newest request in ``BusyPoll.typical`` and gap in ``BusyPoll.next_within``.
_NEWEST: Final = 1 / 8
#: Share of recent gaps within ``next_window`` below which the loop does not poll for the
#: client's next request: measured, see the module's text.
NEXT_MIN_WITHIN: Final = 0.5


class BusyPoll:
    """One front's busy polling: told when each request starts and ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window: float) -> None:
        self._loop = loop
        #: Seconds to poll for a worker's reply (0: never poll).
        self.reply_window = window
        #: Seconds to poll for a client's next request.
        self.next_window = min(window, NEXT_REQUEST_WINDOW)
        #: Requests in flight in this front.
        self.in_flight = 0
        #: Seconds a request of this front typically takes, start to end: a moving average.
        self.typical = 0.0
        #: Share of recent gaps (the last request's end to the next one's start, none in
        #: flight between) within ``next_window``: a moving share.
        self.next_within = 1.0
        #: Whether a polling turn is scheduled.
        self.polling = False
        self._until = 0.0
        self._idle_since = 0.0

    def started(self) -> float:
        """A request started: returns when, for ``ended``."""
        now = time.monotonic()
        # (the loop awake: polling for this request, or serving another; or it slept long)
        awake = self.polling or self.in_flight > 0
        if not self.in_flight:
            if self._idle_since:
                gap = now - self._idle_since
                hit = 1.0 if gap <= self.next_window else 0.0
                self.next_within += (hit - self.next_within) * _NEWEST
                awake = awake or gap >= LONG_SLEEP
            else:
                awake = True  # (its first request)
        self.in_flight += 1
        if awake:
            self._poll_for_reply(now)
        return now

    def ended(self, since: float) -> None:
        """The request that ``started`` at ``since`` ended."""
        now = time.monotonic()
        self.in_flight -= 1
        self.typical += (now - since - self.typical) * _NEWEST
        if self.in_flight:
            self._poll_for_reply(now)
        else:
            # NOTE: the reply's window, counted from the request's start, ends here.
            self._until = now
            self._idle_since = now
            if self.next_within >= NEXT_MIN_WITHIN:
                self._poll(self.next_window, now)

    def _poll_for_reply(self, now: float) -> None:
        if self.typical <= self.reply_window:
            self._poll(self.reply_window, now)

    def _poll(self, window: float, now: float) -> None:
        if not window or self.in_flight > MAX_IN_FLIGHT:
            return
        self._until = now + window
        if not self.polling:
            self.polling = True
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        if self.in_flight <= MAX_IN_FLIGHT and time.monotonic() < self._until:
            os.sched_yield()
            self._loop.call_soon(self._turn)
        else:
            self.polling = False
