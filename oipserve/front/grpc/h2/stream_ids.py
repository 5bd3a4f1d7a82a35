"""Which client stream ids one connection has opened, skipped and closed (RFC 9113, 5.1).

A client opens streams with odd ids, each above the last; ids it skips are closed
unopened (5.1.1). A frame on an id above the last is on an idle stream. Below it, a
stream is open (the connection's ``streams``) or closed, and how it closed decides what a
late frame on it means: after this side's RST_STREAM, frames the client sent before it
heard are ignored; after the client's own end of the stream, they are an error.
``StreamIds`` keeps the last id, the ids skipped and the streams closed, newest kept, and
judges HEADERS on an id that opens nothing (``judge_closed_headers``); the connection
(``h2.connection``) acts on what it says.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from oipserve.front.grpc.h2.frames import ErrorCode, ProtocolError

__all__ = ["StreamIds"]

#: Closed streams whose way of closing is remembered, newest kept: older ones are judged
#: as streams both sides ended; frames in flight are a round trip's worth, far fewer.
_CLOSED_REMEMBERED: Final = 256
#: Runs of stream ids a client skipped (so never opened), newest kept: HEADERS on one
#: is a connection error (5.1.1). Clients number streams one after another.
_GAPS_REMEMBERED: Final = 16


class StreamIds:
    """One connection's client stream ids: the last opened, the skipped, the closed."""

    __slots__ = ("last", "_closed", "_gaps")

    def __init__(self) -> None:
        #: The highest stream id the client opened (or used up); ids above are idle.
        self.last = 0
        #: Closed streams remembered: True where this side reset the stream (frames on it
        #: are ignored), False where the client ended or reset it.
        self._closed: OrderedDict[int, bool] = OrderedDict()
        #: Stream ids skipped by the client, as (low, high): those between never opened.
        self._gaps: list[tuple[int, int]] = []

    def opens(self, stream: int) -> bool:
        """Whether HEADERS on ``stream`` open a new stream: an odd id above the last."""
        return stream % 2 == 1 and stream > self.last

    def open(self, stream: int) -> None:
        """``stream`` (above the last) opens, or is used up: the ids skipped on the way
        are closed, and remembered as never opened."""
        if stream - self.last != 2 and (self.last or stream != 1):
            self._gaps.append((self.last, stream))
            if len(self._gaps) > _GAPS_REMEMBERED:
                del self._gaps[0]
        self.last = stream

    def reset_here(self, stream: int) -> None:
        """This side sent RST_STREAM on ``stream``: what the client sent before it heard is
        ignored."""
        self._remember(stream, ours=True)

    def reset_by_client(self, stream: int) -> None:
        """The client sent RST_STREAM on ``stream`` (a stream this side reset stays so)."""
        if stream not in self._closed:
            self._remember(stream, ours=False)

    def ignored(self, stream: int) -> bool:
        """Whether frames on the closed ``stream`` are ignored: this side reset it."""
        return bool(self._closed.get(stream))

    def judge_closed_headers(self, stream: int, end_stream: bool) -> bool:
        """HEADERS on ``stream``, which opens nothing and is not open (RFC 9113, 5.1.1,
        5.1): True for a stream error (STREAM_CLOSED), False to ignore them; a connection
        error is raised. Never dropped in silence (a client waited forever).

        An even id, or a lower one never opened (the client skipped it), ends the
        connection (PROTOCOL_ERROR), as does one without END_STREAM (a reused id:
        trailers always end the stream). On a stream this side reset the block is
        ignored (sent before the client heard); after the client's own RST_STREAM it is
        a stream error, STREAM_CLOSED; on a stream both sides ended (or closed long ago),
        a connection error, STREAM_CLOSED.
        """
        if stream % 2 == 0:
            raise ProtocolError(f"a client stream with an even id ({stream})")
        if any(low < stream < high for low, high in self._gaps):
            raise ProtocolError(f"HEADERS on stream {stream}, below one already opened")
        ours = self._closed.get(stream)
        if ours:
            return False
        if not end_stream:
            raise ProtocolError(f"HEADERS reusing stream id {stream}")
        if ours is None:
            raise ProtocolError(f"HEADERS on closed stream {stream}", ErrorCode.STREAM_CLOSED)
        return True

    def _remember(self, stream: int, ours: bool) -> None:
        closed = self._closed
        closed[stream] = ours
        if len(closed) > _CLOSED_REMEMBERED:
            closed.popitem(last=False)
