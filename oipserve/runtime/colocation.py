"""A front's side of co-location at low load: its loop runs on the CPU its worker pinned
itself to (``workers.colocation``).

A worker at light load pins itself to the CPU its front last ran on and says which in every
reply (``InferDone.colocated_cpu``). The front's loop thread then pins itself there too:
left free, the scheduler moves it to the other, idle core whenever the worker is woken
beside it, and each crossing between them is again a wake-up across cores. A reply that says
-1 (the load is no longer light, or another worker answered) gives the loop every CPU it
started with. Only the transitions make system calls; a reply costs one comparison.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["FrontAffinity"]


class FrontAffinity:
    """Where this front's loop thread may run: told the CPU of each reply's worker."""

    __slots__ = ("spread", "pinned_to", "_pin")

    def __init__(
        self,
        spread: set[int] | None = None,
        pin: Callable[[set[int]], None] | None = None,
    ) -> None:
        #: The CPUs the loop thread started with, given back when co-location ends.
        self.spread = set(os.sched_getaffinity(0)) if spread is None else spread
        #: The CPU the loop thread is pinned to, beside its worker; None: not pinned.
        self.pinned_to: int | None = None
        self._pin = pin or (lambda cpus: os.sched_setaffinity(0, cpus))

    def follow(self, cpu: int) -> None:
        """A worker answered from ``cpu`` (pinned there for this front), or -1 (not pinned)."""
        wanted = cpu if cpu >= 0 and cpu in self.spread else None
        if wanted == self.pinned_to:
            return
        try:
            self._pin(self.spread if wanted is None else {wanted})
        except OSError:
            return  # a CPU taken away meanwhile (cgroup, hotplug): stay as we are
        self.pinned_to = wanted
