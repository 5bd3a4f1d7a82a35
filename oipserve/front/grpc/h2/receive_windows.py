"""What the client may still send on one connection: its receive windows (RFC 9113, 6.9).

Each DATA frame counts against the connection's window and its stream's. Past the
connection's window is a connection FLOW_CONTROL_ERROR; past a stream's, a stream one
(the frame's payload is dropped). A stream's window is given back as its call takes the
data (``acknowledge``); the connection's for what was taken, for what was dropped (a
closed stream, padding, a stream past its window) and for what a stream that ended had
not taken, in steps of ``CONNECTION_ACK`` (one WINDOW_UPDATE per 4 MiB, not one a frame)
while the client has at least that much of it left; below, each as it comes (else the
client could wait for up to 4 MiB we no longer hold).

``ReceiveWindows`` does no I/O: the WINDOW_UPDATE frames to send are handed to the
``write`` it was made with; the connection (``h2.connection``) judges the frames and
acts on what it answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from oipserve.front.grpc.h2.frames import (
    DEFAULT_MAX_FRAME,
    ErrorCode,
    ProtocolError,
    window_update,
)

__all__ = ["CONNECTION_ACK", "CONNECTION_WINDOW", "STREAM_WINDOW", "ReceiveWindows"]

#: What a stream may send before the call takes it; a large message's upload runs at
#: this window's pace over a slow link.
STREAM_WINDOW: Final = 4 * 1024 * 1024
#: The connection's window: what all its streams may send before it is given back.
CONNECTION_WINDOW: Final = 16 * 1024 * 1024
#: A connection's taken bytes are given back once this many are.
CONNECTION_ACK: Final = CONNECTION_WINDOW // 4


class ReceiveWindows:
    """One connection's receive windows: the connection's, and each open stream's."""

    __slots__ = ("connection", "streams", "_credit", "_write", "_kept", "_kept_bytes")

    def __init__(self, write: Callable[[bytes], None]) -> None:
        #: What the peer may still send on the connection.
        self.connection = CONNECTION_WINDOW
        #: What the peer may still send on each open stream. PERF: the connection reads
        #: and writes these two fields itself for a DATA frame that fits both.
        self.streams: dict[int, int] = {}
        #: Bytes of the connection's window taken or dropped, not yet given back.
        self._credit = 0
        self._write = write
        #: Streams whose request is whole and keeps what it took of the windows until it
        #: ends (``keep``), with those bytes; and their sum.
        self._kept: dict[int, int] = {}
        self._kept_bytes = 0

    def open(self, stream: int) -> None:
        self.streams[stream] = STREAM_WINDOW

    def take(self, stream: int, length: int) -> bool:
        """Count a DATA frame's ``length`` against the windows; False if it went past its
        stream's (the caller resets the stream; its payload is dropped, given back).

        Raises ProtocolError (FLOW_CONTROL_ERROR) past the connection's window.
        """
        self.connection -= length
        if self.connection < 0:
            raise ProtocolError("DATA past the connection's window", ErrorCode.FLOW_CONTROL_ERROR)
        window = self.streams.get(stream)
        if window is None:  # a closed stream (an idle one is refused by the connection)
            self.give_back(length)
            return True
        if length > window:
            self.give_back(length)
            return False
        self.streams[stream] = window - length
        return True

    def give_back(self, nbytes: int) -> None:
        """``nbytes`` of the connection's window were taken or dropped: the peer may send
        them again, given back once ``CONNECTION_ACK`` are, or at once while the peer has
        less than that left (what we no longer hold is never what stalls it)."""
        credit = self._credit + nbytes
        if credit >= CONNECTION_ACK or (credit and self.connection < CONNECTION_ACK):
            self.connection += credit
            self._write(window_update(0, credit))
            credit = 0
        self._credit = credit

    def acknowledge(self, stream: int, nbytes: int) -> None:
        """The call took ``nbytes`` of its open ``stream``: the peer may send that much
        more on it, and on the connection."""
        window = self.streams.get(stream)
        if nbytes and window is not None:
            self.streams[stream] = window + nbytes
            self._write(window_update(stream, nbytes))
            self.give_back(nbytes)

    def keep(self, stream: int) -> None:
        """The request of ``stream`` (a unary call's message) is whole: what it took of
        the windows is given back when it ends, not before (what bounds a connection's
        requests' memory), and held by us meanwhile, not by the client (``withheld``)."""
        kept = STREAM_WINDOW - self.streams.get(stream, STREAM_WINDOW)
        self._kept[stream] = kept
        self._kept_bytes += kept

    def kept_bytes(self) -> int:
        """What the requests whole and not yet ended hold of the connection's window."""
        return self._kept_bytes

    def withheld(self, need: int) -> bool:
        """Whether the client cannot send ``need`` more bytes (a frame's worth, at most)
        because of us: the connection's window is spent, at least half of it by requests
        whole (``keep``: each ends by its deadline) or taken and not yet given back
        (``CONNECTION_ACK``), not by messages still arriving (each bounded in time)."""
        if self.connection >= min(need, DEFAULT_MAX_FRAME):
            return False
        spent = CONNECTION_WINDOW - self.connection
        return 2 * (self._kept_bytes + self._credit) >= spent

    def forget(self, stream: int) -> None:
        """``stream`` closed on this side: what its call had not taken goes back to the
        connection's window."""
        if self._kept:
            self._kept_bytes -= self._kept.pop(stream, 0)
        self.give_back(STREAM_WINDOW - self.streams.pop(stream, STREAM_WINDOW))
