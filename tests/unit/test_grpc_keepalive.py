"""The gRPC port's connections are bounded (issue 37, rows 4 and 5): idle ones are sent
GOAWAY and closed, silent ones are PINGed and closed when nothing answers, a cap refuses
new ones past it, and a ModelStreamInfer stream that sent only its HEADERS costs no task.

Connections are driven with raw frames (``tests.support.grpc_peer``) and watched by a
``keepalive.Watch`` with times of tenths of a second; the cap is tested on a real
listening socket on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import struct

import hpack
import pytest

from oipserve.config.settings import Settings, load_settings
from oipserve.front.grpc.h2.frames import (
    ACK,
    END_HEADERS,
    END_STREAM,
    HEADER,
    MAX_WINDOW,
    PREFACE,
    ErrorCode,
    Frame,
    frame,
    settings_frame,
)
from oipserve.front.grpc.keepalive import ConnectionLimits, Watch, default_max_connections
from oipserve.front.grpc.listener import H2Server
from tests.support.grpc_peer import FakeService, GrpcPeer, grpc_message, until

Frames = list[tuple[int, int, int, bytes]]


def _peer() -> tuple[FakeService, GrpcPeer]:
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    peer.transport.frames()  # the server's SETTINGS and the ACK of ours
    return service, peer


def _goaways(frames: Frames) -> list[tuple[int, ErrorCode]]:
    return [
        (last, ErrorCode(code))
        for kind, _f, _s, payload in frames
        if kind == Frame.GOAWAY
        for last, code in [struct.unpack(">II", payload[:8])]
    ]


def _pings(frames: Frames) -> list[bytes]:
    return [payload for kind, flags, _s, payload in frames if kind == Frame.PING and not flags]


def _statuses(frames: Frames, stream: int) -> list[str]:
    blocks = [f[3] for f in frames if f[0] == Frame.HEADERS and f[2] == stream]
    return [dict(hpack.Decoder().decode(block)).get("grpc-status", "") for block in blocks]


# ---- --grpc-max-connection-idle -----------------------------------------------------


async def test_a_connection_without_calls_is_sent_goaway_and_closed() -> None:
    """A client that opened and then sent nothing was held for good."""
    _, peer = _peer()
    watch = Watch(peer.connection, ConnectionLimits(idle=0.2, keepalive_time=3600))
    try:
        seen: Frames = []

        def goaway_sent() -> bool:
            seen.extend(peer.transport.frames())
            return bool(_goaways(seen))

        assert await until(goaway_sent)
        assert _goaways(seen)[0] == (MAX_WINDOW, ErrorCode.NO_ERROR)  # the two-phase GOAWAY
        # Unanswered, the second GOAWAY follows after a round trip, and the socket closes.
        assert await until(lambda: peer.transport.closed)
        seen += peer.transport.frames()
        assert _goaways(seen)[-1] == (0, ErrorCode.NO_ERROR)
    finally:
        watch.stop()


async def test_a_connection_with_calls_is_not_idle() -> None:
    """Calls that start and end between the watch's looks keep the connection; so does a
    call left open (a ModelStreamInfer stream waiting for its next request)."""
    _, peer = _peer()
    watch = Watch(peer.connection, ConnectionLimits(idle=0.2, keepalive_time=3600))
    try:
        stream = 1
        for _ in range(12):  # 0.6 s of short calls, one every 0.05 s
            peer.send(
                peer.headers(stream, "ServerLive")
                + frame(Frame.DATA, END_STREAM, stream, grpc_message(b""))
            )
            stream += 2
            await asyncio.sleep(0.05)
        peer.send(peer.headers(stream, "ModelStreamInfer"))  # left open
        await asyncio.sleep(0.6)
        assert not _goaways(peer.transport.frames()) and not peer.transport.closed
    finally:
        watch.stop()


# ---- --grpc-keepalive-time / --grpc-keepalive-timeout --------------------------------


async def test_a_silent_connection_is_pinged_and_closed_without_an_answer() -> None:
    """A peer gone without a FIN (a cable pulled, a NAT entry dropped) held its calls and
    memory until the kernel gave up, hours later."""
    _, peer = _peer()
    peer.send(peer.headers(1, "ModelStreamInfer"))  # a call open: not idle, only silent
    limits = ConnectionLimits(idle=None, keepalive_time=0.2, keepalive_timeout=0.2)
    watch = Watch(peer.connection, limits)
    try:
        assert await until(lambda: bool(_pings(peer.transport.frames())))
        assert not peer.transport.closed
        assert await until(lambda: peer.transport.closed)
    finally:
        watch.stop()


async def test_an_answered_ping_keeps_the_connection() -> None:
    _, peer = _peer()
    limits = ConnectionLimits(idle=None, keepalive_time=0.2, keepalive_timeout=0.3)
    watch = Watch(peer.connection, limits)
    try:
        answered = 0
        loop = asyncio.get_running_loop()
        stop = loop.time() + 1.5
        while loop.time() < stop:
            for payload in _pings(peer.transport.frames()):
                peer.send(frame(Frame.PING, ACK, 0, payload))
                answered += 1
            await asyncio.sleep(0.02)
        assert answered >= 2  # pinged again after each silence, and kept
        assert not peer.transport.closed
    finally:
        watch.stop()


# ---- --grpc-max-connections -----------------------------------------------------------


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PREFACE + settings_frame({}))
    await writer.drain()
    return reader, writer


async def _frames_until_closed(reader: asyncio.StreamReader) -> Frames:
    try:
        data = await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:  # closed with our preface unread
        return []
    out, pos = [], 0
    while pos + 9 <= len(data):
        high, low, kind, flags, stream = HEADER.unpack_from(data, pos)
        length = (high << 8) | low
        out.append((kind, flags, stream, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


async def test_connections_past_the_cap_are_refused_and_the_open_ones_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """3,200 silent connections under a limit of 3,000 descriptors left none for REST."""
    service = FakeService()
    server = H2Server(
        service.table(Settings(model_repository=".")),
        limits=ConnectionLimits(max_connections=2, idle=None),
    )
    port = await server.serve("127.0.0.1", 0, reuse_port=False)
    try:
        kept = [await _open(port), await _open(port)]
        with caplog.at_level(logging.WARNING, "oipserve.grpc"):
            for _ in range(5):
                reader, writer = await _open(port)
                refused = await _frames_until_closed(reader)
                writer.close()
                assert refused == []  # closed before the server's preface: a failed connect
        refusals = [r for r in caplog.records if "--grpc-max-connections" in r.getMessage()]
        assert len(refusals) == 1  # rate limited: one line for the five
        for reader, _ in kept:  # the open ones were not dropped for the new ones
            assert not reader.at_eof()
        kept.pop()[1].close()  # one closes: a new one is taken
        assert await until(lambda: server.connections == 1)
        reader, writer = await _open(port)
        writer.write(frame(Frame.PING, 0, 0, b"12345678"))
        await writer.drain()
        head = await asyncio.wait_for(reader.readexactly(9), 5)
        assert HEADER.unpack(head)[2] == Frame.SETTINGS  # served, not refused
        writer.close()
        kept.pop()[1].close()
    finally:
        await server.stop(0)


def test_the_flags_and_their_defaults() -> None:
    """Triton's keepalive flags take milliseconds, as Triton's do: kserve's command lines
    mean the same here."""
    _, settings = load_settings(["serve", "--model-store=/m"], {})
    limits = ConnectionLimits.of(settings)
    assert (limits.keepalive_time, limits.keepalive_timeout) == (7200.0, 20.0)
    assert limits.idle == 300.0 and limits.max_connections == default_max_connections()
    argv = ["serve", "--model-store=/m", "--grpc-keepalive-time=10000"]
    argv += ["--grpc-keepalive-timeout=500", "--grpc-max-connection-idle=0"]
    _, settings = load_settings(argv, {"OIPSERVE_GRPC_MAX_CONNECTIONS": "7"})
    limits = ConnectionLimits.of(settings)
    assert (limits.keepalive_time, limits.keepalive_timeout) == (10.0, 0.5)
    assert limits.idle is None and limits.max_connections == 7


# ---- row 4: a stream's task starts with its first message ---------------------------


async def test_a_stream_that_sent_only_headers_costs_no_task() -> None:
    """Each ModelStreamInfer HEADERS made a queue and a task before any data came."""
    service, peer = _peer()
    before = len(asyncio.all_tasks())
    streams = range(1, 400, 2)
    for stream in streams:
        peer.send(peer.headers(stream, "ModelStreamInfer"))
    await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) == before
    for stream in streams:  # each is served once its messages come
        peer.send(frame(Frame.DATA, END_STREAM, stream, grpc_message(b"request")))
    assert await until(lambda: not peer.connection.streams)
    frames = await peer.written()  # the last trailers leave at the end of that turn
    assert all(_statuses(frames, stream)[-1] == "0" for stream in streams)
    assert len(service.calls) == len(streams)
    assert len(asyncio.all_tasks()) == before


async def test_a_stream_ended_without_a_message_is_answered_ok() -> None:
    _, peer = _peer()
    peer.send(peer.headers(1, "ModelStreamInfer", flags=END_STREAM))
    assert await until(lambda: not peer.connection.streams)
    assert _statuses(await peer.written(), 1) == ["0"]


async def test_shutdown_ends_a_stream_that_sent_only_headers_at_once() -> None:
    """A stream's task ended by itself once the server was closing; one without a task
    must not hold the shutdown for its grace. It ends UNAVAILABLE, as a stream whose
    requests were answered does (its client has not ended its side)."""
    service = FakeService()
    server = H2Server(service.table(Settings(model_repository=".")))
    port = await server.serve("127.0.0.1", 0, reuse_port=False)
    reader, writer = await _open(port)
    encoder = hpack.Encoder()
    block = encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
            ("content-type", "application/grpc"),
        ]
    )
    writer.write(frame(Frame.HEADERS, END_HEADERS, 1, block))
    await writer.drain()
    await asyncio.sleep(0.05)
    loop = asyncio.get_running_loop()
    # As a client does, it reads all along and closes at the server's end (the server's
    # socket lingers until then: ``front.grpc.linger``).
    reading = asyncio.ensure_future(_frames_until_closed(reader))
    reading.add_done_callback(lambda _: writer.close())
    started = loop.time()
    await server.stop(30)
    assert loop.time() - started < 5  # the GOAWAY's round trip, not the grace
    frames = await reading
    assert _statuses(frames, 1) == ["14"]
