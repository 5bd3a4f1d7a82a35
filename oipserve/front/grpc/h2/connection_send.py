"""Frames out, under the peer's windows (``h2.connection``'s layers: ``connection_state``).

A call's header blocks (split into CONTINUATION frames past the peer's frame size) and
its DATA: a small message as one frame at once when both windows allow, a larger one as
the windows and the transport allow (``send_data`` waits for both). The peer's side of
flow control is kept here: its WINDOW_UPDATE frames and its initial stream window
(RFC 9113, 6.9). What a call ends from this side (``reset_stream``) and the keepalive's
PING leave here too.
"""

from __future__ import annotations

import asyncio
from typing import Final

from mypy_extensions import mypyc_attr

from oipserve.front.grpc.h2.connection_state import ConnectionState, Stream
from oipserve.front.grpc.h2.frames import (
    END_HEADERS,
    END_STREAM,
    MAX_WINDOW,
    U32,
    ErrorCode,
    Frame,
    ProtocolError,
    frame,
    frame_header,
)

#: Bytes of DATA frames written before a large send lets the loop run others.
_SEND_SLICE: Final = 1024 * 1024
#: The payload of a keepalive PING (``front.grpc.keepalive``): any frame back answers it.
_KEEPALIVE_PING: Final = b"keepaliv"


# NOTE: compiled (mypyc); each layer allows the interpreted subclass that
#   ``front.http.h2_connection.Http2Connection`` is of the top one.
@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectionSender(ConnectionState):
    """Header blocks and DATA out; the peer's windows for them."""

    def send_headers(self, stream: int, block: bytes, end_stream: bool = False) -> None:
        """A header block: one HEADERS frame, or HEADERS and CONTINUATION frames none
        larger than the peer's SETTINGS_MAX_FRAME_SIZE (RFC 9113, 4.2, 6.10)."""
        flags = END_STREAM if end_stream else 0
        size = self._peer_max_frame
        if len(block) <= size:
            self._write(
                frame_header(len(block), Frame.HEADERS, flags | END_HEADERS, stream) + block
            )
        else:
            self._split_headers(stream, block, flags)
        if end_stream:
            self.finished(stream)

    def _split_headers(self, stream: int, block: bytes, flags: int) -> None:
        """A header block over the peer's frame size, written in one go (no frame of
        another stream may come between, 6.10)."""
        size = self._peer_max_frame
        kind = Frame.HEADERS
        for pos in range(0, len(block), size):
            part = block[pos : pos + size]
            last = END_HEADERS if pos + size >= len(block) else 0
            self._write(frame_header(len(part), kind, flags | last, stream) + part)
            kind, flags = Frame.CONTINUATION, 0

    def send_small(self, call: Stream, stream: int, data: bytes) -> bool:
        """Send ``data`` as one DATA frame now, if both windows and the frame size allow."""
        size = len(data)
        if size > self._send_window or size > call.send_window or size > self._peer_max_frame:
            return False
        self._send_window -= size
        call.send_window -= size
        self._write(frame_header(size, Frame.DATA, 0, stream) + data)
        return True

    def send_reply(self, call: Stream, stream: int, head: bytes, data: bytes, tail: bytes) -> bool:
        """A whole answer at once, if both windows and the frame size allow: the header
        block ``head``, ``data`` as one DATA frame, the last header block ``tail`` (which
        ends the stream). Done with the stream. When it was the connection's only one
        open, the three frames leave now, in one write: no other stream's would join them
        in this loop iteration, and the iteration a scheduled flush takes is saved."""
        size = len(data)
        limit = self._peer_max_frame
        if size > self._send_window or size > call.send_window or size > limit:
            return False
        if len(head) > limit or len(tail) > limit:
            return False
        self._send_window -= size
        call.send_window -= size
        frames = b"".join(
            [
                frame_header(len(head), Frame.HEADERS, END_HEADERS, stream),
                head,
                frame_header(size, Frame.DATA, 0, stream),
                data,
                frame_header(len(tail), Frame.HEADERS, END_HEADERS | END_STREAM, stream),
                tail,
            ]
        )
        if len(self.streams) == 1:
            self._out.write_now(frames)
        else:
            self._write(frames)
        self.finished(stream)
        return True

    async def send_data(self, call: Stream, stream: int, data: memoryview) -> None:
        """Send ``data`` in DATA frames, as the windows and the transport allow.

        Frames are views of ``data``, which the transport may hold until they are sent:
        ``data`` is immutable bytes, or memory whose release waits for its last view
        (``off_loop.unmap_off_loop``). The loop runs others every ``_SEND_SLICE``
        bytes. Raises ``ConnectionError`` if the stream or the connection ends meanwhile.
        """
        pos = 0
        sent = 0
        while pos < len(data):
            if self.lost or self.streams.get(stream) is not call:
                raise ConnectionError("the stream was closed")
            room = min(self._send_window, call.send_window, self._peer_max_frame, len(data) - pos)
            if room <= 0 or self._paused:
                self._can_send.clear()
                self._out.flush()
                await self._can_send.wait()
                continue
            self._send_window -= room
            call.send_window -= room
            self._out.write(frame_header(room, Frame.DATA, 0, stream))
            self._out.write(data[pos : pos + room])
            pos += room
            sent += room
            if sent >= _SEND_SLICE:
                sent = 0
                self._out.flush()
                await asyncio.sleep(0)

    async def sent(self) -> None:
        """Return once everything written so far is in the kernel's hands."""
        await self._out.sent()

    def reset_stream(self, stream: int, code: ErrorCode) -> None:
        """End a stream from this side (the call, if any, is not told).

        A reset the client provoked (a malformed request, a stream past its queue) counts
        against the flood budget, as ``_stream_error``'s do ("MadeYouReset",
        CVE-2025-8671); our own ends (CANCEL: a timeout; NO_ERROR) do not. Called from
        calls and timers too, so past the budget the connection is ended here rather
        than by raising."""
        self._reset(stream, code)
        self.finished(stream)
        if code is not ErrorCode.CANCEL and code is not ErrorCode.NO_ERROR:
            try:
                self._flood("provoked RST_STREAM")
            except ProtocolError as exc:
                self._abort(exc.code, str(exc))

    def ping(self) -> None:
        """A keepalive PING (its ACK, like any frame, counts as the client's answer)."""
        self._write(frame(Frame.PING, 0, 0, _KEEPALIVE_PING))

    # ---- the peer's windows ------------------------------------------------------------

    def _initial_window(self, value: int) -> None:
        """The peer's new initial stream window: every open stream's moves by the change
        (RFC 9113, 6.9.2), and none may pass 2^31-1."""
        delta = value - self._peer_stream_window
        self._peer_stream_window = value
        for call in self.streams.values():
            call.send_window += delta
            if call.send_window > MAX_WINDOW:
                raise ProtocolError("a stream's window over 2^31-1", ErrorCode.FLOW_CONTROL_ERROR)
        self._can_send.set()

    def _window_update(self, stream: int, payload: memoryview) -> None:
        """RFC 9113, 6.9: 4 bytes; a zero increment is PROTOCOL_ERROR and a window past
        2^31-1 FLOW_CONTROL_ERROR, for the connection on stream 0, else for the stream."""
        if len(payload) != 4:
            raise ProtocolError("a WINDOW_UPDATE of other than 4 bytes", ErrorCode.FRAME_SIZE_ERROR)
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream == 0:
            if increment == 0:
                raise ProtocolError("a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolError("the window over 2^31-1", ErrorCode.FLOW_CONTROL_ERROR)
        else:
            if stream > self._ids.last:
                raise ProtocolError(f"WINDOW_UPDATE on idle stream {stream}")
            call = self.streams.get(stream)
            if call is None:
                return
            if increment == 0:
                self._stream_error(stream, ErrorCode.PROTOCOL_ERROR)
                return
            if call.send_window + increment > MAX_WINDOW:
                self._stream_error(stream, ErrorCode.FLOW_CONTROL_ERROR)
                return
            call.send_window += increment
        self._can_send.set()
