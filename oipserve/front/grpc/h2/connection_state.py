"""What one HTTP/2 connection holds, and how it and its streams end: the base of
``h2.connection.Connection``.

``Connection`` is one class built in layers, one job a module, each a subclass of the one
below it (as ``front.grpc.call``'s are): ``connection`` (the socket: asyncio's hooks,
when it is read) over ``connection_receive`` (frames in: streams opened and fed, the
receive windows, the peer's frames answered) over ``connection_send`` (frames out: header
blocks and DATA under the peer's windows) over this module: the connection's state (all
set in ``__init__``), its limits, and every way a stream or the connection ends: a
RST_STREAM from this side, a stream error, the flood budget, a GOAWAY (a connection
error's, or a shutdown's two), the close.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Final, Protocol

from mypy_extensions import mypyc_attr

from oipserve.front.grpc.h2.frames import (
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    MAX_WINDOW,
    ErrorCode,
    Frame,
    ProtocolError,
    frame,
    goaway,
    rst_stream,
)
from oipserve.front.grpc.h2.headers import HeaderDecoder, Headers
from oipserve.front.grpc.h2.receive_windows import CONNECTION_WINDOW, ReceiveWindows
from oipserve.front.grpc.h2.stream_ids import StreamIds
from oipserve.runtime.abandoned_work import ABANDONED_WORK, AbandonedWork
from oipserve.runtime.http_io import CorkedTransport
from oipserve.runtime.stream_budget import StreamBudget
from oipserve.runtime.worker_share import WORKER_SHARE, WorkerShare

#: Calls one connection may run at once (clients queue the rest).
MAX_STREAMS: Final = 1024
#: The largest frame clients may send; DATA frames are streamed, not buffered whole.
MAX_FRAME: Final = 256 * 1024
#: Frames that cost us work and carry no request (RST_STREAM, PING, SETTINGS, empty
#: DATA or HEADERS) a client may send per ``FLOOD_INTERVAL`` before a GOAWAY ENHANCE_YOUR_CALM
#: (RFC 9113, 10.5; rapid reset, CVE-2023-44487): nghttp2's stream-reset budget is a
#: burst of 1,000 refilled at 33/s, about this.
FLOOD_BUDGET: Final = 1000
FLOOD_INTERVAL: Final = 10.0
#: DATA frames (those that do not end a stream) judged together, and the fewest bytes
#: they must carry on average: a request message is its 5-byte prefix and tens of bytes
#: at least, so a client whose frames carry fewer is dribbling (a frame costs the front
#: its work whatever it carries, ~1,000 times a 16 KiB frame's a byte), not sending
#: requests. Counted by bytes a frame, not by messages: many tiny messages in few frames
#: are a client writing fast (``call_receive`` keeps them unparsed, bounded by the window).
DATA_SAMPLE: Final = 1024
MIN_DATA_BYTES: Final = 16
#: Seconds a client has to send the preface and its SETTINGS (``--header-timeout``'s
#: default, as an HTTP/1.1 request head has).
PREFACE_TIMEOUT: Final = 10.0

#: Seconds a shutdown's first GOAWAY (last stream 2^31-1) waits for the answer to the
#: PING sent with it before the second names the real last stream (RFC 9113, 6.8): calls
#: a client sent before it heard the first are still taken. (Not ``Final``, which compiled
#: code would inline: read once a shutdown, and shortened by a test.)
GOAWAY_ROUND_TRIP = 1.0
#: The payload of that PING, to know its answer.
GOAWAY_PING: Final[bytes] = b"goaway\x00\x00"


class Stream(Protocol):
    """What the connection drives: one call on one stream (``call.Call``)."""

    #: Bytes the peer may still send on it before the stream's window is given back.
    send_window: int

    def headers_received(self, headers: Headers, end_stream: bool) -> None: ...

    def data_received(self, data: memoryview) -> None: ...

    def end_received(self) -> None: ...

    def reset(self) -> None:
        """The stream ended without an answer (RST_STREAM, or the connection went)."""

    def give_up(self, message: str) -> None:
        """The server's stop ran out of time (``--shutdown-timeout``): answer ``message``
        as unavailable if nothing was sent yet (else end the stream), and stop its work."""


class Linger(Protocol):
    """Where a connection's socket goes to close without losing what was last written
    (``front.grpc.linger.Lingering``): each method False, nothing done, where it does not
    take it."""

    def take(self, transport: asyncio.Transport) -> bool:
        """After a connection error's GOAWAY (the peer's frames no longer read)."""

    def take_gracefully(self, transport: asyncio.Transport) -> bool:
        """After the connection ended well (its last GOAWAY sent, its calls answered)."""


class _HandedOver(asyncio.Transport):
    """Where a connection writes once its socket was handed to the linger: nowhere."""

    def is_closing(self) -> bool:
        return True

    def close(self) -> None:
        pass


_HANDED_OVER: Final = _HandedOver()


# NOTE: compiled (mypyc); each layer allows the interpreted subclass that
#   ``front.http.h2_connection.Http2Connection`` is of the top one.
@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectionState(asyncio.Protocol):
    """A connection's state and its ends (the layers above read and write its frames)."""

    def __init__(
        self,
        preface_timeout: float,
        linger: Linger | None,
        one_client: bool,
    ) -> None:
        #: Takes the socket at the end, to close it without losing what was last written
        #: (``front.grpc.linger``); None: it is closed at once.
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
        #: DATA frames not ending a stream, and their bytes, since the last judgement
        #: (``_judge_data_frames``).
        self._data_frames = 0
        self._data_bytes = 0
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
        #: That close is due next turn (``_maybe_close``).
        self._ending = False
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
        #: This client's requests at the workers, held to a share of a worker's queue
        #: (``runtime.worker_share``; None: a connection of many clients).
        #: Its bytes too: what its whole requests hold of the receive window (so that
        #: requests held at a stopped worker never spend the window its other calls need).
        self.worker_share = (
            WorkerShare(self._loop, self._windows.kept_bytes, CONNECTION_WINDOW)
            if one_client
            else None
        )
        #: What the calls' tasks run in (``run``): where ``infer_on`` finds ``abandoned``,
        #: and the requests sent alone ``worker_share``.
        self._context = contextvars.copy_context()
        self._context.run(ABANDONED_WORK.set, self.abandoned if one_client else None)
        self._context.run(WORKER_SHARE.set, self.worker_share)
        #: What this client's ModelStreamInfer streams may hold at once, together
        #: (``runtime.stream_budget``; None: a connection of many clients).
        self.stream_requests = StreamBudget() if one_client else None
        #: The log has said this connection was held (``_hold_reading``: said once).
        self._held_before = False
        #: Called once a shutdown's first GOAWAY has reached the client (``go_away``).
        self._told: Callable[[], None] | None = None

    # Defined by the top layer (``connection.Connection``), which owns the socket and
    #   knows who made it: declared here for ``abandoned``, which stops and resumes the
    #   reading, and for ``connection_receive``, which opens streams. (Not under
    #   TYPE_CHECKING: mypyc compiles no statement but a definition in a class body.)

    def _open_stream(self, stream: int) -> Stream:
        raise NotImplementedError("connection.Connection")

    def _hold_reading(self) -> None:
        raise NotImplementedError("connection.Connection")

    def _resume_reading(self) -> None:
        raise NotImplementedError("connection.Connection")

    # ---- how streams end --------------------------------------------------------------

    def _forget(self, stream: int) -> Stream | None:
        """Close ``stream`` on this side: what its call had not taken goes back to the
        connection's window."""
        call = self.streams.pop(stream, None)
        if call is not None:
            self._windows.forget(stream)
            if self._declared:
                self._declared.pop(stream, None)
        return call

    def finished(self, stream: int) -> None:
        """The stream is done with on this side."""
        if self._forget(stream) is not None:
            self._maybe_close()

    def _reset(self, stream: int, code: ErrorCode) -> None:
        """A RST_STREAM from this side; the stream is remembered as reset here, so what the
        client sent before it heard is ignored (RFC 9113, 5.1)."""
        self._write(rst_stream(stream, code))
        self._ids.reset_here(stream)

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

    def _judge_data_frames(self) -> None:
        """``DATA_SAMPLE`` DATA frames came: they must carry ``MIN_DATA_BYTES`` each on
        average, or the connection is a flood of tiny frames (RFC 9113, 10.5): GOAWAY
        ENHANCE_YOUR_CALM. Only empty frames were counted (the flood budget): 1-byte
        frames cost the front a frame's work for each byte of a stream's window, its
        refills included."""
        frames, nbytes = self._data_frames, self._data_bytes
        self._data_frames = self._data_bytes = 0
        if nbytes < frames * MIN_DATA_BYTES:
            raise ProtocolError(
                f"{frames} DATA frames of {nbytes} bytes in all", ErrorCode.ENHANCE_YOUR_CALM
            )

    # ---- how the connection ends --------------------------------------------------------

    def _preface_late(self) -> None:
        """A client that has not opened properly in time holds a socket for nothing."""
        self._timer = None
        if not self._settled and not self.lost and self.transport is not None:
            self._abort(ErrorCode.PROTOCOL_ERROR, "no connection preface in time")

    def _abort(self, code: ErrorCode, message: str) -> None:
        """A connection error: its GOAWAY, then the socket closed.

        Closed with the peer's frames unread (a flood's always are), the socket is reset,
        and the reset drops the GOAWAY wherever the peer has not read it yet. So where the
        ``linger`` takes the socket (its FIN follows the GOAWAY, it reads nothing, it is
        closed shortly), this connection lets go of it and ends now, as at a lost
        connection: its streams are reset and its slot freed (``closed``).
        """
        self._write(goaway(self._ids.last, code, message))
        self._hand_over(graceful=False)

    def _hand_over(self, graceful: bool) -> None:
        """Close, the socket handed to the linger where it takes it."""
        transport = self.transport
        if self._linger is None or transport is None or self.lost:
            self.close()
            return
        self._out.flush()
        linger = self._linger
        if not (linger.take_gracefully(transport) if graceful else linger.take(transport)):
            self.close()
            return
        # What is still written goes nowhere (the transport would raise after its
        # write_eof); the end comes next turn, as a close's does (what is left of the
        # frames being read may still open streams: they are reset with the others).
        self._out = CorkedTransport(_HANDED_OVER, self._loop)
        self.transport = None
        self._loop.call_soon(self.connection_lost, None)

    def go_away(self, told: Callable[[], None] | None = None) -> None:
        """Shutdown, in two phases (RFC 9113, 6.8): a GOAWAY with the last stream 2^31-1
        and a PING; after its answer (or ``GOAWAY_ROUND_TRIP``), a GOAWAY naming the last
        stream taken. Streams opened meanwhile are served; the connection closes once its
        calls end. ``told`` is called once the client has had the first GOAWAY (the
        second went out; at once where none goes: one went already, or the client's):
        what it sends later on its open streams it sent knowing."""
        if told is not None:
            self._told = told
        if self.going_away or self.announcing or self.transport is None:
            if not self.announcing:
                self._tell()
            self._maybe_close()
            return
        if not self._settled:  # not open yet: nothing to announce
            self._abort(ErrorCode.NO_ERROR, "shutting down")
            return
        self._write(goaway(MAX_WINDOW, ErrorCode.NO_ERROR))
        self._write(frame(Frame.PING, 0, 0, GOAWAY_PING))
        self._timer = self._loop.call_later(GOAWAY_ROUND_TRIP, self._last_goaway)

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
        self._tell()
        self._maybe_close()

    def _tell(self) -> None:
        """The client has had the first GOAWAY: ``go_away``'s ``told``, once."""
        told, self._told = self._told, None
        if told is not None:
            told()

    def _maybe_close(self) -> None:
        if self.going_away and not self.streams and not self._ending:
            # Next turn: what the last stream's call still writes in this one goes first
            # (the RST_STREAM NO_ERROR after a stream's trailers, which gRPC's C core
            # waits for to end a stream whose client still sends: it was dropped, and the
            # stream's status lost to "Stream removed", found by fuzzing).
            self._ending = True
            self._loop.call_soon(self._end_if_idle)

    def _end_if_idle(self) -> None:
        self._ending = False
        if self.going_away and not self.streams:
            self.end()

    def end(self) -> None:
        """Close once all written is sent and taken: the socket lingers, reading what
        the peer still sends (``front.grpc.linger``: a close with its frames unread would
        reset the connection and drop what the peer had not taken yet)."""
        if self.transport is not None:
            self._hand_over(graceful=True)

    def close(self) -> None:
        if self.transport is not None:
            self._out.close()

    def _write(self, data: bytes) -> None:
        self._out.write(data)
