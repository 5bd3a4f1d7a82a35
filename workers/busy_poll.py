"""Busy polling in a worker: after answering, poll for the next request instead of sleeping.

A worker that has answered everything it received sleeps in ``epoll_wait`` until a front
writes again. Waking it costs both sides: the front's write must wake a sleeping task, and
on a virtual machine a sleeping vCPU (the guest executes HLT) is woken with an interrupt
that exits to the hypervisor. At low load that happens once a request. So a worker keeps
polling its sockets (``epoll_wait`` with no timeout, ``sched_yield`` between polls) for up to
``--worker-busy-poll-us`` (250 us) after its last reply, and only then sleeps. (The front
polls for a worker's reply the same way: ``oipserve.runtime.busy_poll``.)

Measured on this project's 2-core VM, against workers that always sleep, in one
interleaved harness run (``benchmarks/results/2026-11-27-worker-poll.md``): 1.17x the
tiny JSON requests at c=1, 1.04x at c=16 over two fronts; the fronts spend less too,
since their writes no longer wake a sleeping worker.

The window is shorter than the front's 400 us because the gap it waits out holds the
front's and the client's work on a reply and the next request: ~160-190 us with wrk, but
~360 us with Python's gRPC client, whose calls are CPU-bound on a small machine. With a
400 us window a worker polled through those gaps and took the client's CPU (gRPC c=1:
0.86x the build before); with 250 us it stops polling there by itself (below), 0.96x.

Polling pays only while the next request often comes within the window. A worker whose
requests come further apart (a slow client, a light load) would spend the window on every
request for nothing, so ``NextRequestPoll`` counts how often the gap after a reply was
within the window (a moving share, 1/8 the newest gap) and polls only while that is at
least a quarter. Not half: a worker behind busy fronts gets requests in bursts, one per
front's loop turn, and measured (tiny JSON at c=16 over two fronts) 41-48 % of its gaps
within 400 us (a quarter under 10 us, the median 460 us); polling at a quarter gave 1.10x,
at half 1.02x, as the share went back and forth across it. The gaps are measured while the
worker sleeps too, so polling resumes when requests come close together again. With more
requests than a worker can take, it never idles and never polls.

Nor does a worker poll after a request its front sent with nothing else in flight
(``Infer.light``): one client waits on it, and polling would only buy latency with a core.
At c=16 the polling pays the front's CPU (its write to a sleeping worker pays for the
wake-up), at c=1 nobody's: REST at c=1 spent 0.88x the CPU a request without it, at 0.77x
the rate (still 1.4x Triton's), c=16 unchanged
(``benchmarks/results/2026-11-29-issue40-worker-poll-light.md``).
"""

from __future__ import annotations

import os
from time import monotonic_ns
from typing import Final, Protocol

__all__ = ["NextRequestPoll", "Poller", "next_events"]

#: Weight of the newest gap in ``NextRequestPoll.within``.
_NEWEST: Final = 1 / 8
#: Share of recent gaps within the window below which a worker stops polling.
_MIN_WITHIN: Final = 0.25


class NextRequestPoll:
    """When one worker polls for its next request: told when it idles and when it wakes."""

    __slots__ = ("window", "within", "_idle_since")

    def __init__(self, window_ns: int) -> None:
        #: Nanoseconds to poll after the last reply (0: never poll).
        self.window = window_ns
        #: Share of recent gaps (last reply to next arrival) within the window.
        self.within = 1.0
        self._idle_since = 0

    def idle(self, now: int, *, light: bool) -> int:
        """The worker has answered what it had, at ``now`` (``monotonic_ns``): until when
        it polls (``monotonic_ns``), or 0 to sleep at once. ``light``: the last request's
        front had nothing else in flight (``Infer.light``)."""
        self._idle_since = now
        if self.window and not light and self.within >= _MIN_WITHIN:
            return now + self.window
        return 0

    def woken(self, now: int) -> None:
        """Something arrived at ``now``: the gap since the worker idled is counted."""
        if self._idle_since:
            hit = 1.0 if now - self._idle_since <= self.window else 0.0
            self.within += (hit - self.within) * _NEWEST
            self._idle_since = 0


class Poller(Protocol):
    """What ``next_events`` polls: a ``select.epoll`` (tests pass a stand-in that counts)."""

    def poll(self, timeout: float | None = None, maxevents: int = -1) -> list[tuple[int, int]]:
        """The ready fds and their event masks, within ``timeout`` seconds (None: for ever)."""
        ...


def next_events(
    poller: Poller, until: int, sleep: float | None = None, most: int = 1
) -> list[tuple[int, int]]:
    """The poller's next events, ``(fd, epoll mask)``: polled for, yielding the CPU between
    polls, until ``until`` (``monotonic_ns``; 0: not at all), then waited for asleep, at
    most ``sleep`` seconds (None: for ever; no events when it ran out). ``most``: how many
    fds are registered (epoll's ``maxevents``; its default allocates room for 1023 a call).
    """
    # PERF: epoll's own list of (fd, mask), not selectors' (SelectorKey, events) pairs that
    #   its select builds in interpreted Python at every call (every spin of the polling).
    while until:
        events = poller.poll(0, most)
        if events:
            return events
        if monotonic_ns() >= until:
            break
        os.sched_yield()
    return poller.poll(sleep, most)
