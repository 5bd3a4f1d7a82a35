"""A timer for the event loop to the microsecond: libuv counts timers in whole milliseconds.

uvloop's ``call_later`` rounds a delay to the nearest millisecond. Measured here: 0.1 and
0.4 ms fired at the next loop iteration (2 µs), 0.9 ms after 1.1 ms, 1.5 ms after 2.1 ms.
The dynamic batcher waits ``max_queue_delay_microseconds``, usually 100–1,000 µs: with
``call_later``, a wait under 0.5 ms became a busy loop until the deadline (two clients of a
batched model: 415–445 µs of the front's CPU a request, against 161–173 µs for Triton's
front; docs/scheduler.md), and one of 0.5–1.5 ms waited a whole millisecond.

``PreciseTimer`` is a Linux ``timerfd`` that the loop watches like a socket: the kernel
makes it readable when its time comes (within the process's timer slack, 50 µs by
default). One timer serves one waiter. ``arm_at`` sets it for a time on the monotonic
clock (``time.monotonic_ns``'s), which a waiter whose due time has not moved need not set
again (a ctypes call and a system call, ~2–4 µs here). ``os.timerfd_create`` arrives in
Python 3.13; until then libc's is called through ctypes.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Callable

__all__ = ["PreciseTimer"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_timerfd_create = _libc.timerfd_create
_timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
_timerfd_create.restype = ctypes.c_int
_timerfd_settime = _libc.timerfd_settime
_timerfd_settime.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(_Itimerspec),
    ctypes.POINTER(_Itimerspec),
]
_timerfd_settime.restype = ctypes.c_int


def _check(result: int) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


class PreciseTimer:
    """Calls ``callback`` on the loop once the delay given to ``arm`` has passed."""

    __slots__ = ("_fd", "_loop", "_callback", "_spec", "_spec_ref")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._fd = _check(_timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
        self._loop = loop
        self._callback = callback
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        loop.add_reader(self._fd, self._fired)

    def arm(self, delay: float) -> None:
        """Fire once, ``delay`` seconds from now (replacing any earlier arming)."""
        # NOTE: a zero it_value disarms a timerfd; a due time is at least 1 ns away.
        ns = max(int(delay * 1e9), 1)
        self._set(ns, 0)

    def arm_at(self, due_ns: int) -> None:
        """Fire once at ``due_ns`` on the monotonic clock (at once if it has passed),
        replacing any earlier arming."""
        self._set(max(due_ns, 1), _TFD_TIMER_ABSTIME)

    def disarm(self) -> None:
        self._set(0, 0)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _set(self, ns: int, flags: int) -> None:
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(ns, 1_000_000_000)
        _check(_timerfd_settime(self._fd, flags, self._spec_ref, None))

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return  # re-armed or disarmed after it fired, before the loop saw it
        self._callback()
