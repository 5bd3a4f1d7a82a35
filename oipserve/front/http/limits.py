"""What one HTTP connection may take of the server's time and memory (issue #35).

The flags give one ``ConnectionLimits`` (``ConnectionLimits.of``) for the HTTP/1.1 protocol
and for the REST app's HTTP/2 streams (``h2_asgi``, ``h2_head``), which apply it alike.

``ConnectionLimits`` holds the limits; the protocol (``protocol``) counts a request head's
bytes and fields as they are parsed, and one timer per connection judges the rest with
the functions here: a head must be complete within ``header_timeout``, a body within
``body_timeout`` plus one second per ``min_rate`` bytes received (``body_overdue``), and
a response the client leaves unread may wait ``send_timeout`` plus one second per
``min_rate`` bytes it did read (``UnreadResponse``). A connection past either is dropped
at once (``reset``): what its transport holds is released, views of segments included.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass

from oipserve.config.settings import Settings

__all__ = [
    "HEADER_TIMEOUT",
    "MAX_HEADER_FIELDS",
    "MAX_HEAD_BYTES",
    "ConnectionLimits",
    "UnreadResponse",
    "body_overdue",
    "head_too_large",
    "too_many_fields",
    "reset",
]

#: Seconds a request head may take to arrive (``--header-timeout``'s default).
HEADER_TIMEOUT = 10.0
#: ``--max-header-bytes`` and ``--max-header-fields``' defaults.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADER_FIELDS = 256


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one HTTP connection may take of the server's time and memory."""

    #: Seconds from connection (or a request's first byte) to its complete head.
    header_timeout: float = HEADER_TIMEOUT
    #: Bytes of a request head (request line and fields), and its field count.
    max_head_bytes: int = MAX_HEAD_BYTES
    max_header_fields: int = MAX_HEADER_FIELDS
    #: Seconds a body may take, plus one per ``min_rate`` bytes received.
    body_timeout: float = 30.0
    #: Seconds an unread response may wait, plus one per ``min_rate`` bytes read.
    send_timeout: float = 30.0
    min_rate: int = 64 * 1024

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        """The limits the flags give (every HTTP port, the metrics port's too)."""
        return cls(
            header_timeout=settings.header_timeout,
            max_head_bytes=settings.max_header_bytes,
            max_header_fields=settings.max_header_fields,
            body_timeout=settings.body_timeout,
            send_timeout=settings.send_timeout,
            min_rate=settings.min_transfer_rate,
        )

    @property
    def tick(self) -> float:
        """Seconds between two looks at a connection's deadlines."""
        return min(self.header_timeout, self.body_timeout / 2, self.send_timeout / 2)


def head_too_large(limits: ConnectionLimits) -> str:
    """The 431's message for a head past ``max_head_bytes``."""
    return f"the request head is larger than {limits.max_head_bytes} bytes"


def too_many_fields(limits: ConnectionLimits) -> str:
    """The 431's message for a head past ``max_header_fields``."""
    return f"the request head has more than {limits.max_header_fields} header fields"


def body_overdue(limits: ConnectionLimits, started: float, received: int, now: float) -> str:
    """Why a body begun at loop time ``started``, ``received`` bytes of it come, is overdue
    at ``now`` ('' while it is not)."""
    if now < started + limits.body_timeout + received / limits.min_rate:
        return ""
    return (
        f"its request body was not complete {now - started:.0f}s after its head "
        f"({received} bytes came; --body-timeout, --min-transfer-rate)"
    )


class UnreadResponse:
    """Follows a response waiting for a client that does not read it."""

    __slots__ = ("limits", "since", "sent")

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        #: Loop time the transport was first seen holding bytes (None: it held none),
        #: and how many it had sent by then.
        self.since: float | None = None
        self.sent = 0

    def overdue(self, now: float, buffered: int, written: int) -> str:
        """Why the response is overdue ('' while it is not), from the bytes the transport
        holds (``buffered``) and all it was given (``written``). A closing transport
        counts too: it still holds what it could not send."""
        if not buffered:
            self.since = None
            return ""
        sent = written - buffered
        if self.since is None:
            self.since, self.sent = now, sent
            return ""
        limits = self.limits
        if now < self.since + limits.send_timeout + (sent - self.sent) / limits.min_rate:
            return ""
        return (
            f"it left {buffered} bytes of its response unread for "
            f"{now - self.since:.0f}s (--send-timeout, --min-transfer-rate)"
        )


#: SO_LINGER on, with a timeout of 0: closing the socket resets the connection.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


def reset(transport: asyncio.Transport) -> None:
    """Drop a connection now: what the transport holds is released (views of segments
    included), and the kernel resets the connection rather than keep an unread reply's
    bytes for a peer that takes none (a FIN would wait behind them)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        except OSError:
            pass
    transport.abort()
