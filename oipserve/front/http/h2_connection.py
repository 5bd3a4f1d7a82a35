"""The HTTP/2 connection of the gRPC listener, able to end a REST stream with its last DATA.

The listener (``front.grpc.listener``) makes one for every connection on the gRPC port and
on the HTTP port's h2c connections: ``front.grpc.h2.connection.Connection``, which serves
gRPC calls, with what a REST stream (``front.http.h2_asgi``) needs of it besides: a DATA
frame that ends the stream (a gRPC call always ends with trailers), whether a frame fits
the windows now, and the socket's addresses for the requests' scopes.
"""

from __future__ import annotations

from typing import Any

from oipserve.front.grpc.h2.connection import Connection
from oipserve.front.grpc.h2.connection_state import Stream
from oipserve.front.grpc.h2.frames import END_STREAM, Frame, frame_header

__all__ = ["Http2Connection"]


class Http2Connection(Connection):
    """The HTTP/2 connection of the gRPC listener, able to end a stream with its last DATA
    frame (a REST response; a gRPC call always ends with trailers)."""

    def end_data(self, stream_: Stream, stream: int, data: bytes | memoryview = b"") -> bool:
        """Send ``data`` as one DATA frame with END_STREAM now, if both windows and the
        frame size allow (b"" always fits); the stream is then done with on this side."""
        if self.streams.get(stream) is not stream_:
            raise ConnectionError("the stream was closed")
        size = len(data)
        # NOTE: an empty frame is not flow-controlled (RFC 9113, 6.9.1): it always goes,
        #   also while a window is negative (SETTINGS lowered it).
        if size and not self.fits(stream_, size):
            return False
        self._send_window -= size
        stream_.send_window -= size
        self._write(frame_header(size, Frame.DATA, END_STREAM, stream) + data)
        self.finished(stream)
        return True

    def fits(self, stream_: Stream, size: int) -> bool:
        """Whether one DATA frame of ``size`` bytes may go on ``stream_`` now."""
        return (
            size <= self._send_window
            and size <= stream_.send_window
            and size <= self._peer_max_frame
        )

    #: The socket's (peer, own) addresses, read once for the scopes of all its streams.
    _addresses: tuple[Any, Any] | None = None

    def addresses(self) -> tuple[Any, Any]:
        if self._addresses is None:
            transport = self.transport
            if transport is None:
                return None, None
            self._addresses = (
                transport.get_extra_info("peername"),
                transport.get_extra_info("sockname"),
            )
        return self._addresses
