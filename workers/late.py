"""Requests a worker comes to too late to end by their deadline: answered, never run.

A front waits for a request's answer until its deadline (``--infer-timeout``, the request's
``timeout`` parameter, a gRPC call's ``grpc-timeout``), then answers its client
DEADLINE_EXCEEDED; the worker it sent the request to may still have it queued behind
others. Run anyway, it would take the model's time from requests whose clients still wait:
under an overload whose clients give up, every request the worker then runs would be one
nobody waits for. So the front sends each request's deadline (``Infer.expires``) and a
worker that comes to a request too late to finish it by then, at the pace the model's
recent runs set, answers DEADLINE_EXCEEDED at once (the front lets go of its inputs at that
answer, as at any other).

Past the deadline alone is not enough: under an overload that lasts, the queue grows until
requests reach the worker just before their deadline, and each one run then ends after it.
With this and the worker's prompt answers (``worker.REPLY_HOLD_NS``), one worker of a 22 ms
model offered 60 calls a second of 300 ms deadlines answered 42.4 a second in time (its
pace: ~44), where it answered none before (``benchmarks/deadline_overload.py``,
``benchmarks/results/2026-11-29-deadline-overload.md``).

The pace is the model's, not the request's: where one model's requests differ much in size,
a small one with little time left may be skipped at the large ones' pace (its client was
about to be answered DEADLINE_EXCEEDED anyway, unless its deadline was set that close).

The log says so at INFO at most once every ``LOG_EVERY`` seconds, with how many were
skipped since it last did (an operator sees that this worker sheds work it was given too
late), and at DEBUG for each.
"""

from __future__ import annotations

import logging
from typing import Final

from oipserve.wire.messages import ErrorKind

__all__ = ["LOG_EVERY", "MESSAGE", "LateRequests"]

log = logging.getLogger("oipserve.worker")

#: Seconds between two log lines about skipped requests.
LOG_EVERY: Final = 10.0
#: What the front is told (its client was answered at the deadline already).
MESSAGE: Final = (
    "the request could not end by its deadline when the worker came to it; it was not run"
)
_KIND: Final = ErrorKind.DEADLINE_EXCEEDED


class _Pace:
    """One model's pace (``LateRequests``). PERF: a compiled class's int attributes are
    kept unboxed: a run's times stored in dicts were two new ints a request."""

    __slots__ = ("typical_ns", "pace_ns")

    def __init__(self, ns: int) -> None:
        #: The runs' typical time (ns): a moving average, the newest run weighing an eighth.
        self.typical_ns = ns
        #: What a run is expected to take (ns): the lower of the typical time and the last
        #: run's, so that a slow first run (ONNX Runtime's cold start, ten times the next
        #: ones) does not make the requests after it look late.
        self.pace_ns = ns


class LateRequests:
    """Which requests to skip, and the log's count of them."""

    __slots__ = ("skipped", "_unsaid", "_said_at", "_paces")

    def __init__(self) -> None:
        #: Requests skipped since the worker started.
        self.skipped = 0
        #: Skipped since the last log line.
        self._unsaid = 0
        self._said_at = -int(LOG_EVERY * 1e9)
        #: Per model key, the pace of its runs.
        self._paces: dict[str, _Pace] = {}

    def too_late(self, key: str, expires: int, now: int) -> bool:
        """Whether a request of model ``key`` that ``expires`` (``monotonic_ns``) cannot end
        by then if it starts ``now``, at the pace of the model's recent runs."""
        pace = self._paces.get(key)
        return now + (0 if pace is None else pace.pace_ns) > expires

    def ran(self, key: str, ns: int) -> None:
        """A run of model ``key`` took ``ns``."""
        pace = self._paces.get(key)
        if pace is None:
            self._paces[key] = _Pace(ns)
            return
        typical = pace.typical_ns + (ns - pace.typical_ns) // 8
        pace.typical_ns = typical
        pace.pace_ns = min(typical, ns)

    def forget(self, key: str) -> None:
        """Model ``key`` was unloaded."""
        self._paces.pop(key, None)

    def skip(self, rid: int, expires: int, now: int) -> tuple[ErrorKind, str]:
        """Count request ``rid``, which ``expires`` (``Infer.expires``), skipped at ``now``
        (``monotonic_ns``); the failure to answer it with."""
        log.debug("request %d not run: %.1f ms left of its deadline", rid, (expires - now) / 1e6)
        self.skipped += 1
        self._unsaid += 1
        if now - self._said_at >= LOG_EVERY * 1e9:
            log.info(
                "%d request(s) not run: too late to end by their deadline when this worker came "
                "to them (%d since it started; logged at most every %.0f s)",
                self._unsaid,
                self.skipped,
                LOG_EVERY,
            )
            self._said_at = now
            self._unsaid = 0
        return _KIND, MESSAGE
