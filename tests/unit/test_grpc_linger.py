"""A connection error's lingering close (``front.grpc.linger``) on a real loopback socket.

Closed with the peer's frames unread, a socket is reset, and the reset drops the GOAWAY
still in our send queue (test_grpc_abuse's continuation-flood case failed so now and
then). The socket now lingers: GOAWAY and FIN out, nothing more read, aborted once the
peer closed or after ``LINGER_SECONDS``; its connection frees its
``--grpc-max-connections`` slot at once, at most ``MAX_LINGERING`` sockets linger, and a
stop waits for none.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from oipserve.config.settings import Settings
from oipserve.front.grpc import linger
from oipserve.front.grpc.h2.frames import HEADER, PREFACE, ErrorCode, Frame, frame, settings_frame
from oipserve.front.grpc.keepalive import ConnectionLimits
from oipserve.front.grpc.listener import H2Server
from tests.support import h2_attacks
from tests.support.grpc_peer import FakeService, until

#: A PING on a stream: a connection error (PROTOCOL_ERROR), then more the server never reads.
ERROR = frame(Frame.PING, 0, 1, b"12345678")
MORE = frame(Frame.PING, 0, 0, b"12345678") * 4096


def _server(max_connections: int = 100) -> H2Server:
    table = FakeService().table(Settings(model_repository="."))
    return H2Server(table, limits=ConnectionLimits(max_connections=max_connections, idle=None))


async def _errs(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that opens, breaks the protocol and sends on (not read by the server)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PREFACE + settings_frame({}) + ERROR + MORE)
    return reader, writer


async def _goaways(reader: asyncio.StreamReader) -> list[int]:
    """The GOAWAY codes read until the server's FIN (a reset: what came before it)."""
    data = b""
    try:
        data = await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        pass
    codes, pos = [], 0
    while pos + 9 <= len(data):
        high, low, kind, _flags, _stream = HEADER.unpack_from(data, pos)
        length = (high << 8) | low
        if kind == Frame.GOAWAY:
            codes.append(struct.unpack_from(">II", data, pos + 9)[1])
        pos += 9 + length
    return codes


async def test_a_flooder_that_reads_late_gets_its_goaway() -> None:
    """Fails before: the socket was closed (so reset) with the GOAWAY still queued behind
    the client's full window; 30 of 30 such clients saw none."""
    server = _server()
    port = await server.serve("127.0.0.1", 0, reuse_port=False)
    try:
        attacker = await asyncio.to_thread(h2_attacks.read_late, port, lambda _: ERROR, MORE, 5.0)
        attacker.close()
        assert attacker.goaway == [ErrorCode.PROTOCOL_ERROR]
    finally:
        await server.stop(0)


async def test_lingering_sockets_hold_no_connection_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """bcf517e's lingering connections kept their slot: reconnecting flooders starved the
    others. Two connections of a cap of two linger; a third client is served."""
    monkeypatch.setattr(linger, "LINGER_SECONDS", 30.0)  # lingering throughout the test
    server = _server(max_connections=2)
    port = await server.serve("127.0.0.1", 0, reuse_port=False)
    try:
        flooders = [await _errs(port), await _errs(port)]
        for reader, _ in flooders:
            assert await _goaways(reader) == [ErrorCode.PROTOCOL_ERROR]  # then our FIN
        assert await until(lambda: server.lingering == 2 and server.connections == 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE + settings_frame({}))
        head = await asyncio.wait_for(reader.readexactly(9), 5)
        assert HEADER.unpack(head)[2] == Frame.SETTINGS  # served, not refused
        writer.close()
        for _, flooder in flooders:
            flooder.close()
    finally:
        await server.stop(0)
    assert server.lingering == 0  # the stop aborted them: none waited for


async def test_lingering_is_bounded_and_brief(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``MAX_LINGERING`` a connection error closes at once, as before; a lingering
    socket is aborted after ``LINGER_SECONDS`` (its peer then sees a reset)."""
    monkeypatch.setattr(linger, "MAX_LINGERING", 2)
    monkeypatch.setattr(linger, "LINGER_SECONDS", 1.0)
    server = _server()
    port = await server.serve("127.0.0.1", 0, reuse_port=False)
    loop = asyncio.get_running_loop()
    try:
        flooders = [await _errs(port) for _ in range(4)]
        started = loop.time()
        assert await until(lambda: server.connections == 0)
        assert server.lingering == 2
        assert await until(lambda: server.lingering == 0, 5)
        assert loop.time() - started >= 0.8
        for _, flooder in flooders:
            flooder.close()
    finally:
        await server.stop(0)


async def test_the_peers_close_ends_the_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """With reading stopped the peer's FIN is never read: its close is seen in the
    socket's TCP state, and the socket goes at once rather than at the linger's end."""
    monkeypatch.setattr(linger, "LINGER_SECONDS", 30.0)
    server = _server()
    port = await server.serve("127.0.0.1", 0, reuse_port=False)
    try:
        reader, writer = await _errs(port)
        assert await _goaways(reader) == [ErrorCode.PROTOCOL_ERROR]
        assert await until(lambda: server.lingering == 1)
        writer.close()
        assert await until(lambda: server.lingering == 0, 5)
    finally:
        await server.stop(0)


async def _goaway_then_silence(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that opens, says GOAWAY (its connection ends well) and reads nothing more."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PREFACE + settings_frame({}) + frame(Frame.GOAWAY, 0, 0, bytes(8)))
    return reader, writer


async def test_sockets_ending_well_linger_at_most_a_quarter_of_the_cap() -> None:
    """Each lingers without its slot; a client ending 1,100 connections so, then silent,
    took every descriptor of a front whose limit was 1,024 (found by fuzzing). Past a
    quarter of the cap they close at once."""
    server = _server(max_connections=8)
    port = await server.serve("127.0.0.1", 0, reuse_port=False)
    clients = [await _goaway_then_silence(port) for _ in range(4)]
    try:
        assert await until(lambda: server.connections == 0 and server.lingering == 2)
        ends = [await asyncio.wait_for(reader.read(), 5) for reader, _ in clients]
        assert len(ends) == 4  # every one read to its FIN: two lingering, two closed
    finally:
        for _, writer in clients:
            writer.close()
        await server.stop(0)


async def test_a_peer_still_taking_a_large_answer_keeps_its_lingering_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A socket that ended well lingers past ``GRACEFUL_SECONDS`` while its peer still
    takes what is left (at ``GRACEFUL_MIN_RATE`` or more): a slow reader of a large answer
    at shutdown was cut at 10 s, its answer truncated (found by fuzzing)."""
    monkeypatch.setattr(linger, "GRACEFUL_SECONDS", 0.2)
    lingering = linger.Lingering()
    payload = bytes(32 << 20)

    class Sender(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            transport.write(payload)
            assert lingering.take_gracefully(transport)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Sender, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = 0
    try:
        while chunk := await reader.read(256 * 1024):
            got += len(chunk)
            await asyncio.sleep(0.01)  # ~25 MB/s: more than a second for all of it
    finally:
        writer.close()
        server.close()
    assert got == len(payload)
