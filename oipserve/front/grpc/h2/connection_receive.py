"""Frames in (``h2.connection``'s layers: ``connection_state``): each frame type handled
as RFC 9113 says, streams opened and fed, the receive windows kept.

- HEADERS (+ CONTINUATION): a new stream's headers start a call; the block is decoded
  by ``headers.HeaderDecoder``.
- DATA: the payload goes to the stream's call as it arrives, also when a frame is only
  partly in (a large message is never buffered here, frame by frame). Unpadded
  frames only; padded ones (which gRPC clients do not send) are read whole.
- WINDOW_UPDATE / SETTINGS: the peer's windows and frame size, for ``connection_send``
  (which applies the windows); waiting senders wake up.
- PING, SETTINGS: acknowledged. RST_STREAM: the call is cancelled. GOAWAY: no new
  streams; the connection closes once its calls end.

Receiving (RFC 9113, 6.9), both windows are checked (``receive_windows``): DATA past
the connection's is a connection FLOW_CONTROL_ERROR, past a stream's a stream one
(padding counts).
"""

from __future__ import annotations

import struct
from typing import Final

from mypy_extensions import mypyc_attr

from oipserve.front.grpc.h2.connection_send import ConnectionSender
from oipserve.front.grpc.h2.connection_state import (
    DATA_SAMPLE,
    GOAWAY_PING,
    MAX_FRAME,
    MAX_STREAMS,
    Stream,
)
from oipserve.front.grpc.h2.frames import (
    ACK,
    DEFAULT_MAX_FRAME,
    END_HEADERS,
    END_STREAM,
    HEADER,
    HEADER_SIZE,
    MAX_WINDOW,
    PADDED,
    PREFACE,
    PRIORITY_FLAG,
    U32,
    ErrorCode,
    Frame,
    ProtocolError,
    Setting,
    frame,
)
from oipserve.front.grpc.h2.headers import MAX_HEADER_LIST, NO_LENGTH, Headers

#: CONTINUATION frames one header block may take after its HEADERS (CVE-2024-27316).
#: nghttp2 stops at 8, python-hyper's h2 at 64; 16 lets a 64 KiB header list through
#: even in 4 KiB fragments (a client may send ours in one frame up to 256 KiB), and
#: stops a flood of empty frames before it costs anything.
MAX_CONTINUATIONS: Final = 16
#: Entries one SETTINGS frame may carry: RFC 9113 defines 6 (extensions a few more),
#: and a frame of 256 KiB could hold 43,690.
MAX_SETTINGS_ENTRIES: Final = 32
#: A header block's flags, past the wire's byte: its PRIORITY names its own stream.
_SELF_DEPENDENT: Final = 0x100


# NOTE: compiled (mypyc); each layer allows the interpreted subclass that
#   ``front.http.h2_connection.Http2Connection`` is of the top one.
@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectionReceiver(ConnectionSender):
    """Every frame the peer sends, handled in order."""

    def _frames(self, view: memoryview) -> int:
        """Handle every whole frame in ``view`` (and the DATA payload in it); return
        where the first incomplete one starts."""
        pos = 0
        end = len(view)
        if not self._preface:
            if end < len(PREFACE):
                return 0
            if view[: len(PREFACE)] != PREFACE:
                raise ProtocolError("not an HTTP/2 client (no connection preface)")
            self._preface = True
            pos = len(PREFACE)
        if self._data_left:
            pos = self._data(view, pos)
        while end - pos >= HEADER_SIZE:
            high, low, kind, flags, stream = HEADER.unpack_from(view, pos)
            length = (high << 8) | low
            stream &= 0x7FFFFFFF
            if length > MAX_FRAME:
                raise ProtocolError(f"a frame of {length} bytes", ErrorCode.FRAME_SIZE_ERROR)
            if self._continued is not None and kind != Frame.CONTINUATION:
                raise ProtocolError("a header block was not continued")
            if not self._settled and kind != Frame.SETTINGS:
                raise ProtocolError("the first frame was not SETTINGS")
            if kind == Frame.DATA and not flags & PADDED:
                if not flags & END_STREAM:
                    if not length:
                        self._flood("empty DATA")
                    # PERF: two integers a frame; judged once every DATA_SAMPLE frames.
                    self._data_frames += 1
                    self._data_bytes += length
                    if self._data_frames >= DATA_SAMPLE:
                        self._judge_data_frames()
                self._data_stream, self._data_left, self._data_flags = stream, length, flags
                # PERF: the windows' fast path inline (one dict read and write a frame).
                windows = self._windows
                window = windows.streams.get(stream, -1)
                if length <= window and length <= windows.connection:
                    windows.connection -= length
                    windows.streams[stream] = window - length
                elif length:
                    self._take_window(stream, length)  # past it, reset: the payload is skipped
                pos = self._data(view, pos + HEADER_SIZE)
                continue
            if end - pos - HEADER_SIZE < length:
                break
            start = pos + HEADER_SIZE
            pos = start + length
            self._frame(kind, flags, stream, view[start:pos])
        return pos

    def _take_window(self, stream: int, length: int) -> bool:
        """Count a DATA frame's ``length`` against the windows (RFC 9113, 6.9); False if
        it went past its stream's (which is reset; its payload is dropped).

        Raises ProtocolError (FLOW_CONTROL_ERROR) past the connection's window.
        """
        if self._windows.take(stream, length):
            return True
        self._stream_error(stream, ErrorCode.FLOW_CONTROL_ERROR)
        return False

    def _data(self, view: memoryview, pos: int) -> int:
        """Stream the current DATA frame's payload in ``view[pos:]``; return where it ends."""
        take = min(self._data_left, len(view) - pos)
        self._data_left -= take
        stream = self._data_stream
        if stream == 0:
            raise ProtocolError("DATA on stream 0")
        call = self.streams.get(stream)
        if call is None:
            if stream > self._ids.last:
                raise ProtocolError(f"DATA on idle stream {stream}")
            if not self._data_left:  # judged once a frame, at its end
                self._closed_data(stream)
            return pos + take  # a stream already closed: only the connection's window counts
        if self._declared and stream in self._declared and not self._counted(stream, take):
            return pos + take
        if take:
            call.data_received(view[pos : pos + take])
        if not self._data_left and self._data_flags & END_STREAM:
            call.end_received()
        return pos + take

    def _closed_data(self, stream: int) -> None:
        """DATA on a closed stream (RFC 9113, 5.1): ignored where this side reset the
        stream (the client may have sent it before it heard); else a stream error,
        STREAM_CLOSED (the client had ended or reset the stream itself)."""
        if self._ids.ignored(stream):
            return
        self._flood("closed-stream DATA")
        self._reset(stream, ErrorCode.STREAM_CLOSED)

    def _counted(self, stream: int, take: int) -> bool:
        """Count DATA against the content-length its request declared (RFC 9113, 8.1.1):
        more, or less by the stream's end, makes the request malformed (a stream error,
        and False)."""
        left = self._declared[stream] - take
        if left < 0 or (left and not self._data_left and self._data_flags & END_STREAM):
            self._stream_error(stream, ErrorCode.PROTOCOL_ERROR)
            return False
        self._declared[stream] = left
        return True

    def _padded_data(self, flags: int, stream: int, payload: memoryview) -> None:
        """A padded DATA frame, read whole: all of it counts against the windows
        (RFC 9113, 6.9.1); the padding is given back at once."""
        padding = payload[0] if payload else 0
        if padding >= len(payload):
            raise ProtocolError("padding longer than the frame")
        data = payload[1 : len(payload) - padding]
        if not flags & END_STREAM:
            if not data:
                self._flood("empty DATA")
            self._data_frames += 1
            self._data_bytes += len(payload)
            if self._data_frames >= DATA_SAMPLE:
                self._judge_data_frames()
        if payload and not self._take_window(stream, len(payload)):
            return
        self._data_stream, self._data_left, self._data_flags = stream, len(data), flags
        self._data(data, 0)
        self.acknowledge(stream, 1 + padding)

    def _frame(self, kind: int, flags: int, stream: int, payload: memoryview) -> None:
        if kind == Frame.HEADERS or kind == Frame.CONTINUATION:
            self._header_frame(kind, flags, stream, payload)
        elif kind == Frame.DATA:  # padded
            self._padded_data(flags, stream, payload)
        elif kind == Frame.SETTINGS:
            self._settings_frame(flags, stream, payload)
        elif kind == Frame.WINDOW_UPDATE:
            self._window_update(stream, payload)
        elif kind == Frame.PING:
            self._ping(flags, stream, payload)
        elif kind == Frame.RST_STREAM:
            self._rst_stream(stream, payload)
        elif kind == Frame.GOAWAY:
            if stream != 0:
                raise ProtocolError("GOAWAY on a stream")
            if len(payload) < 8:
                raise ProtocolError("a GOAWAY under 8 bytes", ErrorCode.FRAME_SIZE_ERROR)
            self.going_away = True
            self._maybe_close()
        elif kind == Frame.PRIORITY:
            self._priority(stream, payload)
        elif kind == Frame.PUSH_PROMISE:
            raise ProtocolError("a client may not push")
        # Unknown frame types are ignored (RFC 9113, 4.1, 5.5).

    def _settings_frame(self, flags: int, stream: int, payload: memoryview) -> None:
        """RFC 9113, 6.5: on stream 0; an ACK is empty; else applied and acknowledged."""
        if stream != 0:
            raise ProtocolError("SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError("a SETTINGS ACK with a payload", ErrorCode.FRAME_SIZE_ERROR)
            return
        self._flood("SETTINGS")
        self._settings(payload)
        if not self._settled:
            self._settled = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self._write(frame(Frame.SETTINGS, ACK, 0))

    def _settings(self, payload: memoryview) -> None:
        """Apply a SETTINGS frame's entries (RFC 9113, 6.5.2).

        Only its last INITIAL_WINDOW_SIZE is applied, so one frame walks the open
        streams once at most.
        """
        if len(payload) % 6:
            raise ProtocolError("a SETTINGS frame of odd length", ErrorCode.FRAME_SIZE_ERROR)
        if len(payload) > 6 * MAX_SETTINGS_ENTRIES:
            raise ProtocolError("a SETTINGS frame of too many entries", ErrorCode.ENHANCE_YOUR_CALM)
        window = -1
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError("a window over 2^31-1", ErrorCode.FLOW_CONTROL_ERROR)
                window = value
            elif key == Setting.MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise ProtocolError("a frame size out of range")
                self._peer_max_frame = value
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise ProtocolError("ENABLE_PUSH other than 0 or 1")
        if window >= 0:
            self._initial_window(window)

    def _ping(self, flags: int, stream: int, payload: memoryview) -> None:
        """RFC 9113, 6.7: 8 bytes on stream 0; answered unless it is an answer."""
        if len(payload) != 8:
            raise ProtocolError("a PING of other than 8 bytes", ErrorCode.FRAME_SIZE_ERROR)
        if stream != 0:
            raise ProtocolError("PING on a stream")
        if not flags & ACK:
            self._flood("PING")
            self._write(frame(Frame.PING, ACK, 0, bytes(payload)))
        elif self.announcing and payload == GOAWAY_PING:
            self._last_goaway()

    def _rst_stream(self, stream: int, payload: memoryview) -> None:
        """RFC 9113, 6.4 and 5.1: 4 bytes, on a stream that is not idle; the call ends."""
        if len(payload) != 4:
            raise ProtocolError("a RST_STREAM of other than 4 bytes", ErrorCode.FRAME_SIZE_ERROR)
        if stream == 0:
            raise ProtocolError("RST_STREAM on stream 0")
        if stream > self._ids.last:
            raise ProtocolError(f"RST_STREAM on idle stream {stream}")
        self._ids.reset_by_client(stream)
        call = self._forget(stream)
        if call is not None:
            # NOTE: only a reset that cancels a live call is counted (rapid reset); one
            #   that follows our own end of the stream is routine for some clients.
            self._flood("RST_STREAM")
            call.reset()
            self._maybe_close()

    def _priority(self, stream: int, payload: memoryview) -> None:
        """RFC 9113, 6.3: 5 bytes (else a stream error), never on stream 0; then ignored
        (5.3.2), also on an idle stream."""
        if stream == 0:
            raise ProtocolError("PRIORITY on stream 0")
        if len(payload) != 5:
            if stream > self._ids.last:  # no RST_STREAM on an idle stream (6.4)
                raise ProtocolError("a PRIORITY of other than 5 bytes", ErrorCode.FRAME_SIZE_ERROR)
            self._stream_error(stream, ErrorCode.FRAME_SIZE_ERROR)
        elif U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream:
            # 5.3.1: a stream cannot depend on itself; a stream error, but never a
            # RST_STREAM on an idle stream (6.4).
            if stream > self._ids.last:
                raise ProtocolError(f"idle stream {stream} depends on itself")
            self._stream_error(stream, ErrorCode.PROTOCOL_ERROR)

    def _header_frame(self, kind: int, flags: int, stream: int, payload: memoryview) -> None:
        if kind == Frame.CONTINUATION:
            if self._continued is None or self._continued[0] != stream:
                raise ProtocolError("CONTINUATION without HEADERS")
            # NOTE: a running count and length (CVE-2024-27316): empty frames never
            #   reach the byte limit, and summing the list per frame is quadratic.
            self._continued_frames += 1
            self._continued_bytes += len(payload)
            if self._continued_frames > MAX_CONTINUATIONS:
                raise ProtocolError(
                    "a header block in too many frames", ErrorCode.ENHANCE_YOUR_CALM
                )
            if self._continued_bytes > MAX_HEADER_LIST:
                raise ProtocolError("a header block over the limit", ErrorCode.ENHANCE_YOUR_CALM)
            self._continued[1].append(bytes(payload))
            if not flags & END_HEADERS:
                return
            stream, blocks, flags = self._continued
            self._continued = None
            block = b"".join(blocks)
        else:
            if stream == 0:
                raise ProtocolError("HEADERS on stream 0")
            start, stop = 0, len(payload)
            if flags & PADDED:
                start, stop = 1, stop - (payload[0] if stop else 0)
            if flags & PRIORITY_FLAG:
                if stop - start >= 5 and U32.unpack_from(payload, start)[0] & 0x7FFFFFFF == stream:
                    flags |= _SELF_DEPENDENT  # judged once the block is decoded
                start += 5
            if start > stop:
                raise ProtocolError("a HEADERS frame shorter than its padding")
            block = bytes(payload[start:stop])
            if not block and not flags & END_STREAM:
                self._flood("empty HEADERS")
            if not flags & END_HEADERS:
                self._continued = (stream, [block], flags)
                self._continued_frames = 0
                self._continued_bytes = len(block)
                return
        headers = self._headers.decode(block)  # always: it updates the decoder's table
        end_stream = bool(flags & END_STREAM)
        if flags & _SELF_DEPENDENT:
            self._depends_on_itself(stream)
            return
        call = self.streams.get(stream)
        if call is not None:  # trailers from the client
            self._trailers(stream, call, headers, end_stream)
            return
        if not self._ids.opens(stream):
            # HEADERS that open nothing (``StreamIds.judge_closed_headers``).
            if self._ids.judge_closed_headers(stream, end_stream):
                self._flood("closed-stream HEADERS")
                self._reset(stream, ErrorCode.STREAM_CLOSED)
            return
        self._ids.open(stream)
        if self.going_away or len(self.streams) >= MAX_STREAMS:
            self._reset(stream, ErrorCode.REFUSED_STREAM)
            return
        if self._headers.content_length != NO_LENGTH and not self._declare(stream, end_stream):
            return
        call = self._open_stream(stream)
        call.send_window = self._peer_stream_window
        self.streams[stream] = call
        self._windows.open(stream)
        call.headers_received(headers, end_stream)

    def _depends_on_itself(self, stream: int) -> None:
        """A header block whose priority names its own stream (RFC 9113, 5.3.1): a stream
        error, PROTOCOL_ERROR; a new stream's id is used up and no call starts."""
        if stream % 2 == 0:
            raise ProtocolError(f"a client stream with an even id ({stream})")
        if stream > self._ids.last:
            self._ids.open(stream)
        self._stream_error(stream, ErrorCode.PROTOCOL_ERROR)

    def _trailers(self, stream: int, call: Stream, headers: Headers, end_stream: bool) -> None:
        """The client's trailers (RFC 9113, 8.1): they end the stream and carry no
        pseudo-header, and the content-length declared (if any) came whole; else the
        request is malformed, a stream error."""
        if (
            not end_stream
            or any(name[:1] == ":" for name, _ in headers)
            or self._declared.get(stream, 0)
        ):
            self._stream_error(stream, ErrorCode.PROTOCOL_ERROR)
            return
        call.end_received()

    def _declare(self, stream: int, end_stream: bool) -> bool:
        """A new stream's request declared its content-length (RFC 9113, 8.1.1): the DATA
        to come is counted against it. A length that is no number, or one the stream
        ended short of, is malformed: a stream error, no call, and False."""
        length = self._headers.content_length
        if length < 0 or (end_stream and length):
            self._reset(stream, ErrorCode.PROTOCOL_ERROR)
            return False
        if not end_stream:
            self._declared[stream] = length
        return True

    # ---- what calls use -------------------------------------------------------------

    def acknowledge(self, stream: int, nbytes: int) -> None:
        """The call took ``nbytes`` of its stream: the peer may send that much more on
        it, and on the connection."""
        self._windows.acknowledge(stream, nbytes)

    def keep_window(self, stream: int) -> None:
        """The request of ``stream`` is whole: it keeps what it took of the windows until
        it ends (``ReceiveWindows.keep``)."""
        self._windows.keep(stream)

    def window_withheld(self, need: int) -> bool:
        """The client cannot send ``need`` more bytes because of us: the connection's
        window is spent on requests we hold (``ReceiveWindows.withheld``)."""
        return self._windows.withheld(need)
