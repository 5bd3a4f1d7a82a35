"""A PROTOTYPE, for measurement only (issue 37, item 1): python-hyper's ``h2`` under the
interface of ``oipserve.front.grpc.h2.connection.Connection``.

``H2LibConnection`` is what the gRPC listener would construct if the front switched its
HTTP/2 base to ``h2`` (sans-IO, ``h2.connection.H2Connection`` with ``client_side=False``,
``header_encoding=None`` and h2's default validation of inbound and outbound headers).
It drives the same ``call.Call`` objects the same way our ``Connection`` does, per call:

- headers: h2 decodes the block (its own HPACK decoder, no cache) and validates it;
  the names and values are decoded to ``str`` for ``header_rules.read_call_head``.
- data: each ``DataReceived`` goes to the call; a call's ``acknowledge`` hands the bytes to
  ``acknowledge_received_data`` (h2's window managers decide when a WINDOW_UPDATE goes
  out); what a call never acknowledged (a tiny call, its 5-byte prefix) goes back to the
  connection's window when the stream is finished, as ours does.
- sending: the call's pre-encoded header blocks (``frames.RESPONSE_HEADERS``, trailers)
  are decoded once per distinct block (a dict lookup after the first) and given to h2's
  ``send_headers``, which encodes them with its own HPACK encoder: what ``call.py`` would
  do if it handed h2 header lists. DATA goes through ``send_data`` within
  ``local_flow_control_window`` and the peer's frame size; senders wait for
  ``WindowUpdated`` / ``RemoteSettingsChanged`` as ours wait for WINDOW_UPDATE.
- writes: everything h2 queued in one loop turn leaves in one ``transport.write``
  (``data_to_send`` once per turn), as ours corks its writes.
- the same settings and windows as ours (1,024 streams, 4 MiB stream window, 16 MiB
  connection window, 256 KiB frames, 64 KiB header lists, no push), a preface timeout,
  a flood counter on resets / pings / settings, and the two-phase GOAWAY on shutdown
  (written as raw frames: h2's ``close_connection`` moves its state machine to CLOSED and
  would refuse the answers of calls still running).

Not production code: nothing in ``oipserve`` imports it. ``benchmarks/h2_base/serve.py``
runs oipserve with it; ``benchmarks/h2_base/compare.py`` measures both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from hpack import Decoder
from hyperframe.frame import GoAwayFrame

from oipserve.front.grpc.h2.connection_state import (
    FLOOD_BUDGET,
    FLOOD_INTERVAL,
    GOAWAY_ROUND_TRIP,
    MAX_FRAME,
    MAX_STREAMS,
    PREFACE_TIMEOUT,
    Stream,
)
from oipserve.front.grpc.h2.frames import DEFAULT_WINDOW, MAX_WINDOW, ErrorCode
from oipserve.front.grpc.h2.headers import MAX_HEADER_LIST
from oipserve.front.grpc.h2.receive_windows import CONNECTION_WINDOW, STREAM_WINDOW

log = logging.getLogger("oipserve.grpc")

_SEND_SLICE = 1024 * 1024
_GOAWAY_PING = b"goaway\x00\x00"
_SETTINGS = {
    h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
    h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME,
    h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
    h2.settings.SettingCodes.ENABLE_PUSH: 0,
}
_CONFIG = h2.config.H2Configuration(client_side=False, header_encoding=None)
#: The same, without h2's checks and normalization of the headers we send: ours are
#: constants (and failure messages percent-encoded), so a switch could turn them off.
_CONFIG_TUNED = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)

#: Our pre-encoded header blocks (never-indexed literals: no decoder state) -> the header
#: lists h2 is given; a handful of distinct blocks per process (failures' messages aside).
_BLOCKS: dict[bytes, list[tuple[bytes, bytes]]] = {}
_BLOCK_DECODER = Decoder()


def _header_list(block: bytes) -> list[tuple[bytes, bytes]]:
    headers = _BLOCKS.get(block)
    if headers is None:
        headers = [(bytes(n), bytes(v)) for n, v in _BLOCK_DECODER.decode(block, raw=True)]
        if len(_BLOCKS) < 256:
            _BLOCKS[block] = headers
    return headers


class H2LibConnection(asyncio.Protocol):
    """The HTTP/2 server side of one client connection, on ``h2.connection.H2Connection``."""

    config = _CONFIG

    def __init__(
        self,
        new_stream: Callable[[Any, int], Stream],
        closed: Callable[[Any], None],
        preface_timeout: float = PREFACE_TIMEOUT,
    ) -> None:
        self._new_stream = new_stream
        self._closed = closed
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        #: Flow-controlled bytes received per open stream not yet acknowledged to h2.
        self._unacked: dict[int, int] = {}
        self._h2 = h2.connection.H2Connection(config=self.config)
        self._h2.local_settings = h2.settings.Settings(client=False, initial_values=_SETTINGS)
        self._h2.max_inbound_frame_size = MAX_FRAME
        self._settled = False
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(
            preface_timeout, self._preface_late
        )
        self._flood_count = 0
        self._flood_since = 0.0
        self._pumping = False
        self._can_send = asyncio.Event()
        self._can_send.set()
        self._paused = False
        self.going_away = False
        self.lost = False
        #: Reads so far (``front.grpc.keepalive``'s sign of life), as ours counts them.
        self.reads = 0

    # ---- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - DEFAULT_WINDOW)
        self._flood_since = self._loop.time()
        self._dirty()

    def _preface_late(self) -> None:
        self._timer = None
        if not self._settled and not self.lost and self.transport is not None:
            self._abort(ErrorCode.PROTOCOL_ERROR)

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.debug("gRPC connection closed: %s", exc)
            self._dirty()  # h2 queued its GOAWAY
            self._pump()
            self.close()
            return
        try:
            for event in events:
                self._event(event)
        except _Flood:
            self._abort(ErrorCode.ENHANCE_YOUR_CALM)
            return
        except Exception:
            log.exception("unexpected error on a gRPC connection; it is closed")
            self._abort(ErrorCode.INTERNAL_ERROR)
            return
        self._dirty()

    def _abort(self, code: ErrorCode) -> None:
        self._raw_goaway(self._h2.highest_inbound_stream_id, code)
        self.close()

    def pause_writing(self) -> None:
        self._paused = True
        self._can_send.clear()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        self._can_send.set()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._can_send.set()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.reset()
        self._closed(self)

    # ---- events in ------------------------------------------------------------------

    def _event(self, event: h2.events.Event) -> None:
        # PERF: the per-call events first (one type check each).
        kind = type(event)
        if kind is h2.events.DataReceived:
            self._data(cast(h2.events.DataReceived, event))
        elif kind is h2.events.RequestReceived:
            self._request(cast(h2.events.RequestReceived, event))
        elif kind is h2.events.StreamEnded:
            call = self.streams.get(cast(h2.events.StreamEnded, event).stream_id or 0)
            if call is not None:
                call.end_received()
        elif kind is h2.events.WindowUpdated:
            self._can_send.set()
        elif kind is h2.events.StreamReset:
            self._reset(cast(h2.events.StreamReset, event))
        else:
            self._other(event)

    def _other(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self._flood()
            if not self._settled:
                self._settled = True
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            self._can_send.set()
        elif isinstance(event, h2.events.PingReceived):
            self._flood()
        elif isinstance(event, h2.events.PingAckReceived):
            if self.announcing and event.ping_data == _GOAWAY_PING:
                self._last_goaway()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.going_away = True
            self._maybe_close()
        # TrailersReceived: its StreamEnded follows; the rest needs nothing.

    def _flood(self) -> None:
        self._flood_count += 1
        if self._flood_count <= FLOOD_BUDGET:
            return
        now = self._loop.time()
        if now - self._flood_since < FLOOD_INTERVAL:
            raise _Flood
        self._flood_since = now
        self._flood_count = 1

    def _request(self, event: h2.events.RequestReceived) -> None:
        stream = event.stream_id or 0
        if self.going_away or len(self.streams) >= MAX_STREAMS:
            self._h2.reset_stream(stream, ErrorCode.REFUSED_STREAM)
            return
        try:
            headers = tuple((n.decode(), v.decode()) for n, v in event.headers or ())
        except UnicodeDecodeError:
            self._h2.reset_stream(stream, ErrorCode.PROTOCOL_ERROR)
            return
        call = self._new_stream(self, stream)
        self.streams[stream] = call
        self._unacked[stream] = 0
        # NOTE: END_STREAM on the HEADERS comes as the StreamEnded event that follows.
        call.headers_received(headers, False)

    def _data(self, event: h2.events.DataReceived) -> None:
        stream = event.stream_id or 0
        size = event.flow_controlled_length or 0
        data = event.data or b""
        padding = size - len(data)
        call = self.streams.get(stream)
        if call is None:  # a stream closed on this side: only the connection's window
            if size:
                self._h2.acknowledge_received_data(size, stream)
            return
        if padding:
            self._h2.acknowledge_received_data(padding, stream)
        self._unacked[stream] += len(data)
        if data:
            call.data_received(memoryview(data))

    def _reset(self, event: h2.events.StreamReset) -> None:
        stream = event.stream_id or 0
        call = self.streams.pop(stream, None)
        if call is not None:
            self._flood()
            self._give_back(stream)
            call.reset()
            self._maybe_close()

    # ---- what calls use -------------------------------------------------------------

    def acknowledge(self, stream: int, nbytes: int) -> None:
        left = self._unacked.get(stream)
        if nbytes and left is not None:
            self._unacked[stream] = left - nbytes
            self._h2.acknowledge_received_data(nbytes, stream)
            self._dirty()

    def _give_back(self, stream: int) -> None:
        """What the stream's call did not acknowledge goes back to the connection."""
        left = self._unacked.pop(stream, 0)
        if left > 0:
            self._h2.acknowledge_received_data(left, stream)

    def send_headers(self, stream: int, block: bytes, end_stream: bool = False) -> None:
        try:
            self._h2.send_headers(stream, _header_list(block), end_stream=end_stream)
        except h2.exceptions.H2Error:
            pass  # the stream or the connection is gone; the call is told elsewhere
        self._dirty()
        if end_stream:
            self.finished(stream)

    def send_small(self, call: Stream, stream: int, data: bytes) -> bool:
        h2conn = self._h2
        try:
            room = min(h2conn.local_flow_control_window(stream), h2conn.max_outbound_frame_size)
            if len(data) > room:
                return False
            h2conn.send_data(stream, data)
        except h2.exceptions.H2Error:
            return False
        self._dirty()
        return True

    async def send_data(self, call: Stream, stream: int, data: memoryview) -> None:
        h2conn = self._h2
        pos = 0
        sent = 0
        while pos < len(data):
            if self.lost or self.streams.get(stream) is not call:
                raise ConnectionError("the stream was closed")
            try:
                window = h2conn.local_flow_control_window(stream)
            except h2.exceptions.H2Error:
                raise ConnectionError("the stream was closed") from None
            room = min(window, h2conn.max_outbound_frame_size, len(data) - pos)
            if room <= 0 or self._paused:
                self._can_send.clear()
                self._pump()
                await self._can_send.wait()
                continue
            try:
                h2conn.send_data(stream, data[pos : pos + room])
            except h2.exceptions.H2Error:
                raise ConnectionError("the stream was closed") from None
            self._dirty()
            pos += room
            sent += room
            if sent >= _SEND_SLICE:
                sent = 0
                self._pump()
                await asyncio.sleep(0)

    async def sent(self) -> None:
        self._pump()
        transport = self.transport
        while transport is not None and not transport.is_closing():
            if not transport.get_write_buffer_size():
                return
            await asyncio.sleep(0.001)

    def reset_stream(self, stream: int, code: ErrorCode) -> None:
        try:
            self._h2.reset_stream(stream, code)
        except h2.exceptions.H2Error:
            pass
        self._dirty()
        self.finished(stream)

    def finished(self, stream: int) -> None:
        if self.streams.pop(stream, None) is not None:
            self._give_back(stream)
            self._maybe_close()

    def go_away(self) -> None:
        if self.going_away or self.announcing or self.transport is None:
            self._maybe_close()
            return
        if not self._settled:
            self._abort(ErrorCode.NO_ERROR)
            return
        self._raw_goaway(MAX_WINDOW, ErrorCode.NO_ERROR)
        self._h2.ping(_GOAWAY_PING)
        self._dirty()
        self._timer = self._loop.call_later(GOAWAY_ROUND_TRIP, self._last_goaway)

    @property
    def opened(self) -> int:
        """The highest stream id the client opened (``front.grpc.keepalive``)."""
        return self._h2.highest_inbound_stream_id

    def ping(self) -> None:
        """A keepalive PING."""
        self._h2.ping(b"keepaliv")
        self._dirty()

    @property
    def announcing(self) -> bool:
        return self._settled and self._timer is not None and not self.going_away

    def _last_goaway(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.going_away and not self.lost:
            self.going_away = True
            self._raw_goaway(self._h2.highest_inbound_stream_id, ErrorCode.NO_ERROR)
        self._maybe_close()

    def close(self) -> None:
        if self.transport is not None:
            self._pump()
            self.transport.close()

    # ---- frames out -----------------------------------------------------------------

    def _raw_goaway(self, last_stream: int, code: ErrorCode) -> None:
        """A GOAWAY past h2's state machine (see the module's docstring)."""
        goaway = GoAwayFrame(0)
        goaway.last_stream_id = last_stream
        goaway.error_code = code
        self._pump()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(goaway.serialize())

    def _maybe_close(self) -> None:
        if self.going_away and not self.streams:
            self.close()

    def _dirty(self) -> None:
        """h2 has queued frames: they leave at the end of this loop turn, in one write."""
        if not self._pumping:
            self._pumping = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._pumping = False
        data = self._h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


class H2LibTunedConnection(H2LibConnection):
    """``H2LibConnection`` without h2's checks of the headers we send (``_CONFIG_TUNED``);
    inbound headers are still validated as h2 does by default."""

    config = _CONFIG_TUNED


def skip_frame_reprs() -> None:
    """h2 builds ``repr(frame)`` for every frame it receives, for a trace log that is off
    by default (``H2Connection._receive_frame``): hyperframe hex-encodes a DATA frame's
    whole payload (256 KiB) to keep 20 characters of it. A switch would patch it out as
    this does (for the whole process: the ``h2best`` shape of ``compare.py`` only)."""
    import hyperframe.frame

    hyperframe.frame._raw_data_repr = lambda data: "<data>"


class _Flood(Exception):
    """Too many frames that carry no request (RFC 9113, 10.5)."""
