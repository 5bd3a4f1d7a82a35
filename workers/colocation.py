"""Co-location at low load (``--low-load-colocation true``): a worker serving one front,
one short request at a time, runs on that front's CPU, and the front's loop with it.

At c=1 a request crosses between processes four times: client to front, front to worker,
worker to front, front to client. Linux wakes a sleeping process on the idle CPU it last ran
on, so the front and its worker end up on two cores, and each crossing between them wakes a
halted vCPU: an inter-processor interrupt, on a virtual machine a VM exit, tens of
microseconds of CPU and of latency. Busy polling (``workers.busy_poll``,
``oipserve.runtime.busy_poll``) buys the latency back by keeping both cores spinning: the
default, at about 1.6x Triton's server CPU a request. On one core the server cannot spend
more than that core, and the crossings between front and worker are a ``sched_yield``.

So while a worker's load is light, it pins itself (every thread: ONNX Runtime's too) to the
CPU its front last ran on, read from ``/proc/<front>/stat``. Each reply says where
(``InferDone.colocated_cpu``), and the front's loop thread pins itself there too
(``oipserve.runtime.colocation``): left free, the scheduler would move it to the idle core
whenever the worker is woken beside it. Both keep polling, each turn yielding the core to
the other. Light means: ``ENTER_TURNS`` turns of the worker's loop in a row, each with one
``Infer``, from the same front, sent while that front had no other request in flight
(``Infer.light``: a front saturated by many clients must keep its core to itself, however
idle its worker), and model runs that typically take at most ``MAX_RUN_NS`` (a model that
ONNX Runtime runs faster on several cores keeps them). Anything else (two requests in one
turn, another front, a long run) gives back every CPU the worker started with at once, and
its next reply the front's. A CPU that another worker of the server is already pinned to
(another pair) is not taken: two pairs on one core would halve both. A front pinned there
does not count: a front whose client left stays pinned until its next reply, and with
``--http-workers`` the next client often lands on another front (which then could not
co-locate on that CPU). A worker whose client left would stay pinned the same way, and
with two instances the next client's requests may go to the other one, which then could
not co-locate beside its front: so a pinned worker that has slept ``IDLE_UNPIN`` seconds
with nothing to do takes back its CPUs (``idled``), and starts its count of light turns
over.

Measured on this project's 2-core VM (``benchmarks/cpu_per_request.py``, tiny JSON c=1, two
fronts, against the default in one interleaved run): 0.68x the server's CPU a request (435
against 638 us) at 0.89x the requests a second; Triton in the same run 376 us at 1.07x our
rate. Off by default: the default keeps c=1 latency at Triton's. Not measured on a GPU
worker (only CPU workers co-locate).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

__all__ = [
    "ENTER_TURNS",
    "IDLE_UNPIN",
    "MAX_RUN_NS",
    "Colocation",
    "cpu_of",
    "pin_threads",
    "pinned_siblings",
]

#: Light turns in a row (one Infer each, from one front, to an idle worker) before pinning.
ENTER_TURNS = 32
#: Light turns between two looks at where the front runs (it may have been moved).
LOOK_TURNS = 256
#: Model runs typically longer than this keep every CPU: ONNX Runtime may use them.
MAX_RUN_NS = 500_000
#: Seconds a pinned worker sleeps with nothing to do before it takes back its CPUs.
IDLE_UNPIN = 0.25
#: Weight of the newest run in ``Colocation.typical_run``.
_NEWEST = 1 / 8


def cpu_of(pid: int) -> int | None:
    """The CPU the process ``pid`` last ran on (``/proc/<pid>/stat``, field 39); None when
    it cannot be read (the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # NOTE: fields after the command name, which may hold spaces, start at field 3.
    fields = text.rsplit(b")", 1)[-1].split()
    return int(fields[39 - 3]) if len(fields) > 39 - 3 else None


def pinned_siblings(fronts: Collection[int]) -> set[int]:
    """The CPUs that the other workers of this server are each pinned to: the children of
    this worker's parent (the primary front) but this worker and the ``fronts`` it serves
    (the other fronts: their pins say nothing of a pair, see the module's text)."""
    parent, me = os.getppid(), os.getpid()
    taken: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return taken
    for task in tasks:
        try:
            with open(f"/proc/{parent}/task/{task}/children") as children:
                pids = [int(pid) for pid in children.read().split()]
        except OSError:
            continue
        for pid in pids:
            if pid == me or pid in fronts:
                continue
            try:
                cpus = os.sched_getaffinity(pid)
            except OSError:
                continue  # gone meanwhile
            if len(cpus) == 1:
                taken |= cpus
    return taken


def pin_threads(cpus: set[int]) -> None:
    """Every thread of this process onto ``cpus`` (a thread that just ended is skipped)."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except OSError:
            continue


class Colocation:
    """One worker's co-location: told about every turn of its loop that carried an Infer."""

    __slots__ = ("spread", "enabled", "pinned_to", "typical_run", "_front", "_streak",
                 "_pin", "_cpu_of", "_taken")  # fmt: skip

    def __init__(
        self,
        enabled: bool,
        spread: set[int] | None = None,
        pin: Callable[[set[int]], None] = pin_threads,
        where: Callable[[int], int | None] = cpu_of,
        taken: Callable[[], set[int]] = set,
    ) -> None:
        """``taken()``: the CPUs other pairs of the server hold (the worker's is
        ``pinned_siblings`` of the fronts it serves); ``pin`` and ``where`` stand for the
        system (faked in tests)."""
        #: The CPUs the worker started with, given back when the load is no longer light.
        self.spread = set(os.sched_getaffinity(0)) if spread is None else spread
        self.enabled = enabled and len(self.spread) > 1
        #: The CPU the worker is pinned to; None while it has all of ``spread``.
        self.pinned_to: int | None = None
        #: Nanoseconds a model run typically takes: a moving average.
        self.typical_run = 0.0
        self._front = 0
        self._streak = 0
        self._pin = pin
        self._cpu_of = where
        self._taken = taken

    def ran(self, run_ns: int) -> None:
        """A model run took ``run_ns``."""
        self.typical_run += (run_ns - self.typical_run) * _NEWEST

    def turn(self, front_pid: int, infers: int, light: bool) -> None:
        """A turn of the worker's loop handled ``infers`` Infer messages (none: nothing to
        judge), all from the front ``front_pid`` (0: from several); ``light``: the last
        was sent while its front had no other request in flight (``Infer.light``)."""
        if not self.enabled or not infers:
            return
        light = light and infers == 1 and front_pid != 0 and self.typical_run <= MAX_RUN_NS
        if not light:
            self._start_over(0, 0)
            return
        if front_pid != self._front:
            self._start_over(front_pid, 1)
            return
        self._streak += 1
        # NOTE: first at ENTER_TURNS, then every LOOK_TURNS: whether the front moved, or
        #   (not pinned yet) whether its CPU is free now.
        if self._streak >= ENTER_TURNS and (self._streak - ENTER_TURNS) % LOOK_TURNS == 0:
            self._pin_near(front_pid)

    def _pin_near(self, front_pid: int) -> None:
        cpu = self._cpu_of(front_pid)
        if cpu is None or cpu not in self.spread or cpu == self.pinned_to:
            return
        if cpu in self._taken():
            # Another pair of this server is pinned there (two instances, two light
            # fronts on one CPU): two pairs on one core would halve both. Stay as is.
            return
        self._pin({cpu})
        self.pinned_to = cpu

    def unpin(self) -> None:
        """Back onto every CPU the worker started with."""
        self._pin(self.spread)
        self.pinned_to = None

    def sleep_limit(self) -> float | None:
        """How long the worker may sleep waiting for a request before ``idled``: None
        (for ever) while it is not pinned."""
        return IDLE_UNPIN if self.pinned_to is not None else None

    def idled(self) -> None:
        """The worker slept ``sleep_limit()`` with nothing to do: its client went away (or
        its requests now go to another instance). Every CPU back, and the light turns
        counted again from none."""
        self._start_over(0, 0)

    def _start_over(self, front_pid: int, streak: int) -> None:
        """The light turns counted again (``streak`` of them, all from ``front_pid``), on
        every CPU: a pin lasts only while the same front's turns stay light."""
        self._front = front_pid
        self._streak = streak
        if self.pinned_to is not None:
            self.unpin()
