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


def most_loop_cpu_per_probe(server: ServerProcess, busy: Callable[[], bool]) -> float:
    """The most CPU seconds the front's loop thread spent while one ``/v2/health/live``
    probe waited for its answer, probing one after another while ``busy()`` holds.

    A free loop answers a probe between two short callbacks: a few ms of its CPU. A loop
    that does a large piece of work at once spends all of it while the probe waits."""
    pid = server.process.pid
    probe = http.client.HTTPConnection(server.host_port, timeout=30)
    most = 0.0
    try:
        while busy():
            before = loop_cpu_seconds(pid)
            probe.request("GET", "/v2/health/live")
            probe.getresponse().read()
            most = max(most, loop_cpu_seconds(pid) - before)
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
