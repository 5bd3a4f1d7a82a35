"""Malformed requests are stream errors (issue 37, row 8; RFC 9113, 8.1.1, 8.2, 8.3).

Each header block below is what no well-formed HTTP/2 request carries: the stream is
reset with PROTOCOL_ERROR, no call starts (no handler runs), and the connection goes on
serving. Driven with raw frames through a real connection (``tests.support.grpc_peer``).
"""

from __future__ import annotations

import asyncio
import gzip
import mmap
import struct

import hpack
import pytest

from oipserve.config.settings import Settings
from oipserve.front.grpc.call_state import QUEUED
from oipserve.front.grpc.h2.frames import (
    END_HEADERS,
    END_STREAM,
    ErrorCode,
    Frame,
    Setting,
    frame,
    settings_frame,
)
from oipserve.front.grpc.h2.receive_windows import STREAM_WINDOW
from oipserve.front.header_rules import MalformedRequest, read_call_head
from tests.support.grpc_peer import FakeService, GrpcPeer, grpc_message, until

_PATH = "/inference.GRPCInferenceService/ModelInfer"
_GOOD = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", _PATH),
    (":authority", "a.test"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def _without(name: str) -> list[tuple[str, str]]:
    return [(key, value) for key, value in _GOOD if key != name]


#: (case, the header block): each malformed.
MALFORMED: list[tuple[str, list[tuple[str, str]]]] = [
    ("an upper-case name", [*_GOOD, ("X-Upper", "a")]),
    ("a space in a name", [*_GOOD, ("x-key ", "a")]),
    ("a colon in a name", [*_GOOD, ("x:odd", "a")]),
    ("an empty name", [*_GOOD, ("", "a")]),
    ("NUL in a value", [*_GOOD, ("x-odd", "a\x00b")]),
    ("LF in a value", [*_GOOD, ("x-odd", "a\nb")]),
    ("a pseudo-header's value ending in a space", [(k, f"{v} ") for k, v in _GOOD]),
    ("connection", [*_GOOD, ("connection", "close")]),
    ("keep-alive", [*_GOOD, ("keep-alive", "5")]),
    ("proxy-connection", [*_GOOD, ("proxy-connection", "x")]),
    ("transfer-encoding", [*_GOOD, ("transfer-encoding", "chunked")]),
    ("upgrade", [*_GOOD, ("upgrade", "h2c")]),
    ("te gzip", [*_without("te"), ("te", "gzip")]),
    ("a pseudo-header after a field", [*_without(":authority"), (":authority", "a.test")]),
    ("an unknown pseudo-header", [*_GOOD[:3], (":odd", "x"), *_GOOD[3:]]),
    ("a response pseudo-header", [(":status", "200"), *_GOOD]),
    ("a repeated pseudo-header", [*_GOOD[:3], (":path", _PATH), *_GOOD[3:]]),
    ("no :method", _without(":method")),
    ("no :scheme", _without(":scheme")),
    ("no :path", _without(":path")),
    ("an empty :path", [(k, "" if k == ":path" else v) for k, v in _GOOD]),
    ("GET", [(k, "GET" if k == ":method" else v) for k, v in _GOOD]),
]


def _resets(frames: list[tuple[int, int, int, bytes]], stream: int) -> list[int]:
    return [
        struct.unpack(">I", f[3])[0] for f in frames if f[0] == Frame.RST_STREAM and f[2] == stream
    ]


@pytest.mark.parametrize("headers", [c[1] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
async def test_a_malformed_request_is_a_stream_error(headers: list[tuple[str, str]]) -> None:
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    block = hpack.Encoder().encode(headers)
    peer.send(frame(Frame.HEADERS, END_HEADERS, 1, block))
    peer.send(frame(Frame.DATA, END_STREAM, 1, grpc_message(b"request")))
    await asyncio.sleep(0.01)
    frames = await peer.written()
    assert _resets(frames, 1) == [ErrorCode.PROTOCOL_ERROR]
    assert not [f for f in frames if f[0] == Frame.HEADERS and f[2] == 1]
    assert not service.calls
    assert not peer.connection.streams
    # The connection goes on: a well-formed call on it is answered.
    peer.send(frame(Frame.HEADERS, END_HEADERS, 3, hpack.Encoder().encode(_GOOD)))
    peer.send(frame(Frame.DATA, END_STREAM, 3, grpc_message(b"request")))
    await asyncio.sleep(0.01)
    assert service.calls == [("ModelInfer", b"request")]
    assert not _resets(await peer.written(), 3)


@pytest.mark.parametrize("value", ["a ", " a", "\ta", "a\t", " "])
async def test_a_padded_metadata_value_is_answered_invalid_argument(value: str) -> None:
    """RFC 9113 (8.2.1) calls it malformed, but gRPC's servers take it and HTTP/1.1 trims
    it: the client is told what to mend (INVALID_ARGUMENT naming the key), not reset."""
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    block = hpack.Encoder().encode([*_GOOD, ("x-note", value)])
    peer.send(frame(Frame.HEADERS, END_HEADERS, 1, block))
    peer.send(frame(Frame.DATA, END_STREAM, 1, grpc_message(b"request")))
    await asyncio.sleep(0.01)
    frames = await peer.written()
    assert ErrorCode.PROTOCOL_ERROR not in _resets(frames, 1)
    (answer,) = [f for f in frames if f[0] == Frame.HEADERS and f[2] == 1]
    headers = dict(hpack.Decoder().decode(answer[3]))
    assert headers["grpc-status"] == "3", headers
    assert "'x-note'" in headers["grpc-message"] and "RFC" in headers["grpc-message"]
    assert not service.calls and not peer.connection.streams


@pytest.mark.parametrize("flag", [2, 0x80, 0xFF])
async def test_a_compressed_flag_other_than_0_or_1_is_refused(flag: int) -> None:
    """gRPC's compressed flag is 0 or 1; any other was taken as 1 (found by fuzzing)."""
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    block = hpack.Encoder().encode([*_GOOD, ("grpc-encoding", "gzip")])
    peer.send(frame(Frame.HEADERS, END_HEADERS, 1, block))
    payload = gzip.compress(b"request")
    peer.send(frame(Frame.DATA, END_STREAM, 1, struct.pack(">BI", flag, len(payload)) + payload))
    await asyncio.sleep(0.01)
    frames = await peer.written()
    (answer,) = [f for f in frames if f[0] == Frame.HEADERS and f[2] == 1]
    headers = dict(hpack.Decoder().decode(answer[3]))
    assert headers["grpc-status"] == "13", headers
    assert f"compressed flag is {flag}, not 0 or 1" in headers["grpc-message"]
    assert not service.calls


def test_what_gRPC_cannot_carry_as_metadata_is_dropped_not_refused() -> None:
    """A well-formed field that is not gRPC metadata (a control byte or a tab inside a
    value, non-ASCII, a name with another token byte) is dropped, as before."""
    odd = [("x-ctl", "a\x01b"), ("x-tab", "a\tb"), ("x-utf", "café"), ("x!odd", "a")]
    head = read_call_head((*_GOOD, *odd, ("x-kept", "v")))
    assert head.metadata == (("x-kept", "v"),)
    assert head.path == _PATH and head.content_type == "application/grpc"


@pytest.mark.parametrize("headers", [c[1] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_the_header_rules_name_each_malformed_request(headers: list[tuple[str, str]]) -> None:
    with pytest.raises(MalformedRequest):
        read_call_head(tuple(headers))


async def test_a_stream_burst_waits_unparsed_past_its_bound() -> None:
    """Issue 37, row 2 (the call's part): a ModelStreamInfer client writes messages faster
    than its handler takes them (here: a handler that is slow). Within one window it
    could queue ~800,000 empty ones, ~100 bytes of the front's each; past ``QUEUED``
    parsed, what comes is kept as it came (its window not given back), so the stream
    holds at most its window's bytes, whatever their count, and every message is served
    once the handler takes it. Past 4,096 queued the stream was reset
    ENHANCE_YOUR_CALM, a client that merely wrote fast included."""
    count = 4296
    service = FakeService(delay=0.005)
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    top = 2**31 - 1  # the peer reads every answer
    peer.send(settings_frame({Setting.INITIAL_WINDOW_SIZE: top}))
    peer.send(frame(Frame.WINDOW_UPDATE, 0, 0, struct.pack(">I", top - 65_535)))
    peer.send(peer.headers(1, "ModelStreamInfer"))
    await asyncio.sleep(0.01)  # the stream's task takes its first messages as they come
    flood = grpc_message(b"") * count
    for start in range(0, len(flood), 16384):
        end = END_STREAM if start + 16384 >= len(flood) else 0
        peer.send(frame(Frame.DATA, end, 1, flood[start : start + 16384]))
    call = peer.connection.streams[1]
    assert call._queue is not None and call._queue.qsize() <= QUEUED  # type: ignore[attr-defined]
    unparsed = call._unparsed  # type: ignore[attr-defined]
    assert unparsed is not None and len(unparsed) <= STREAM_WINDOW
    assert await until(lambda: not peer.connection.streams, timeout=30)
    assert not _resets(await peer.written(), 1)
    assert len(service.calls) == count and service.running == 0


def _zero_window_peer(service: FakeService, stream_reply: object = None) -> GrpcPeer:
    """A client whose streams' windows are 0 (SETTINGS_INITIAL_WINDOW_SIZE): it reads no
    reply; ``--send-timeout`` 0.05 s, a second more per 1 GiB of reply."""
    settings = Settings(model_repository=".", send_timeout=0.05, min_transfer_rate=1 << 30)
    table = service.table(settings)
    if stream_reply is not None:
        table.stream_infer = stream_reply  # type: ignore[assignment]
    peer = GrpcPeer(table)
    peer.send(settings_frame({Setting.INITIAL_WINDOW_SIZE: 0}))
    return peer


async def test_a_reply_the_client_does_not_read_is_dropped_after_the_send_timeout() -> None:
    """Probe row "zero window, 5 x 47 KB PNGs": the reply waited on the window for the life
    of the connection. Past ``--send-timeout`` the stream is reset (CANCEL), the call ends
    and the connection goes on."""
    service = FakeService()
    peer = _zero_window_peer(service)
    peer.send(peer.headers(1, "ModelInfer"))
    peer.send(frame(Frame.DATA, END_STREAM, 1, grpc_message(b"request")))
    await asyncio.sleep(0.02)
    assert 1 in peer.connection.streams  # waiting on the window
    assert not _resets(await peer.written(), 1)
    await asyncio.sleep(0.1)
    assert _resets(await peer.written(), 1) == [ErrorCode.CANCEL]
    assert not peer.connection.streams and not peer.connection.lost


async def test_a_stream_reply_not_read_gives_its_memory_back() -> None:
    """The same on ModelStreamInfer, the reply in memory of its own (as a worker's output
    segment is viewed): reset past the timeout, and the memory released."""
    replies: list[mmap.mmap] = []

    async def reply(_request: object, _parked: object = None) -> memoryview:
        replies.append(mmap.mmap(-1, 1 << 20))
        return memoryview(replies[-1])

    peer = _zero_window_peer(FakeService(), reply)
    peer.send(peer.headers(1, "ModelStreamInfer"))
    peer.send(frame(Frame.DATA, 0, 1, grpc_message(b"request")))
    await asyncio.sleep(0.02)
    assert len(replies) == 1 and not replies[0].closed and 1 in peer.connection.streams
    await asyncio.sleep(0.1)
    assert _resets(await peer.written(), 1) == [ErrorCode.CANCEL]
    assert not peer.connection.streams
    for _ in range(50):  # unmapped in a thread
        if replies[0].closed:
            break
        await asyncio.sleep(0.01)
    assert replies[0].closed
