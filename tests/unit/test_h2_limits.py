"""The gRPC port's HTTP/2 refuses abuse and broken frames as RFC 9113 says (issue 37).

A connection driven with raw frames through the fake transport of test_grpc_h2.py:
CONTINUATION floods (rows 1), SETTINGS checks (3), per-frame checks (9), flood budgets
(4) and the preface timeout (5). A connection error is a GOAWAY with the code, then the
transport closed; a stream error is a RST_STREAM with it.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from oipserve.front.grpc.h2 import connection as h2
from oipserve.front.grpc.h2.connection import MAX_CONTINUATIONS, Connection
from oipserve.front.grpc.h2.frames import (
    ACK,
    END_HEADERS,
    END_STREAM,
    PREFACE,
    ErrorCode,
    Frame,
    Setting,
    frame,
    settings_frame,
    window_update,
)
from tests.support.grpc_peer import FakeTransport, Peer

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
    peer = _opened(Peer())
    calls = 0
    handle = peer.connection._header_frame

    def counted(*args: object) -> None:
        nonlocal calls
        calls += 1
        handle(*args)  # type: ignore[arg-type]

    peer.connection._header_frame = counted  # type: ignore[method-assign]
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
    """A reused id is refused, never dropped in silence (the client waited forever)."""
    peer = _opened(Peer())
    peer.send(peer.headers(3) + peer.headers(1, END_HEADERS | END_STREAM))
    assert _resets(await peer.written()) == {1: ErrorCode.STREAM_CLOSED}
    assert 1 not in peer.streams and not peer.transport.closed
    peer.send(peer.headers(3))  # a second request on an open stream's id
    assert _goaway(peer) == ErrorCode.PROTOCOL_ERROR
    peer = _opened(Peer())
    peer.send(peer.headers(5) + peer.headers(3))
    assert _goaway(peer) == ErrorCode.PROTOCOL_ERROR


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
            frame(Frame.HEADERS, END_HEADERS, s) for s in range(3, 2 * h2.FLOOD_BUDGET + 6, 2)
        )
    elif one == b"rapid-reset":
        block = peer.encoder.encode([(":method", "POST"), (":path", "/s/M")])
        cancel = struct.pack(">I", ErrorCode.CANCEL)
        wire = b"".join(
            frame(Frame.HEADERS, END_HEADERS, s, block) + frame(Frame.RST_STREAM, 0, s, cancel)
            for s in range(3, 2 * h2.FLOOD_BUDGET + 8, 2)
        )
    else:
        wire = one * (h2.FLOOD_BUDGET + 1)
    peer.send(wire)
    assert _goaway(peer) == ErrorCode.ENHANCE_YOUR_CALM


async def test_the_flood_budget_is_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = _opened(Peer())
    ping = frame(Frame.PING, 0, 0, b"12345678")
    peer.send(ping * (h2.FLOOD_BUDGET - 1))
    now = asyncio.get_running_loop().time()
    monkeypatch.setattr(peer.connection._loop, "time", lambda: now + h2.FLOOD_INTERVAL + 1)
    peer.send(ping * h2.FLOOD_BUDGET)
    assert _goaway(peer) is None
    peer.send(ping)
    assert _goaway(peer) == ErrorCode.ENHANCE_YOUR_CALM


async def test_empty_data_that_ends_the_stream_is_not_counted() -> None:
    peer = _opened(Peer())
    wire = b"".join(
        peer.headers(s) + frame(Frame.DATA, END_STREAM, s)
        for s in range(1, 2 * h2.FLOOD_BUDGET + 8, 2)
    )
    peer.send(wire)
    assert _goaway(peer) is None


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
