"""One client's HTTP/2 connection: frames in, streams, flow control both ways, frames out.

Every stream is a gRPC call (``call.Call``); this module knows nothing of gRPC beyond
that. What it does per frame type:

- HEADERS (+ CONTINUATION): a new stream's headers start a call; the block is decoded
  by ``headers.HeaderDecoder``.
- DATA: the payload goes to the stream's call as it arrives, also when a frame is only
  partly in (a large message is never buffered here, frame by frame). Unpadded
  frames only; padded ones (which gRPC clients do not send) are read whole.
- WINDOW_UPDATE / SETTINGS: the send windows and the peer's frame size; waiting
  senders wake up.
- PING, SETTINGS: acknowledged. RST_STREAM: the call is cancelled. GOAWAY: no new
  streams; the connection closes once its calls end.

Receiving (RFC 9113, 6.9), both windows are checked (``receive_windows``): DATA past
the connection's is a connection FLOW_CONTROL_ERROR, past a stream's a stream one
(padding counts). Sending, ``send_data`` waits for both windows and for the transport to
drain. The socket is not read while the client does not read (``pause_writing``), nor
while 16 of its cancelled requests still run in the workers (``runtime.abandoned_work``:
the calls' tasks run in a context that counts them, ``run``).

PERF: all frames written in one loop iteration leave in one write (``_out``, an
``http_io.CorkedTransport``, as for HTTP/1.1); a tiny call costs one header-block
lookup, one task, and no await for windows.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import struct
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

from oipserve.front.grpc.h2.frames import (
    ACK,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    HEADER,
    HEADER_SIZE,
    MAX_WINDOW,
    PADDED,
    PREFACE,
    PRIORITY_FLAG,
    ErrorCode,
    Frame,
    ProtocolError,
    Setting,
    frame,
    frame_header,
    goaway,
    rst_stream,
    settings_frame,
    window_update,
)
from oipserve.front.grpc.h2.headers import MAX_HEADER_LIST, NO_LENGTH, HeaderDecoder, Headers
from oipserve.front.grpc.h2.receive_windows import (
    CONNECTION_WINDOW,
    STREAM_WINDOW,
    ReceiveWindows,
)
from oipserve.front.grpc.h2.stream_ids import StreamIds
from oipserve.runtime.abandoned_work import ABANDONED_WORK, LIMIT, AbandonedWork
from oipserve.runtime.http_io import CorkedTransport

log = logging.getLogger("oipserve.grpc")

#: Calls one connection may run at once (clients queue the rest).
MAX_STREAMS = 1024
#: The largest frame clients may send; DATA frames are streamed, not buffered whole.
MAX_FRAME = 256 * 1024
#: Bytes of DATA frames written before a large send lets the loop run others.
_SEND_SLICE = 1024 * 1024
#: Bytes read before the connection lets the loop run others: libuv reads a socket up
#: to 32 times a wake-up (7.5 MB measured in one turn, 64 MiB uploads), all copied into
#: their segments while every other client of the loop waited.
_READ_SLICE = 1024 * 1024
#: CONTINUATION frames one header block may take after its HEADERS (CVE-2024-27316).
#: nghttp2 stops at 8, python-hyper's h2 at 64; 16 lets a 64 KiB header list through
#: even in 4 KiB fragments (a client may send ours in one frame up to 256 KiB), and
#: stops a flood of empty frames before it costs anything.
MAX_CONTINUATIONS = 16
#: Entries one SETTINGS frame may carry: RFC 9113 defines 6 (extensions a few more),
#: and a frame of 256 KiB could hold 43,690.
MAX_SETTINGS_ENTRIES = 32
#: A header block's flags, past the wire's byte: its PRIORITY names its own stream.
_SELF_DEPENDENT = 0x100
#: Frames that cost us work and carry no request (RST_STREAM, PING, SETTINGS, empty
#: DATA or HEADERS) a client may send per ``FLOOD_INTERVAL`` before a GOAWAY ENHANCE_YOUR_CALM
#: (RFC 9113, 10.5; rapid reset, CVE-2023-44487): nghttp2's stream-reset budget is a
#: burst of 1,000 refilled at 33/s, about this.
FLOOD_BUDGET = 1000
FLOOD_INTERVAL = 10.0
#: Seconds a client has to send the preface and its SETTINGS (``--header-timeout``'s
#: default, as an HTTP/1.1 request head has).
PREFACE_TIMEOUT = 10.0

#: Seconds a shutdown's first GOAWAY (last stream 2^31-1) waits for the answer to the
#: PING sent with it before the second names the real last stream (RFC 9113, 6.8): calls
#: a client sent before it heard the first are still taken.
GOAWAY_ROUND_TRIP = 1.0
#: The payload of that PING, to know its answer.
_GOAWAY_PING = b"goaway\x00\x00"
#: The payload of a keepalive PING (``front.grpc.keepalive``): any frame back answers it.
_KEEPALIVE_PING = b"keepaliv"

_SETTINGS = settings_frame(
    {
        Setting.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
        Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        Setting.MAX_FRAME_SIZE: MAX_FRAME,
        Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
        Setting.ENABLE_PUSH: 0,
    }
) + window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW)
_U32 = struct.Struct(">I")


class Stream(Protocol):
    """What the connection drives: one call on one stream (``call.Call``)."""

    #: Bytes the peer may still send on it before the stream's window is given back.
    send_window: int

    def headers_received(self, headers: Headers, end_stream: bool) -> None: ...

    def data_received(self, data: memoryview) -> None: ...

    def end_received(self) -> None: ...

    def reset(self) -> None:
        """The stream ended without an answer (RST_STREAM, or the connection went)."""


class _HandedOver(asyncio.Transport):
    """Where a connection writes once its socket was handed to the linger: nowhere."""

    def is_closing(self) -> bool:
        return True

    def close(self) -> None:
        pass


_HANDED_OVER = _HandedOver()


class Connection(asyncio.Protocol):
    """The HTTP/2 server side of one client connection."""

    def __init__(
        self,
        new_stream: Callable[[Connection, int], Stream],
        closed: Callable[[Connection], None],
        preface_timeout: float = PREFACE_TIMEOUT,
        linger: Callable[[asyncio.Transport], bool] | None = None,
        one_client: bool = True,
    ) -> None:
        self._new_stream = new_stream
        self._closed = closed
        #: Takes the socket after a connection error's GOAWAY, to close it without losing
        #: the GOAWAY (``front.grpc.linger``); False, or None: it is closed at once.
        self._linger = linger
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self._headers = HeaderDecoder()
        self._pending = b""
        self._preface = False
        #: The peer's first SETTINGS came (RFC 9113, 3.4: its first frame).
        self._settled = False
        #: Until the peer's first SETTINGS, its preface timer; once a shutdown's first
        #: GOAWAY went out, the timer of the second (never both: a shutdown closes a
        #: connection not yet open at once).
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(
            preface_timeout, self._preface_late
        )
        #: Flood-prone frames counted since ``_flood_since`` (loop time; checked lazily).
        self._flood_count = 0
        self._flood_since = 0.0
        #: The DATA frame being streamed: its stream id, bytes left, flags.
        self._data_stream = 0
        self._data_left = 0
        self._data_flags = 0
        #: HEADERS waiting for CONTINUATION: stream id, block so far, flags; and the
        #: CONTINUATION frames and bytes it has taken so far.
        self._continued: tuple[int, list[bytes], int] | None = None
        self._continued_frames = 0
        self._continued_bytes = 0
        #: The client's stream ids: the last opened, those skipped, those closed.
        self._ids = StreamIds()
        #: Open streams whose request declared its content-length: the bytes still to come.
        self._declared: dict[int, int] = {}
        #: Receiving: what the peer may still send on the connection and each open stream.
        self._windows = ReceiveWindows(self._write)
        #: The transport, writes gathered per loop turn (from ``connection_made`` on).
        self._out: CorkedTransport
        # The peer's side: its window for our DATA, its streams' initial window, its frames.
        self._send_window = DEFAULT_WINDOW
        self._peer_stream_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        #: Set while senders may go on: windows open, transport not paused.
        self._can_send = asyncio.Event()
        self._can_send.set()
        self._paused = False
        #: A GOAWAY went out (or came in): no new streams; close when the last ends.
        self.going_away = False
        self.lost = False
        #: Reads so far: the keepalive's sign of life (``front.grpc.keepalive``), one
        #: integer a read rather than a clock per frame.
        self.reads = 0
        #: Bytes read since reading last let the loop run others (``_READ_SLICE``).
        self._read_slice = 0
        #: The requests of this client's calls that were cancelled (reset) while a worker
        #: still runs them; past a bound the connection is not read until they are done.
        #: Not counted on a connection of many clients (``one_client`` False: the private
        #: socket's, other fronts' forwarded calls).
        self.abandoned = AbandonedWork(self._hold_reading, self._resume_reading)
        #: What the calls' tasks run in (``run``): where ``infer_on`` finds ``abandoned``.
        self._context = contextvars.copy_context()
        self._context.run(ABANDONED_WORK.set, self.abandoned if one_client else None)
        #: The log has said this connection was held (``_hold_reading``: said once).
        self._held_before = False

    # ---- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # NOTE: asyncio types the hook for every protocol; a stream protocol's transport is
        #   a Transport (uvloop's is too, though not a subclass).
        self.transport = cast(asyncio.Transport, transport)
        self._out = CorkedTransport(self.transport, self._loop)
        self._write(_SETTINGS)
        self._flood_since = self._loop.time()

    def _preface_late(self) -> None:
        """A client that has not opened properly in time holds a socket for nothing."""
        self._timer = None
        if not self._settled and not self.lost and self.transport is not None:
            self._abort(ErrorCode.PROTOCOL_ERROR, "no connection preface in time")

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        if self._pending:
            data = self._pending + data
            self._pending = b""
        try:
            end = self._frames(memoryview(data))
        except ProtocolError as exc:
            log.debug("gRPC connection closed: %s", exc)
            self._abort(exc.code, str(exc))
            return
        except Exception:
            log.exception("unexpected error on a gRPC connection; it is closed")
            self._abort(ErrorCode.INTERNAL_ERROR, "internal server error")
            return
        if end < len(data):
            self._pending = data[end:]
        self._read_slice += len(data)
        if self._read_slice >= _READ_SLICE:
            self._read_slice = 0
            self._yield_reading()

    def _yield_reading(self) -> None:
        """No more reads this loop turn: the loop's other clients get their turn first."""
        transport = self.transport
        if transport is not None and not self._paused and not transport.is_closing():
            transport.pause_reading()
            self._loop.call_soon(self._resume_reading)

    def _resume_reading(self) -> None:
        transport = self.transport
        if (
            transport is not None
            and not self._paused
            and not self.abandoned.holding
            and not transport.is_closing()
        ):
            transport.resume_reading()

    def _hold_reading(self) -> None:
        """No reading while the client's abandoned requests run (``abandoned``); said
        once a connection, so that a client stalled so has a line in the log."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.pause_reading()
        if not self._held_before:
            self._held_before = True
            log.info(
                "HTTP/2 connection from %s not read while %d of its cancelled requests still "
                "run in the workers; read again once %d are left (logged once a connection)",
                transport.get_extra_info("peername"),
                self.abandoned.running,
                LIMIT // 2,
            )

    def run(self, call: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A call's task, in a context of its own that knows this connection's
        ``abandoned`` requests."""
        return self._loop.create_task(call, context=self._context.copy())

    def _abort(self, code: ErrorCode, message: str) -> None:
        """A connection error: its GOAWAY, then the socket closed.

        Closed with the peer's frames unread (a flood's always are), the socket is reset,
        and the reset drops the GOAWAY wherever the peer has not read it yet. So where the
        ``linger`` takes the socket (its FIN follows the GOAWAY, it reads nothing, it is
        closed shortly), this connection lets go of it and ends now, as at a lost
        connection: its streams are reset and its slot freed (``closed``).
        """
        self._write(goaway(self._ids.last, code, message))
        transport = self.transport
        if self._linger is None or transport is None or self.lost:
            self.close()
            return
        self._out.flush()
        if not self._linger(transport):
            self.close()
            return
        # What is still written goes nowhere (the transport would raise after its
        # write_eof); the end comes next turn, as a close's does (what is left of the
        # frames being read may still open streams: they are reset with the others).
        self._out = CorkedTransport(_HANDED_OVER, self._loop)
        self.transport = None
        self._loop.call_soon(self.connection_lost, None)

    def pause_writing(self) -> None:
        # NOTE: no reading while the client does not read: a client that sends calls and
        #   never reads their answers would otherwise grow the transport's buffer without
        #   bound (uvicorn does the same for HTTP/1.1).
        self._paused = True
        self._can_send.clear()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        self._can_send.set()
        self._resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._can_send.set()  # senders find the connection gone
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.reset()
        self._closed(self)

    # ---- frames in ------------------------------------------------------------------

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
                if not length and not flags & END_STREAM:
                    self._flood("empty DATA")
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

    def _forget(self, stream: int) -> Stream | None:
        """Close ``stream`` on this side: what its call had not taken goes back to the
        connection's window."""
        call = self.streams.pop(stream, None)
        if call is not None:
            self._windows.forget(stream)
            if self._declared:
                self._declared.pop(stream, None)
        return call

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

    def _padded_data(self, flags: int, stream: int, payload: memoryview) -> None:
        """A padded DATA frame, read whole: all of it counts against the windows
        (RFC 9113, 6.9.1); the padding is given back at once."""
        padding = payload[0] if payload else 0
        if padding >= len(payload):
            raise ProtocolError("padding longer than the frame")
        data = payload[1 : len(payload) - padding]
        if not data and not flags & END_STREAM:
            self._flood("empty DATA")
        if payload and not self._take_window(stream, len(payload)):
            return
        self._data_stream, self._data_left, self._data_flags = stream, len(data), flags
        self._data(data, 0)
        self.acknowledge(stream, 1 + padding)

    def _flood(self, what: str) -> None:
        """Count a frame that costs work and carries no request (RFC 9113, 10.5).

        Past ``FLOOD_BUDGET`` within ``FLOOD_INTERVAL`` the connection ends; the clock
        is read only when the budget is spent (no timer, one integer per frame).
        """
        self._flood_count += 1
        if self._flood_count <= FLOOD_BUDGET:
            return
        now = self._loop.time()
        if now - self._flood_since < FLOOD_INTERVAL:
            raise ProtocolError(f"too many {what} frames", ErrorCode.ENHANCE_YOUR_CALM)
        self._flood_since = now
        self._flood_count = 1

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

    def _ping(self, flags: int, stream: int, payload: memoryview) -> None:
        """RFC 9113, 6.7: 8 bytes on stream 0; answered unless it is an answer."""
        if len(payload) != 8:
            raise ProtocolError("a PING of other than 8 bytes", ErrorCode.FRAME_SIZE_ERROR)
        if stream != 0:
            raise ProtocolError("PING on a stream")
        if not flags & ACK:
            self._flood("PING")
            self._write(frame(Frame.PING, ACK, 0, bytes(payload)))
        elif self.announcing and payload == _GOAWAY_PING:
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
        elif _U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream:
            # 5.3.1: a stream cannot depend on itself; a stream error, but never a
            # RST_STREAM on an idle stream (6.4).
            if stream > self._ids.last:
                raise ProtocolError(f"idle stream {stream} depends on itself")
            self._stream_error(stream, ErrorCode.PROTOCOL_ERROR)

    def _stream_error(self, stream: int, code: ErrorCode) -> None:
        """RFC 9113, 5.4.2: a RST_STREAM with ``code``; the stream's call, if any, ends
        and gives back what it holds. Counted as a flood frame: a client that provokes
        resets without end ("MadeYouReset", CVE-2025-8671) is sent GOAWAY."""
        self._flood("provoked RST_STREAM")
        self._reset(stream, code)
        call = self._forget(stream)
        if call is not None:
            call.reset()
            self._maybe_close()

    def _reset(self, stream: int, code: ErrorCode) -> None:
        """A RST_STREAM from this side; the stream is remembered as reset here, so what the
        client sent before it heard is ignored (RFC 9113, 5.1)."""
        self._write(rst_stream(stream, code))
        self._ids.reset_here(stream)

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
                if stop - start >= 5 and _U32.unpack_from(payload, start)[0] & 0x7FFFFFFF == stream:
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
        call = self._new_stream(self, stream)
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
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
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

    # ---- what calls use -------------------------------------------------------------

    def acknowledge(self, stream: int, nbytes: int) -> None:
        """The call took ``nbytes`` of its stream: the peer may send that much more on
        it, and on the connection."""
        self._windows.acknowledge(stream, nbytes)

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

    def finished(self, stream: int) -> None:
        """The stream is done with on this side."""
        if self._forget(stream) is not None:
            self._maybe_close()

    def go_away(self) -> None:
        """Shutdown, in two phases (RFC 9113, 6.8): a GOAWAY with the last stream 2^31-1
        and a PING; after its answer (or ``GOAWAY_ROUND_TRIP``), a GOAWAY naming the last
        stream taken. Streams opened meanwhile are served; the connection closes once its
        calls end."""
        if self.going_away or self.announcing or self.transport is None:
            self._maybe_close()
            return
        if not self._settled:  # not open yet: nothing to announce
            self._abort(ErrorCode.NO_ERROR, "shutting down")
            return
        self._write(goaway(MAX_WINDOW, ErrorCode.NO_ERROR))
        self._write(frame(Frame.PING, 0, 0, _GOAWAY_PING))
        self._timer = self._loop.call_later(GOAWAY_ROUND_TRIP, self._last_goaway)

    @property
    def opened(self) -> int:
        """The highest stream id the client opened: it grows with every call, so the
        keepalive sees calls that began and ended between two of its looks."""
        return self._ids.last

    def ping(self) -> None:
        """A keepalive PING (its ACK, like any frame, counts as the client's answer)."""
        self._write(frame(Frame.PING, 0, 0, _KEEPALIVE_PING))

    @property
    def announcing(self) -> bool:
        """A shutdown's first GOAWAY went out and its second not yet."""
        return self._settled and self._timer is not None and not self.going_away

    def _last_goaway(self) -> None:
        """The second GOAWAY of a shutdown: no stream past the last taken is served."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.going_away and not self.lost:
            self.going_away = True
            self._write(goaway(self._ids.last, ErrorCode.NO_ERROR))
        self._maybe_close()

    def close(self) -> None:
        if self.transport is not None:
            self._out.close()

    # ---- frames out -----------------------------------------------------------------

    def _maybe_close(self) -> None:
        if self.going_away and not self.streams:
            self.close()

    def _write(self, data: bytes) -> None:
        self._out.write(data)
