"""Whether the front's event loop stayed free while it had a large piece of work to do.

A bound on the wall time of the worst ``/v2/health/live`` probe (100 ms) failed on a
loaded 2-core box: the machine alone held a probe 125-500 ms while the loop was free
(the front, or this process, waiting for a core). What a loop that does the work at
once leaves behind is different: while a probe waits, the loop's thread (the front's
main thread) burns the CPU time of the whole work. So each probe here is timed in that
thread's CPU seconds (``/proc``), which the machine's load does not make grow, and the
most any probe saw is compared with what the same work costs in this process's CPU.
"""

from __future__ import annotations

import gc
import http.client
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.server import ServerProcess

#: The least bound these checks use: a free loop's thread spends a few ms between a
#: probe's arrival and its answer; /proc counts in 10 ms ticks.
FLOOR = 0.1


def loop_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) the main thread of ``pid``, the front's event loop,
    has used so far."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loop_run_seconds(pid: int) -> float:
    """``loop_cpu_seconds`` to the nanosecond: the scheduler's count of the time the
    thread ran (``schedstat``), where ``stat`` counts in 10 ms ticks: what a bound of a
    few tens of ms needs. Time spent waiting for a core is counted apart, not here."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text()
    except FileNotFoundError:  # a kernel without CONFIG_SCHED_INFO
        return loop_cpu_seconds(pid)
    return int(text.split()[0]) / 1e9


def most_loop_cpu_per_probe(
    server: ServerProcess,
    busy: Callable[[], bool],
    clock: Callable[[int], float] = loop_cpu_seconds,
) -> float:
    """The most CPU seconds the front's loop thread spent while one ``/v2/health/live``
    probe waited for its answer, probing one after another while ``busy()`` holds.

    A free loop answers a probe between two short callbacks: a few ms of its CPU. A loop
    that does a large piece of work at once spends all of it while the probe waits.

    ``clock``: the loop thread's CPU clock (``loop_run_seconds`` counts nanoseconds)."""
    pid = server.process.pid
    probe = http.client.HTTPConnection(server.host_port, timeout=30)
    most = 0.0
    try:
        while busy():
            before = clock(pid)
            probe.request("GET", "/v2/health/live")
            probe.getresponse().read()
            most = max(most, clock(pid) - before)
            time.sleep(0.002)
    finally:
        probe.close()
    return most


def most_loop_cpu_while(server: ServerProcess, senders: list[threading.Thread]) -> float:
    """``most_loop_cpu_per_probe`` while ``senders`` run (started and joined here)."""
    for sender in senders:
        sender.start()
    most = most_loop_cpu_per_probe(server, lambda: any(sender.is_alive() for sender in senders))
    for sender in senders:
        sender.join()
    return most


def cpu_seconds_of(work: Callable[[], object], times: int = 2) -> float:
    """The fewest CPU seconds of this thread ``work`` took over ``times`` runs (the
    garbage collector paused): what the same work costs a loop that does it at once."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        best = float("inf")
        for _ in range(times):
            start = time.thread_time()
            work()
            best = min(best, time.thread_time() - start)
    finally:
        if collecting:
            gc.enable()
    return best


def held_bound(work_cpu: float, share: float = 0.5) -> float:
    """The most loop CPU a probe may wait for when the loop did not do ``work_cpu``
    seconds of work at once: ``share`` of it, never under ``FLOOR``."""
    return max(FLOOR, work_cpu * share)


#: x86-64 system calls in which a loop thread waits for events (poll, select, epoll_wait,
#: pselect6, ppoll, epoll_pwait, epoll_pwait2): it is free, nothing to do. 202 (futex)
#: is a wait for the GIL, another thread's turn, which a loaded machine stretches: it
#: counts as neither.
_WAITING_FOR_EVENTS = frozenset({7, 23, 232, 270, 271, 281, 441})
_FUTEX = 202


class LoopBlocked:
    """Seconds the loop threads of ``pids`` were blocked: asleep in a system call that is
    not a wait for events (a blocking send, a sleep), sampled in a thread every ``period``.

    A stretch counts only where the thread did not run at all between two samples that
    both saw it so (``loop_run_seconds`` unchanged): a loaded machine delays the samples
    and the loop, but cannot put the loop to sleep in such a call. (The loop's running is
    ``loop_run_seconds``'s to count; a thread waiting for a core is neither.) Counts
    nothing on another architecture (its system call numbers differ) or where
    ``/proc/<pid>/task/<pid>/syscall`` cannot be read."""

    def __init__(self, pids: list[int], period: float = 0.002) -> None:
        self.pids = pids
        self.period = period
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._enabled = os.uname().machine == "x86_64"

    def __enter__(self) -> LoopBlocked:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        last: dict[int, tuple[float, str, float] | None] = {}
        while self._enabled and not self._stop.wait(self.period):
            for pid in self.pids:
                now, seen = time.monotonic(), _blocked_in(pid)
                before = last.get(pid)
                if seen and before and seen[0] == before[1] and seen[1] == before[2]:
                    self.seconds += now - before[0]
                last[pid] = (now, *seen) if seen else None


def _blocked_in(pid: int) -> tuple[str, float] | None:
    """(the system call, the run time) of ``pid``'s main thread if it sleeps in a call
    that is not a wait for events, else None."""
    task = Path(f"/proc/{pid}/task/{pid}")
    try:
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        call = (task / "syscall").read_text().split()[0]
        ran = loop_run_seconds(pid)
    except (OSError, IndexError):
        return None
    if state not in ("S", "D") or not call.isdigit():
        return None
    number = int(call)
    if number in _WAITING_FOR_EVENTS or number == _FUTEX:
        return None
    return call, ran
