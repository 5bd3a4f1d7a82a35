"""A gRPC port's connections bounded: how many, how long without calls, how long silent.

- ``--grpc-max-connections``: connections one front holds at once. Past it a new one
  is closed at once, before the server's preface (``listener._Refused``: a gRPC client
  fails the call UNAVAILABLE); the connections already open are never dropped for it. Its default
  leaves half the process's descriptors to REST, the workers and the pool: 3,200 silent
  gRPC connections under a limit of 3,000 descriptors once left no room to accept REST.
- ``--grpc-max-connection-idle``: a connection without a call for this long gets the
  shutdown's two-phase GOAWAY (``NO_ERROR``; a gRPC client reconnects when it next calls)
  and is closed once any call that raced it ends.
- ``--grpc-keepalive-time`` / ``--grpc-keepalive-timeout`` (Triton's flags, in
  milliseconds as Triton takes them): a connection the client has sent nothing on for
  the time gets a PING; if nothing at all (its ACK included) comes within the timeout,
  the connection is closed and its calls end as if reset.

PERF: nothing per call or per frame. ``Connection.data_received`` counts reads (one
integer); each connection has one loop timer (``Watch``) that wakes every quarter of
the shorter of the idle and keepalive times and compares that count and the highest
stream id opened with what it saw last. A limit is so kept within a quarter of itself
(later, never earlier).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass

from oipserve.config.settings import Settings
from oipserve.front.grpc.h2.connection import Connection

log = logging.getLogger("oipserve.grpc")

#: ``--grpc-max-connections 0``: this share of the process's descriptor limit...
_SHARE_OF_DESCRIPTORS = 2
#: ...at most this many, and never fewer than ``_FEWEST``.
_MOST_BY_DEFAULT = 10_000
_FEWEST = 16
#: The watch's shortest period (seconds): a keepalive of a millisecond wakes no loop
#: faster than this.
_SHORTEST_TICK = 0.01
#: Seconds between the log lines about connections refused past the cap.
_REFUSAL_LOG_INTERVAL = 10.0


def default_max_connections() -> int:
    """Half of RLIMIT_NOFILE's soft limit, between ``_FEWEST`` and ``_MOST_BY_DEFAULT``:
    the other half stays for REST connections, worker links and segments."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MOST_BY_DEFAULT
    return max(_FEWEST, min(_MOST_BY_DEFAULT, soft // _SHARE_OF_DESCRIPTORS))


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """One gRPC listener's limits on its connections (times in seconds)."""

    #: Connections held at once (the public port's; the primary's private socket is not
    #: counted: it carries the other fronts' forwarded calls).
    max_connections: int = _MOST_BY_DEFAULT
    #: Without a call this long: GOAWAY ``NO_ERROR``, then closed. None: never.
    idle: float | None = 300.0
    #: Silent this long: a PING; nothing back within ``keepalive_timeout``: closed.
    keepalive_time: float = 7200.0
    keepalive_timeout: float = 20.0

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        """The limits the flags set (``--grpc-*`` times are in milliseconds)."""
        idle = settings.grpc_max_connection_idle
        return cls(
            max_connections=settings.grpc_max_connections or default_max_connections(),
            idle=idle / 1000 if idle else None,
            keepalive_time=settings.grpc_keepalive_time / 1000,
            keepalive_timeout=settings.grpc_keepalive_timeout / 1000,
        )


class Watch:
    """One connection's idle and keepalive checks, on one loop timer (see the module)."""

    __slots__ = ("_conn", "_limits", "_loop", "_tick", "_timer", "_reads", "_opened",
                 "_heard", "_busy", "_pinged_at")  # fmt: skip

    def __init__(self, conn: Connection, limits: ConnectionLimits) -> None:
        self._conn = conn
        self._limits = limits
        self._loop = asyncio.get_running_loop()
        shorter = min(limits.idle or limits.keepalive_time, limits.keepalive_time)
        self._tick = max(_SHORTEST_TICK, shorter / 4)
        now = self._loop.time()
        #: The connection's read count and highest stream id when last looked at.
        self._reads = conn.reads
        self._opened = conn.opened
        #: When the client was last heard from, and last had (or opened) a call, as seen
        #: by the timer (so up to one tick later than it happened).
        self._heard = now
        self._busy = now
        #: When the keepalive PING went out (None: none is waiting for an answer).
        self._pinged_at: float | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(self._tick, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        conn = self._conn
        if conn.lost:
            return
        now = self._loop.time()
        if conn.reads != self._reads:
            self._reads = conn.reads
            self._heard = now
            self._pinged_at = None  # any frame answers a keepalive PING: the peer is there
        if conn.streams or conn.opened != self._opened:
            self._opened = conn.opened
            self._busy = now
        limits = self._limits
        if self._pinged_at is not None and now - self._pinged_at >= limits.keepalive_timeout:
            log.debug("gRPC connection closed: no answer to a keepalive PING")
            if conn.transport is not None:
                # NOTE: aborted, not closed: a peer gone without a FIN reads nothing, and a
                #   close waits for what is still to write to be read.
                conn.transport.abort()
            return
        if limits.idle is not None and now - self._busy >= limits.idle:
            conn.go_away()  # idempotent: once announced it closes when its calls end
        elif self._pinged_at is None and now - self._heard >= limits.keepalive_time:
            self._pinged_at = now
            conn.ping()
        delay = self._tick
        if self._pinged_at is not None:
            delay = min(delay, self._pinged_at + limits.keepalive_timeout - now)
        self._timer = self._loop.call_later(delay, self._check)


class Refusals:
    """Connections refused past the cap, logged at most once per ``_REFUSAL_LOG_INTERVAL``
    (a flood of connections must not become a flood of log lines)."""

    __slots__ = ("_count", "_logged_at")

    def __init__(self) -> None:
        self._count = 0
        self._logged_at = float("-inf")

    def refused(self, cap: int) -> None:
        self._count += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at >= _REFUSAL_LOG_INTERVAL:
            log.warning(
                "gRPC connections refused: %d past --grpc-max-connections (%d) "
                "since the last report",
                self._count,
                cap,
            )
            self._count = 0
            self._logged_at = now
