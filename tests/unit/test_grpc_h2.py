"""The front's own HTTP/2 for gRPC (oipserve.front.grpc.h2): header blocks, the HPACK cache, and a
connection driven frame by frame through a fake transport.

The e2e tests (test_grpc*.py, test_deadlines.py, ...) run real grpc clients against it;
these pin the rules a real client rarely exercises: flow control both ways, streamed
DATA frames cut anywhere, CONTINUATION, padding, and protocol errors.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable

import hpack
import pytest

from oipserve.config.settings import Settings
from oipserve.front.grpc.call import Call
from oipserve.front.grpc.call_table import CallTable
from oipserve.front.grpc.h2.connection import Connection
from oipserve.front.grpc.h2.frames import (
    ACK,
    END_HEADERS,
    END_STREAM,
    HEADER,
    PADDED,
    PREFACE,
    RESPONSE_HEADERS,
    TRAILERS_OK,
    ErrorCode,
    Frame,
    Setting,
    frame,
    settings_frame,
    trailers,
    window_update,
)
from oipserve.front.grpc.h2.headers import HeaderDecoder
from oipserve.front.grpc.h2.receive_windows import STREAM_WINDOW
from oipserve.front.grpc.rpcs import RPCS, STREAM_RPC, Method
from tests.support.grpc_peer import Peer


def _decoded(block: bytes) -> list[tuple[str, str]]:
    return [(name, value) for name, value in hpack.Decoder().decode(block)]


def test_the_servers_header_blocks_decode_as_meant() -> None:
    assert _decoded(RESPONSE_HEADERS) == [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-accept-encoding", "identity,deflate,gzip"),
    ]
    assert _decoded(TRAILERS_OK) == [("grpc-status", "0")]


def test_a_status_message_is_percent_encoded() -> None:
    block = trailers(3, "bad 100% input: é\n" + "x" * 300)
    assert _decoded(block) == [
        ("grpc-status", "3"),
        ("grpc-message", "bad 100%25 input: %C3%A9%0A" + "x" * 300),
    ]


def test_the_header_cache_follows_the_dynamic_table() -> None:
    """The same bytes mean other headers once the table changed: never served stale."""
    encoder = hpack.Encoder()
    decoder = HeaderDecoder()
    first = encoder.encode([(":path", "/a")])  # adds /a at index 62
    assert decoder.decode(first) == ((":path", "/a"),)
    again = encoder.encode([(":path", "/a")])  # index 62 only
    assert again == b"\xbe"
    assert decoder.decode(again) == ((":path", "/a"),)
    assert decoder.decode(again) == ((":path", "/a"),)  # from the cache
    decoder.decode(encoder.encode([(":path", "/b")]))  # /b is index 62 now
    assert decoder.decode(b"\xbe") == ((":path", "/b"),)


def test_hpacks_decoder_still_has_the_table_the_cache_counts() -> None:
    decoder = HeaderDecoder()
    assert decoder._decoder.header_table is decoder._table


# ---- a connection, frame by frame --------------------------------------------------


async def test_the_server_opens_with_its_settings_and_window() -> None:
    peer = Peer()
    frames = await peer.written()
    assert frames[0][0] == Frame.SETTINGS
    settings = dict(struct.iter_unpack(">HI", frames[0][3]))
    assert settings[Setting.INITIAL_WINDOW_SIZE] == STREAM_WINDOW
    assert settings[Setting.ENABLE_PUSH] == 0
    assert frames[1][0] == Frame.WINDOW_UPDATE and frames[1][2] == 0


async def test_frames_cut_anywhere_reach_the_stream_whole() -> None:
    peer = Peer()
    await peer.written()
    payload = bytes(range(256)) * 40
    wire = (
        PREFACE
        + settings_frame({Setting.INITIAL_WINDOW_SIZE: 1 << 20})
        + peer.headers(1)
        + frame(Frame.DATA, 0, 1, payload[:5000])
        + frame(Frame.DATA, END_STREAM, 1, payload[5000:])
    )
    for cut in range(0, len(wire), 7):
        peer.send(wire[cut : cut + 7])
    stream = peer.streams[1]
    assert stream.headers == [(":method", "POST"), (":path", "/s/M")]
    assert bytes(stream.data) == payload and stream.ended
    frames = await peer.written()
    assert (Frame.SETTINGS, ACK, 0, b"") in frames


async def test_continuation_and_padding_are_read() -> None:
    peer = Peer()
    block = peer.encoder.encode([(":method", "POST"), (":path", "/s/M")])
    peer.send(PREFACE + settings_frame({}))
    peer.send(frame(Frame.HEADERS, PADDED, 1, bytes([3]) + block[:2] + b"\0\0\0"))
    peer.send(frame(Frame.CONTINUATION, END_HEADERS, 1, block[2:]))
    peer.send(frame(Frame.DATA, PADDED | END_STREAM, 1, bytes([2]) + b"abc" + b"\0\0"))
    stream = peer.streams[1]
    assert stream.headers == [(":method", "POST"), (":path", "/s/M")]
    assert bytes(stream.data) == b"abc" and stream.ended


async def test_sending_waits_for_the_peers_window() -> None:
    peer = Peer()
    peer.send(PREFACE + settings_frame({}) + peer.headers(1))
    await peer.written()
    stream = peer.streams[1]
    data = memoryview(bytes(100_000))
    sending = asyncio.ensure_future(peer.connection.send_data(stream, 1, data))
    await asyncio.sleep(0.01)
    sent = [f for f in await peer.written() if f[0] == Frame.DATA]
    assert sum(len(f[3]) for f in sent) == 65_535  # the default window, in 16 KiB frames
    assert all(len(f[3]) <= 16_384 for f in sent) and not sending.done()
    peer.send(window_update(0, 50_000))  # the connection's: the stream's is spent still
    await asyncio.sleep(0.01)
    assert not [f for f in await peer.written() if f[0] == Frame.DATA]
    peer.send(window_update(1, 50_000))
    await asyncio.wait_for(sending, 1)
    sent = [f for f in await peer.written() if f[0] == Frame.DATA]
    assert sum(len(f[3]) for f in sent) == 100_000 - 65_535


async def test_a_client_that_does_not_read_is_not_read_either() -> None:
    """Answers the client leaves unread pile up in the transport: reading stops meanwhile."""
    peer = Peer()
    peer.connection.pause_writing()
    assert not peer.transport.reading
    peer.connection.resume_writing()
    assert peer.transport.reading


async def test_a_reset_stream_is_reset_and_later_data_ignored() -> None:
    peer = Peer()
    peer.send(PREFACE + settings_frame({}) + peer.headers(1))
    peer.send(frame(Frame.RST_STREAM, 0, 1, struct.pack(">I", ErrorCode.CANCEL)))
    assert peer.streams[1].was_reset
    peer.send(frame(Frame.DATA, END_STREAM, 1, b"late"))
    assert peer.streams[1].data == b""
    assert not peer.transport.closed


async def test_pings_are_answered() -> None:
    peer = Peer()
    peer.send(PREFACE + settings_frame({}))
    await peer.written()
    peer.send(frame(Frame.PING, 0, 0, b"12345678"))
    assert (Frame.PING, ACK, 0, b"12345678") in await peer.written()


#: The preface and the SETTINGS a client must send first (RFC 9113, 3.4).
_OPEN = PREFACE + settings_frame({})


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ErrorCode.PROTOCOL_ERROR),
        (_OPEN + frame(Frame.DATA, 0, 3, b"x"), ErrorCode.PROTOCOL_ERROR),  # idle stream
        (_OPEN + frame(Frame.HEADERS, END_HEADERS, 2, b"\x82"), ErrorCode.PROTOCOL_ERROR),
        (_OPEN + frame(Frame.HEADERS, END_HEADERS, 1, b"\xff\xff"), ErrorCode.COMPRESSION_ERROR),
        (_OPEN + frame(Frame.PING, 0, 0, b"1"), ErrorCode.FRAME_SIZE_ERROR),
        (_OPEN + frame(Frame.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), ErrorCode.PROTOCOL_ERROR),
        (_OPEN + HEADER.pack(0x4000, 1, Frame.DATA, 0, 1), ErrorCode.FRAME_SIZE_ERROR),
    ],
    ids=["http1", "idle-stream", "even-stream", "bad-hpack", "short-ping", "zero-window", "huge"],
)
async def test_a_broken_peer_gets_a_goaway_and_is_closed(wire: bytes, code: ErrorCode) -> None:
    peer = Peer()
    await peer.written()
    peer.send(wire)
    goaways = [f for f in peer.transport.frames() if f[0] == Frame.GOAWAY]
    assert goaways and struct.unpack(">II", goaways[0][3][:8])[1] == code
    assert peer.transport.closed


async def test_going_away_closes_once_the_last_stream_ends() -> None:
    peer = Peer()
    peer.send(PREFACE + settings_frame({}) + peer.headers(1))
    peer.connection.go_away()
    assert not peer.transport.closed
    pings = [f[3] for f in await peer.written() if f[0] == Frame.PING]
    peer.send(frame(Frame.PING, ACK, 0, pings[0]))  # the second GOAWAY (two phases, 6.8)
    peer.send(peer.headers(3))  # a new stream after the GOAWAY is refused
    assert 3 not in peer.streams
    frames = await peer.written()
    assert any(f[0] == Frame.RST_STREAM and f[2] == 3 for f in frames)
    peer.connection.send_headers(1, TRAILERS_OK, end_stream=True)
    # A loop turn later: what the call writes after its trailers goes first.
    assert not peer.transport.closed
    await asyncio.sleep(0)
    assert peer.transport.closed


# ---- calls: a table's calls over a connection ------------------------------------------


class FakeService:
    """What a front's table answers, without a data plane: records each call (its request
    bytes, unparsed) and answers ``b"reply"``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def table(self, settings: Settings) -> CallTable:
        """Every unary RPC; messages stay bytes."""
        methods = {
            name: Method(_same, self._answer(name), _same) for name in RPCS if name != STREAM_RPC
        }
        return CallTable(settings, methods, self._answer(STREAM_RPC), pool=None)

    def _answer(self, method: str) -> Callable[[bytes | memoryview], Awaitable[bytes]]:
        async def answer(request: bytes | memoryview) -> bytes:
            self.calls.append((method, bytes(request)))
            return b"reply"

        return answer


def _same(payload: bytes | memoryview) -> bytes | memoryview:
    return payload


def _grpc_peer() -> tuple[Peer, FakeService]:
    service = FakeService()
    table = service.table(Settings(model_repository="."))
    peer = Peer()
    peer.connection = Connection(lambda conn, stream: Call(conn, stream, table), lambda _: None)
    peer.connection.connection_made(peer.transport)  # type: ignore[arg-type]
    peer.send(PREFACE + settings_frame({}))
    return peer, service


def _grpc_headers(peer: Peer, stream: int, method: str) -> bytes:
    block = peer.encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", f"/inference.GRPCInferenceService/{method}"),
            ("content-type", "application/grpc"),
        ]
    )
    return frame(Frame.HEADERS, END_HEADERS, stream, block)


def _message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


async def test_a_message_split_over_frames_is_answered_once_whole() -> None:
    peer, service = _grpc_peer()
    peer.send(_grpc_headers(peer, 1, "ModelInfer"))
    peer.send(frame(Frame.DATA, 0, 1, _message(b"request")[:4]))
    await asyncio.sleep(0.01)
    assert not service.calls
    peer.send(frame(Frame.DATA, END_STREAM, 1, _message(b"request")[4:]))
    await asyncio.sleep(0.01)
    assert service.calls == [("ModelInfer", b"request")]
    frames = await peer.written()
    data = [f[3] for f in frames if f[0] == Frame.DATA and f[2] == 1]
    assert data == [_message(b"reply")]
    trailers = [f for f in frames if f[0] == Frame.HEADERS and f[1] & END_STREAM]
    assert hpack.Decoder().decode(trailers[0][3]) == [("grpc-status", "0")]


def _call(peer: Peer, stream: int) -> bytes:
    """A ModelInfer call whole: its headers, its message, its end."""
    message = frame(Frame.DATA, END_STREAM, stream, _message(b"request"))
    return _grpc_headers(peer, stream, "ModelInfer") + message


def _answer(frames: list[tuple[int, int, int, bytes]], stream: int) -> list[tuple[int, int]]:
    return [(kind, flags & END_STREAM) for kind, flags, at, _ in frames if at == stream]


_ANSWERED = [(Frame.HEADERS, 0), (Frame.DATA, 0), (Frame.HEADERS, END_STREAM)]


async def test_a_connections_only_call_is_answered_in_one_write_at_once() -> None:
    """The answer of a connection's only open call (its headers, its message, its
    trailers) goes to the socket in one write as the call's task ends; it waited for a
    flush in the next loop iteration (one more iteration, and ``epoll_pwait``, a call at
    c=1)."""
    peer, _ = _grpc_peer()
    await peer.written()  # the server's SETTINGS, and its ACK of the client's
    writes = peer.transport.writes
    peer.send(_call(peer, 1))
    await asyncio.sleep(0)  # the call's task runs once: the answer is out
    assert _answer(peer.transport.frames(), 1) == _ANSWERED
    assert peer.transport.writes == writes + 1


async def test_calls_answered_in_one_loop_iteration_share_a_write() -> None:
    """Calls open together still share their loop iteration's write (c=16: one write for
    the answers its reads brought), the last answered taking the others' frames along."""
    peer, service = _grpc_peer()
    await peer.written()
    writes = peer.transport.writes
    peer.send(_call(peer, 1) + _call(peer, 3))
    await asyncio.sleep(0)
    frames = peer.transport.frames()
    assert len(service.calls) == 2
    assert _answer(frames, 1) == _answer(frames, 3) == _ANSWERED
    assert peer.transport.writes == writes + 1


async def test_an_unknown_method_is_unimplemented_before_its_message() -> None:
    peer, service = _grpc_peer()
    peer.send(_grpc_headers(peer, 1, "Nope"))
    frames = await peer.written()
    (answer,) = [f for f in frames if f[0] == Frame.HEADERS]
    headers = dict(hpack.Decoder().decode(answer[3]))
    assert headers["grpc-status"] == "12" and "Nope" in headers["grpc-message"]
    assert answer[1] & END_STREAM and not service.calls
    # The client is told to stop sending (RST_STREAM NO_ERROR), and its data is ignored.
    assert any(f[0] == Frame.RST_STREAM and f[2] == 1 for f in frames)


async def test_a_message_over_the_limit_is_refused_by_its_declared_length() -> None:
    peer, service = _grpc_peer()
    peer.send(_grpc_headers(peer, 1, "ServerLive"))
    peer.send(frame(Frame.DATA, 0, 1, struct.pack(">BI", 0, 2**31)))
    frames = await peer.written()
    (answer,) = [f for f in frames if f[0] == Frame.HEADERS]
    headers = dict(hpack.Decoder().decode(answer[3]))
    assert headers["grpc-status"] == "8", headers  # RESOURCE_EXHAUSTED
    assert not service.calls


@pytest.mark.parametrize(
    "late",
    [
        frame(Frame.DATA, END_STREAM, 1, _message(b"second")),
        frame(Frame.DATA, 0, 1, b"x"),
        frame(Frame.DATA, END_STREAM, 1, b""),
    ],
    ids=["a-second-message", "data", "a-second-end"],
)
async def test_frames_after_the_clients_end_reset_the_stream_stream_closed(
    late: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """RFC 9113, 5.1: DATA on a stream the client half-closed is a stream error. The call
    ends as if reset: its run, already scheduled, never starts (it used to start and find
    its message gone, an IndexError in the log)."""
    peer, service = _grpc_peer()
    peer.send(_grpc_headers(peer, 1, "ServerLive"))
    peer.send(frame(Frame.DATA, END_STREAM, 1, _message(b"request")) + late)
    await asyncio.sleep(0.01)
    frames = await peer.written()
    resets = [f for f in frames if f[0] == Frame.RST_STREAM and f[2] == 1]
    assert [struct.unpack(">I", f[3])[0] for f in resets] == [ErrorCode.STREAM_CLOSED]
    assert not [f for f in frames if f[0] in (Frame.HEADERS, Frame.DATA)]  # no answer
    assert not service.calls
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # The connection goes on: the next call is answered.
    peer.send(_grpc_headers(peer, 3, "ServerLive"))
    peer.send(frame(Frame.DATA, END_STREAM, 3, _message(b"request")))
    await asyncio.sleep(0.01)
    assert service.calls == [("ServerLive", b"request")]
