"""The gRPC port's HTTP/2 refuses abuse and broken frames as RFC 9113 says (issue 37).

A connection driven with raw frames through the fake transport of test_grpc_h2.py:
CONTINUATION floods (rows 1), SETTINGS checks (3), per-frame checks (9), flood budgets
(4) and the preface timeout (5). A connection error is a GOAWAY with the code, then the
transport closed; a stream error is a RST_STREAM with it.
"""

from __future__ import annotations

import asyncio
import struct

import hpack
import pytest

from oipserve.config.settings import Settings
from oipserve.front.grpc.h2 import connection as h2
from oipserve.front.grpc.h2 import connection_state
from oipserve.front.grpc.h2 import receive_windows as windows
from oipserve.front.grpc.h2.connection import Connection
from oipserve.front.grpc.h2.connection_receive import MAX_CONTINUATIONS
from oipserve.front.grpc.h2.frames import (
    ACK,
    END_HEADERS,
    END_STREAM,
    PREFACE,
    ErrorCode,
    Frame,
    Setting,
    frame,
    rst_stream,
    settings_frame,
    window_update,
)
from oipserve.front.grpc.h2.headers import HeaderDecoder
from tests.support.grpc_peer import FakeService, FakeTransport, GrpcPeer, Peer

OPEN = PREFACE + settings_frame({})


def _goaway(peer: Peer) -> ErrorCode | None:
    """The code of the first GOAWAY written (None if none), once the transport closed."""
    for kind, _flags, _stream, payload in peer.transport.frames():
        if kind == Frame.GOAWAY:
            assert peer.transport.closed
            return ErrorCode(struct.unpack(">II", payload[:8])[1])
    return None


def _resets(frames: list[tuple[int, int, int, bytes]]) -> dict[int, int]:
    return {s: struct.unpack(">I", p)[0] for k, _f, s, p in frames if k == Frame.RST_STREAM}


def _opened(peer: Peer) -> Peer:
    peer.send(OPEN)
    peer.transport.frames()
    return peer


# ---- row 1: CONTINUATION -----------------------------------------------------------


async def test_a_continuation_flood_is_refused_after_the_cap_in_linear_work() -> None:
    """40,000 empty CONTINUATION frames (CVE-2024-27316): the connection ends at the cap,
    having looked at no more frames than that, and never summed the block per frame."""
    calls = 0

    class Counted(Connection):
        def _header_frame(self, kind: int, flags: int, stream: int, payload: memoryview) -> None:
            nonlocal calls
            calls += 1
            super()._header_frame(kind, flags, stream, payload)

    peer = _opened(Peer(Counted))
    block = peer.encoder.encode([(":method", "POST"), (":path", "/s/M")])
    wire = frame(Frame.HEADERS, 0, 1, block) + frame(Frame.CONTINUATION, 0, 1) * 40_000
    peer.send(wire)
    assert _goaway(peer) == ErrorCode.ENHANCE_YOUR_CALM
    assert calls == 1 + MAX_CONTINUATIONS + 1
    assert 1 not in peer.streams


async def test_a_header_block_within_the_cap_is_read() -> None:
    peer = _opened(Peer())
    block = peer.encoder.encode([(":method", "POST"), (":path", "/s/M")])
    wire = frame(Frame.HEADERS, 0, 1, block[:1])
    wire += b"".join(frame(Frame.CONTINUATION, 0, 1) for _ in range(MAX_CONTINUATIONS - 1))
    peer.send(wire + frame(Frame.CONTINUATION, END_HEADERS, 1, block[1:]))
    assert peer.streams[1].headers == [(":method", "POST"), (":path", "/s/M")]
    assert _goaway(peer) is None


# ---- row 3: SETTINGS ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (frame(Frame.SETTINGS, 0, 1), ErrorCode.PROTOCOL_ERROR),
        (frame(Frame.SETTINGS, ACK, 0, b"\0" * 6), ErrorCode.FRAME_SIZE_ERROR),
        (frame(Frame.SETTINGS, 0, 0, b"\0" * 5), ErrorCode.FRAME_SIZE_ERROR),
        (settings_frame({Setting.ENABLE_PUSH: 2}), ErrorCode.PROTOCOL_ERROR),
        (settings_frame({Setting.INITIAL_WINDOW_SIZE: 2**31}), ErrorCode.FLOW_CONTROL_ERROR),
        (settings_frame({Setting.MAX_FRAME_SIZE: 16_383}), ErrorCode.PROTOCOL_ERROR),
        (settings_frame({Setting.MAX_FRAME_SIZE: 2**24}), ErrorCode.PROTOCOL_ERROR),
        (frame(Frame.PING, 0, 0, b"12345678"), ErrorCode.PROTOCOL_ERROR),  # not SETTINGS first
        (frame(Frame.SETTINGS, 0, 0, b"\0\x03\0\0\0\x01" * 1000), ErrorCode.ENHANCE_YOUR_CALM),
    ],
    ids=[
        "on-a-stream",
        "ack-with-payload",
        "odd-length",
        "enable-push-2",
        "window-2^31",
        "frame-too-small",
        "frame-too-large",
        "first-not-settings",
        "too-many-entries",
    ],
)
async def test_a_broken_first_settings_ends_the_connection(wire: bytes, code: ErrorCode) -> None:
    peer = Peer()
    peer.transport.frames()
    peer.send(PREFACE + wire)
    assert _goaway(peer) == code


async def test_a_settings_frame_walks_the_streams_once_and_keeps_windows_in_range() -> None:
    peer = _opened(Peer())
    peer.send(peer.headers(1) + peer.headers(3))
    entries = b"".join(struct.pack(">HI", Setting.INITIAL_WINDOW_SIZE, n) for n in range(20))
    peer.send(frame(Frame.SETTINGS, 0, 0, entries))
    assert peer.streams[1].send_window == peer.streams[3].send_window == 19
    assert _goaway(peer) is None
    peer.send(window_update(1, 2**31 - 1 - 19))  # stream 1's window at the maximum
    peer.send(settings_frame({Setting.INITIAL_WINDOW_SIZE: 20}))  # now 1 past it
    assert _goaway(peer) == ErrorCode.FLOW_CONTROL_ERROR


# ---- row 9: frame checks -----------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (frame(Frame.RST_STREAM, 0, 1, b"\0\0\0"), ErrorCode.FRAME_SIZE_ERROR),
        (frame(Frame.RST_STREAM, 0, 0, b"\0\0\0\x08"), ErrorCode.PROTOCOL_ERROR),
        (frame(Frame.RST_STREAM, 0, 5, b"\0\0\0\x08"), ErrorCode.PROTOCOL_ERROR),  # idle
        (frame(Frame.PING, 0, 1, b"12345678"), ErrorCode.PROTOCOL_ERROR),
        (frame(Frame.GOAWAY, 0, 1, b"\0" * 8), ErrorCode.PROTOCOL_ERROR),
        (frame(Frame.GOAWAY, 0, 0, b"\0" * 4), ErrorCode.FRAME_SIZE_ERROR),
        (window_update(5, 1), ErrorCode.PROTOCOL_ERROR),  # idle
        (window_update(0, 2**31 - 1), ErrorCode.FLOW_CONTROL_ERROR),
        (frame(Frame.PRIORITY, 0, 0, b"\0" * 5), ErrorCode.PROTOCOL_ERROR),
        (frame(Frame.PRIORITY, 0, 9, b"\0" * 4), ErrorCode.FRAME_SIZE_ERROR),  # idle
    ],
    ids=[
        "rst-length",
        "rst-stream-0",
        "rst-idle",
        "ping-on-stream",
        "goaway-on-stream",
        "goaway-short",
        "window-idle",
        "window-overflow",
        "priority-stream-0",
        "priority-idle-length",
    ],
)
async def test_a_broken_frame_ends_the_connection(wire: bytes, code: ErrorCode) -> None:
    peer = _opened(Peer())
    peer.send(peer.headers(1))
    peer.send(wire)
    assert _goaway(peer) == code


async def test_a_zero_window_update_on_a_stream_resets_it_and_ends_its_call() -> None:
    """A stream error (PROTOCOL_ERROR), and the call is told so it gives back what it
    holds ("MadeYouReset", CVE-2025-8671)."""
    peer = _opened(Peer())
    peer.send(peer.headers(1))
    peer.send(window_update(1, 0))
    assert _resets(await peer.written()) == {1: ErrorCode.PROTOCOL_ERROR}
    assert peer.streams[1].was_reset and 1 not in peer.connection.streams
    assert not peer.transport.closed


async def test_a_short_priority_is_a_stream_error_and_one_on_an_idle_stream_is_ignored() -> None:
    peer = _opened(Peer())
    peer.send(peer.headers(1))
    peer.send(frame(Frame.PRIORITY, 0, 1, b"\0" * 4) + frame(Frame.PRIORITY, 0, 9, b"\0" * 5))
    assert _resets(await peer.written()) == {1: ErrorCode.FRAME_SIZE_ERROR}
    assert peer.streams[1].was_reset and not peer.transport.closed


async def test_headers_on_a_lower_stream_id_are_answered() -> None:
    """Never dropped in silence (the client waited forever), and as RFC 9113 says
    (h2spec http2/5.1.1/2, 5.1/9, 5.1/12, 8.1/1): an id the client skipped, or one
    reused without END_STREAM, ends the connection (PROTOCOL_ERROR); trailers after the
    client's own reset are a stream error, after both sides ended the stream a connection
    error (STREAM_CLOSED); a second request on an open stream's id is malformed."""
    peer = _opened(Peer())
    peer.send(peer.headers(3) + peer.headers(1, END_HEADERS | END_STREAM))
    assert _goaway(peer) == ErrorCode.PROTOCOL_ERROR
    peer = _opened(Peer())
    peer.send(peer.headers(5) + peer.headers(3))
    assert _goaway(peer) == ErrorCode.PROTOCOL_ERROR
    peer = _opened(Peer())
    peer.send(peer.headers(1) + rst_stream(1, ErrorCode.CANCEL))
    peer.send(peer.headers(1, END_HEADERS | END_STREAM))
    assert _resets(await peer.written()) == {1: ErrorCode.STREAM_CLOSED}
    peer.send(peer.headers(3))
    peer.send(peer.headers(3))  # a second request on an open stream's id
    assert _resets(await peer.written()) == {3: ErrorCode.PROTOCOL_ERROR}
    assert peer.streams[3].was_reset and not peer.transport.closed
    peer.send(peer.headers(5, END_HEADERS | END_STREAM))
    peer.connection.send_headers(5, b"", end_stream=True)  # answered: closed both ways
    await peer.written()
    peer.send(peer.headers(5, END_HEADERS | END_STREAM))
    assert _goaway(peer) == ErrorCode.STREAM_CLOSED


async def test_data_on_a_closed_stream_is_stream_closed_unless_we_reset_it() -> None:
    """RFC 9113, 5.1 (h2spec http2/5.1/5, 5.1/8, 5.1/11): DATA after the client ended or
    reset a stream is a stream error, STREAM_CLOSED (it used to be dropped in silence);
    DATA on a stream this side reset is ignored, as the client may have sent it before
    it heard."""
    peer = _opened(Peer())
    peer.send(peer.headers(1, END_HEADERS | END_STREAM))
    peer.connection.send_headers(1, b"", end_stream=True)
    peer.send(peer.headers(3) + rst_stream(3, ErrorCode.CANCEL))
    await peer.written()
    peer.send(frame(Frame.DATA, END_STREAM, 1, b"late") + frame(Frame.DATA, 0, 3, b"late"))
    assert _resets(await peer.written()) == {1: ErrorCode.STREAM_CLOSED, 3: ErrorCode.STREAM_CLOSED}
    peer.send(peer.headers(5))
    peer.connection.reset_stream(5, ErrorCode.CANCEL)
    await peer.written()
    peer.send(frame(Frame.DATA, 0, 5, b"in flight") + peer.headers(5, END_HEADERS | END_STREAM))
    peer.send(frame(Frame.DATA, 0, 1, b"again"))  # answered once: ignored since
    assert await peer.written() == [] and not peer.transport.closed


@pytest.mark.parametrize("idle", [False, True], ids=["open", "idle"])
async def test_a_stream_depending_on_itself_is_a_stream_error(idle: bool) -> None:
    """RFC 9113, 5.3.1 (h2spec http2/5.3.1/1, 5.3.1/2): on HEADERS, no call starts; on
    PRIORITY, the stream is reset, or the connection ends for an idle one (no RST_STREAM
    on an idle stream, 6.4)."""
    peer = _opened(Peer())
    if idle:
        peer.send(frame(Frame.PRIORITY, 0, 1, struct.pack(">IB", 1, 255)))
        assert _goaway(peer) == ErrorCode.PROTOCOL_ERROR
        return
    block = peer.encoder.encode([(":method", "POST"), (":path", "/s/M")])
    priority = struct.pack(">IB", 1, 255)
    peer.send(frame(Frame.HEADERS, END_HEADERS | 0x20, 1, priority + block))
    assert _resets(await peer.written()) == {1: ErrorCode.PROTOCOL_ERROR}
    assert 1 not in peer.streams
    peer.send(peer.headers(3) + frame(Frame.PRIORITY, 0, 3, struct.pack(">IB", 3, 255)))
    assert _resets(await peer.written()) == {3: ErrorCode.PROTOCOL_ERROR}
    assert peer.streams[3].was_reset and not peer.transport.closed


@pytest.mark.parametrize(
    ("declared", "data"),
    [("1", [b"test"]), ("1", [b"test", b""]), ("8", [b"test"]), ("x", [b"test"])],
    ids=["over", "over-in-two", "short", "no-number"],
)
async def test_data_other_than_the_declared_content_length_is_malformed(
    declared: str, data: list[bytes]
) -> None:
    """RFC 9113, 8.1.1 (h2spec http2/8.1.2.6/1-2): a stream error, PROTOCOL_ERROR; the
    call is reset. A length that matches goes through."""
    peer = _opened(Peer())
    block = peer.encoder.encode(
        [(":method", "POST"), (":path", "/s/M"), ("content-length", declared)]
    )
    frames = [frame(Frame.DATA, 0, 1, part) for part in data[:-1]]
    frames.append(frame(Frame.DATA, END_STREAM, 1, data[-1]))
    peer.send(frame(Frame.HEADERS, END_HEADERS, 1, block) + b"".join(frames))
    assert _resets(await peer.written()) == {1: ErrorCode.PROTOCOL_ERROR}
    assert 1 not in peer.connection.streams and not peer.transport.closed
    block = peer.encoder.encode([(":method", "POST"), (":path", "/s/M"), ("content-length", "4")])
    peer.send(
        frame(Frame.HEADERS, END_HEADERS, 3, block) + frame(Frame.DATA, END_STREAM, 3, b"test")
    )
    assert _resets(await peer.written()) == {}
    assert peer.streams[3].data == b"test" and peer.streams[3].ended


# ---- row 4: floods -----------------------------------------------------------------


@pytest.mark.parametrize(
    "one",
    [
        frame(Frame.PING, 0, 0, b"12345678"),
        settings_frame({}),
        frame(Frame.DATA, 0, 1),
        b"empty-headers",
        b"rapid-reset",
    ],
    ids=["ping", "settings", "empty-data", "empty-headers", "rapid-reset"],
)
async def test_a_flood_of_costly_empty_frames_gets_enhance_your_calm(one: bytes) -> None:
    peer = _opened(Peer())
    peer.send(peer.headers(1))
    if one == b"empty-headers":
        wire = b"".join(
            frame(Frame.HEADERS, END_HEADERS, s)
            for s in range(3, 2 * connection_state.FLOOD_BUDGET + 6, 2)
        )
    elif one == b"rapid-reset":
        block = peer.encoder.encode([(":method", "POST"), (":path", "/s/M")])
        cancel = struct.pack(">I", ErrorCode.CANCEL)
        wire = b"".join(
            frame(Frame.HEADERS, END_HEADERS, s, block) + frame(Frame.RST_STREAM, 0, s, cancel)
            for s in range(3, 2 * connection_state.FLOOD_BUDGET + 8, 2)
        )
    else:
        wire = one * (connection_state.FLOOD_BUDGET + 1)
    peer.send(wire)
    assert _goaway(peer) == ErrorCode.ENHANCE_YOUR_CALM


async def test_the_flood_budget_is_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = _opened(Peer())
    ping = frame(Frame.PING, 0, 0, b"12345678")
    peer.send(ping * (connection_state.FLOOD_BUDGET - 1))
    now = asyncio.get_running_loop().time()
    monkeypatch.setattr(
        peer.connection._loop, "time", lambda: now + connection_state.FLOOD_INTERVAL + 1
    )
    peer.send(ping * connection_state.FLOOD_BUDGET)
    assert _goaway(peer) is None
    peer.send(ping)
    assert _goaway(peer) == ErrorCode.ENHANCE_YOUR_CALM


async def test_empty_data_that_ends_the_stream_is_not_counted() -> None:
    peer = _opened(Peer())
    wire = b"".join(
        peer.headers(s) + frame(Frame.DATA, END_STREAM, s)
        for s in range(1, 2 * connection_state.FLOOD_BUDGET + 8, 2)
    )
    peer.send(wire)
    assert _goaway(peer) is None


@pytest.mark.parametrize("size", [1, connection_state.MIN_DATA_BYTES - 1])
async def test_a_flood_of_tiny_data_frames_gets_enhance_your_calm(size: int) -> None:
    """DATA frames carrying less than any request message, past one sample of them: each
    costs a frame's work for a byte or a few of the stream's window (only empty ones were
    counted)."""
    peer = _opened(Peer())
    peer.send(peer.headers(1))
    peer.send(frame(Frame.DATA, 0, 1, b"x" * size) * connection_state.DATA_SAMPLE)
    assert _goaway(peer) == ErrorCode.ENHANCE_YOUR_CALM


async def test_small_data_frames_that_carry_messages_are_read() -> None:
    """Frames of a gRPC message each, tiny requests (a few dozen bytes), or a message's
    prefix apart from its payload: on average past the bound, read without end."""
    peer = _opened(Peer())
    peer.send(peer.headers(1))
    message = b"\0\0\0\0\x1b" + b"r" * 27
    wire = (frame(Frame.DATA, 0, 1, message[:5]) + frame(Frame.DATA, 0, 1, message[5:])) * (
        2 * connection_state.DATA_SAMPLE
    )
    peer.send(wire)
    assert _goaway(peer) is None
    assert len(peer.streams[1].data) == 2 * connection_state.DATA_SAMPLE * len(message)


# ---- row 5: the preface timeout ----------------------------------------------------


def _slow_peer(timeout: float) -> Peer:
    peer = Peer.__new__(Peer)
    peer.streams = {}
    peer.connection = Connection(peer._stream, lambda _: None, preface_timeout=timeout)
    peer.transport = FakeTransport()
    peer.connection.connection_made(peer.transport)  # type: ignore[arg-type]
    peer.transport.frames()
    return peer


async def test_a_client_without_a_preface_in_time_is_closed() -> None:
    silent, half, opened = _slow_peer(0.05), _slow_peer(0.05), _slow_peer(0.05)
    half.send(PREFACE[:10])
    opened.send(OPEN)
    await asyncio.sleep(0.1)
    assert _goaway(silent) == ErrorCode.PROTOCOL_ERROR
    assert _goaway(half) == ErrorCode.PROTOCOL_ERROR
    assert _goaway(opened) is None and not opened.transport.closed


# ---- row 2: receive flow control (RFC 9113, 6.9) -----------------------------------

_CHUNK = 256 * 1024


def _data_frames(stream: int, total: int) -> bytes:
    """``total`` bytes of DATA on ``stream``, in frames of the largest size we take."""
    out = bytearray()
    while total > 0:
        size = min(total, _CHUNK)
        out += frame(Frame.DATA, 0, stream, bytes(size))
        total -= size
    return bytes(out)


def _updates(frames: list[tuple[int, int, int, bytes]]) -> list[tuple[int, int]]:
    return [(s, struct.unpack(">I", p)[0]) for k, _f, s, p in frames if k == Frame.WINDOW_UPDATE]


async def test_data_past_a_streams_window_resets_the_stream() -> None:
    """A stream whose call takes nothing gets its 4 MiB and no more: one byte past is
    RST_STREAM FLOW_CONTROL_ERROR and the call reset; the connection goes on."""
    peer = _opened(Peer())
    await peer.written()  # our SETTINGS and window
    peer.send(peer.headers(1))
    peer.send(_data_frames(1, windows.STREAM_WINDOW))
    assert not _resets(await peer.written())
    peer.send(frame(Frame.DATA, 0, 1, b"x"))
    frames = await peer.written()
    assert _resets(frames) == {1: ErrorCode.FLOW_CONTROL_ERROR}
    assert peer.streams[1].was_reset
    assert len(peer.streams[1].data) == windows.STREAM_WINDOW
    assert not peer.transport.closed


async def test_a_connection_reads_a_slice_a_loop_turn() -> None:
    """libuv reads a socket up to 32 times a wake-up; a connection stops reading once it
    took ``_READ_SLICE`` and reads on at the loop's next turn (others run in between),
    but not while its own writes are held back (the client does not read)."""
    peer = _opened(Peer())
    await peer.written()
    peer.send(peer.headers(1))
    piece = _data_frames(1, h2._READ_SLICE // 4)
    for _ in range(3):
        peer.send(piece)
    assert peer.transport.reading
    peer.send(piece)
    assert not peer.transport.reading
    await asyncio.sleep(0)
    assert peer.transport.reading
    for _ in range(4):
        peer.send(piece)
    peer.connection.pause_writing()
    await asyncio.sleep(0)
    assert not peer.transport.reading  # the turn's end does not undo the writes' pause
    peer.connection.resume_writing()
    assert peer.transport.reading
    assert not _resets(await peer.written()) and len(peer.streams[1].data) == 2 * h2._READ_SLICE


async def test_padding_counts_against_the_window() -> None:
    peer = _opened(Peer())
    await peer.written()  # our SETTINGS and window
    peer.send(peer.headers(1))
    peer.send(_data_frames(1, windows.STREAM_WINDOW - 100))
    padded = frame(Frame.DATA, 0x8, 1, bytes([120]) + b"y" * 10 + bytes(120))
    peer.send(padded)
    assert _resets(await peer.written()) == {1: ErrorCode.FLOW_CONTROL_ERROR}
    assert peer.streams[1].was_reset


async def test_data_past_the_connections_window_ends_the_connection() -> None:
    """A client ignoring the windows (ModelStreamInfer, 300 MiB: RSS grew 1:1) is refused
    once the streams' data not taken passes the connection's 16 MiB."""
    peer = _opened(Peer())
    await peer.written()  # our SETTINGS and window
    streams = windows.CONNECTION_WINDOW // windows.STREAM_WINDOW
    for n in range(streams):
        peer.send(peer.headers(2 * n + 1))
        peer.send(_data_frames(2 * n + 1, windows.STREAM_WINDOW))
    frames = await peer.written()
    assert not _updates(frames)  # nothing was taken: nothing given back
    assert not peer.transport.closed
    peer.send(peer.headers(2 * streams + 1))
    peer.send(frame(Frame.DATA, 0, 2 * streams + 1, b"x"))
    assert _goaway(peer) == ErrorCode.FLOW_CONTROL_ERROR


async def test_window_updates_give_back_only_what_was_taken_or_dropped() -> None:
    peer = _opened(Peer())
    await peer.written()  # our SETTINGS and window
    peer.send(peer.headers(1))
    peer.send(_data_frames(1, windows.STREAM_WINDOW))
    assert not _updates(await peer.written())
    peer.connection.acknowledge(1, 1000)
    assert _updates(await peer.written()) == [(1, 1000)]
    # The client resets the stream: what its call had not taken is the connection's again.
    peer.send(frame(Frame.RST_STREAM, 0, 1, struct.pack(">I", ErrorCode.CANCEL)))
    assert _updates(await peer.written()) == [(0, windows.STREAM_WINDOW)]


# ---- row 6: header blocks we send fit the peer's frame size (RFC 9113, 4.2) --------


async def test_a_header_block_is_split_to_the_peers_frame_size() -> None:
    peer = _opened(Peer())
    await peer.written()
    peer.send(peer.headers(1))
    block = bytes(range(256)) * 160  # 40,960 bytes
    peer.connection.send_headers(1, block, end_stream=True)
    frames = await peer.written()
    assert [(k, f, len(p)) for k, f, _s, p in frames] == [
        (Frame.HEADERS, END_STREAM, 16_384),
        (Frame.CONTINUATION, 0, 16_384),
        (Frame.CONTINUATION, END_HEADERS, 40_960 - 2 * 16_384),
    ]
    assert b"".join(p for _k, _f, _s, p in frames) == block
    assert 1 not in peer.connection.streams


async def test_a_long_path_is_answered_in_frames_the_peer_takes() -> None:
    """An unknown method's path of 60 KB, from a peer taking frames of 16,384 bytes: the
    answer's frames fit, and grpc-message echoes at most 1 KiB of the path."""
    peer = GrpcPeer(FakeService().table(Settings(model_repository=".")))
    await peer.written()
    peer.send(peer.headers(1, "M" * 60_000, flags=END_STREAM))
    frames = await peer.written()
    assert frames and all(len(p) <= 16_384 for _k, _f, _s, p in frames)
    block = b"".join(p for k, _f, _s, p in frames if k in (Frame.HEADERS, Frame.CONTINUATION))
    headers = dict(hpack.Decoder().decode(block))
    assert headers["grpc-status"] == "12"
    assert headers["grpc-message"].startswith("Method not found: /inference.")
    assert len(headers["grpc-message"]) <= 1024


# ---- probe row: cached HPACK header lists are bounded in bytes ----------------------


def test_cached_header_lists_are_bounded_in_bytes() -> None:
    """64 small blocks each referencing one indexed 4 KB header (~6 KB sent) held ~4 MB
    of decoded lists per connection; the cache now holds a bounded number of bytes."""
    decoder = HeaderDecoder()
    encoder = hpack.Encoder()
    big = ("x-big", "v" * 4000)
    decoder.decode(encoder.encode([big]))  # indexes it
    for n in range(64):
        path = hpack.NeverIndexedHeaderTuple(":path", f"/s/{n}")  # leaves the table as it is
        block = encoder.encode([path, big, big, big, big])
        assert len(block) < 64
        headers = decoder.decode(block)
        assert headers[1] == big
    held = sum(len(k) + len(v) for h in decoder._cache.values() for k, v in h)
    assert held <= 32 * 1024


# ---- row 10: GOAWAY on shutdown in two phases (RFC 9113, 6.8) ----------------------


def _goaways(frames: list[tuple[int, int, int, bytes]]) -> list[tuple[int, int]]:
    return [struct.unpack(">II", p[:8]) for k, _f, _s, p in frames if k == Frame.GOAWAY]


async def test_shutdown_announces_first_then_names_the_last_stream() -> None:
    """First GOAWAY 2^31-1 NO_ERROR and a PING; a call the client sent before hearing it
    is served; once the PING is answered, GOAWAY names it, later calls are refused, and
    the connection closes when the call ends."""
    peer = _opened(Peer())
    await peer.written()
    peer.send(peer.headers(1))
    peer.connection.go_away()
    frames = await peer.written()
    assert _goaways(frames) == [(2**31 - 1, ErrorCode.NO_ERROR)]
    pings = [p for k, f, _s, p in frames if k == Frame.PING and not f & ACK]
    assert len(pings) == 1
    peer.send(peer.headers(3))  # in flight before the client heard the GOAWAY
    assert 3 in peer.connection.streams
    peer.send(frame(Frame.PING, ACK, 0, pings[0]))
    frames = await peer.written()
    assert _goaways(frames) == [(3, ErrorCode.NO_ERROR)]
    peer.send(peer.headers(5))
    assert _resets(await peer.written()) == {5: ErrorCode.REFUSED_STREAM}
    peer.connection.finished(1)
    await asyncio.sleep(0)
    assert not peer.transport.closed
    peer.connection.finished(3)
    await asyncio.sleep(0)  # (a turn later: what the call writes next goes first)
    assert peer.transport.closed


async def test_the_second_goaway_goes_without_a_ping_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection_state, "GOAWAY_ROUND_TRIP", 0.01)
    peer = _opened(Peer())
    await peer.written()
    peer.connection.go_away()
    assert _goaways(await peer.written()) == [(2**31 - 1, ErrorCode.NO_ERROR)]
    await asyncio.sleep(0.05)
    assert _goaways(peer.transport.frames()) == [(0, ErrorCode.NO_ERROR)]
    assert peer.transport.closed
