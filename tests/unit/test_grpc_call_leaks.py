"""Every way a gRPC call ends gives back what it holds (issue 37, "MadeYouReset" and kin).

A call may end by the client's RST_STREAM, by ours (a stream error such as WINDOW_UPDATE
of 0), by its connection closing, by its deadline, by a refusal or by an upload that
stalls. Each way, its lease goes back to the input pool, its
task ends, its running inference is cancelled, and nothing more is sent on the stream.
Driven with raw frames through a real connection (``tests.support.grpc_peer``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import Iterator

import hpack
import pytest
import uvloop

from oipserve.config.settings import Settings
from oipserve.front.grpc.h2.connection_state import MAX_FRAME
from oipserve.front.grpc.h2.frames import END_STREAM, ErrorCode, Frame, frame, window_update
from oipserve.front.grpc.h2.receive_windows import STREAM_WINDOW
from oipserve.runtime.abandoned_work import LIMIT
from oipserve.wire.shm import BufferPool
from tests.support.grpc_peer import FakeService, GrpcPeer, grpc_message, grpc_prefix, until

#: Message sizes read into a lease: one made at once, one made in a thread.
_LEASED_SIZES = [1024 * 1024, 8 * 1024 * 1024]


@pytest.fixture
def pool() -> Iterator[BufferPool]:
    pool = BufferPool(f"oipserve-test-{os.getpid()}-leaks-")
    yield pool
    pool.close()


def _reset_by_client(peer: GrpcPeer, stream: int) -> None:
    peer.send(frame(Frame.RST_STREAM, 0, stream, struct.pack(">I", ErrorCode.CANCEL)))


def _reset_by_us(peer: GrpcPeer, stream: int) -> None:
    """A WINDOW_UPDATE of 0 on a stream: a stream error, our RST_STREAM answers it."""
    peer.send(window_update(stream, 0))


def _connection_lost(peer: GrpcPeer, stream: int) -> None:
    peer.connection.connection_lost(None)


_ENDINGS = {"client-reset": _reset_by_client, "our-reset": _reset_by_us}


def _statuses(frames: list[tuple[int, int, int, bytes]], stream: int) -> list[str]:
    blocks = [f[3] for f in frames if f[0] == Frame.HEADERS and f[2] == stream]
    return [dict(hpack.Decoder().decode(block)).get("grpc-status", "") for block in blocks]


@pytest.mark.parametrize("size", _LEASED_SIZES, ids=["1MiB", "8MiB"])
@pytest.mark.parametrize("ending", [*_ENDINGS, "connection-lost"])
async def test_a_call_reset_mid_message_gives_its_lease_back(
    pool: BufferPool, ending: str, size: int
) -> None:
    """MadeYouReset: a prefix declaring a large message, then the stream reset. Round
    after round, no lease stays out and the pool's memory stops growing (its idle
    segments are reused)."""
    service = FakeService()
    table = service.table(Settings(model_repository="."), pool)
    end = _ENDINGS.get(ending, _connection_lost)
    sizes = []
    for _ in range(3):
        peer = GrpcPeer(table)
        for stream in (1, 3, 5, 7):
            peer.send(peer.headers(stream, "ModelInfer"))
            peer.send(frame(Frame.DATA, 0, stream, grpc_prefix(size) + b"x" * 1000))
        assert await until(lambda: pool.leased_count == 4)  # segments made in a thread too
        for stream in (1, 3, 5, 7):
            end(peer, stream)
        assert await until(lambda p=peer: pool.leased_count == 0 and not p.connection.streams)
        sizes.append(pool.total_bytes)
    assert sizes[-1] == sizes[0]
    assert not service.calls


@pytest.mark.parametrize("ending", list(_ENDINGS))
async def test_a_reset_stops_the_inference_and_sends_nothing_more(ending: str) -> None:
    service = FakeService(delay=30.0)
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    peer.send(peer.headers(1, "ModelInfer"))
    peer.send(frame(Frame.DATA, END_STREAM, 1, grpc_message(b"request")))
    assert await until(lambda: service.running == 1)
    await peer.written()
    _ENDINGS[ending](peer, 1)
    assert await until(lambda: service.running == 0)  # cancelled, not left to run 30 s
    frames = await peer.written()
    assert not [f for f in frames if f[2] == 1 and f[0] in (Frame.HEADERS, Frame.DATA)]
    assert not peer.connection.streams


@pytest.mark.parametrize("ending", [*_ENDINGS, "connection-lost"])
async def test_reset_streams_leave_no_task_or_queue_behind(ending: str) -> None:
    """ModelStreamInfer: each stream's task waited on its queue forever once we reset it."""
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    await asyncio.sleep(0)
    before = len(asyncio.all_tasks())
    streams = range(1, 1000, 2)
    for stream in streams:
        # NOTE: a message each, which starts the stream's task (HEADERS alone start none).
        peer.send(peer.headers(stream, "ModelStreamInfer"))
        peer.send(frame(Frame.DATA, 0, stream, grpc_message(b"request")))
    # each stream's task, at least
    assert await until(lambda: len(asyncio.all_tasks()) >= before + len(streams))
    end = _ENDINGS.get(ending, _connection_lost)
    for stream in streams:
        end(peer, stream)
    assert await until(lambda: len(asyncio.all_tasks()) == before)
    assert not peer.connection.streams


async def _answer_to_the_smallest_deadline(method: str, timeout: str) -> list[str]:
    service = FakeService(delay=0.01)
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    peer.send(
        peer.headers(1, method, ("grpc-timeout", timeout))
        + frame(Frame.DATA, END_STREAM, 1, grpc_message(b"request"))
    )
    assert await until(lambda: not peer.connection.streams)
    return _statuses(await peer.written(), 1)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("timeout", ["1n", "1u"])
@pytest.mark.parametrize("method", ["ModelInfer", "ModelStreamInfer"])
def test_the_smallest_deadline_is_answered_deadline_exceeded(
    method: str, timeout: str, loop: str
) -> None:
    """``grpc-timeout: 1n``: on uvloop (the server's loop) timers run before the tasks
    made in the same turn, so the call's task was cancelled before its first step and
    never answered."""
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        statuses = runner.run(_answer_to_the_smallest_deadline(method, timeout))
    assert statuses == ["4"]  # DEADLINE_EXCEEDED


async def test_a_stalled_upload_gives_its_memory_back(pool: BufferPool) -> None:
    """A prefix declaring a large size, then silence: the reservation is bounded by the
    REST body's rule (``--body-timeout`` + 1 s per ``--min-transfer-rate`` bytes to come),
    not held until the connection closes."""
    service = FakeService()
    settings = Settings(model_repository=".", body_timeout=0.05, min_transfer_rate=2**30)
    peer = GrpcPeer(service.table(settings, pool))
    peer.send(peer.headers(1, "ModelInfer"))
    peer.send(frame(Frame.DATA, 0, 1, grpc_prefix(1024 * 1024) + b"x" * 1000))
    assert await until(lambda: pool.leased_count == 1)
    assert await until(lambda: pool.leased_count == 0)  # the 0.05 s timeout, not the close
    frames = await peer.written()
    assert _statuses(frames, 1) == ["4"]
    assert any(f[0] == Frame.RST_STREAM and f[2] == 1 for f in frames)
    assert not peer.connection.streams


async def test_an_upload_is_not_timed_while_its_connection_is_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection whose abandoned requests hold its reading (``runtime.abandoned_work``)
    is not read: a message partly in on it is not the client's delay until it is read
    again (as a stream held back by its own backlog). The log says so, once."""
    caplog.set_level(logging.INFO, "oipserve.grpc")
    service = FakeService()
    settings = Settings(model_repository=".", body_timeout=0.05, min_transfer_rate=2**30)
    peer = GrpcPeer(service.table(settings))
    peer.send(peer.headers(1, "ModelInfer"))
    peer.send(frame(Frame.DATA, 0, 1, grpc_prefix(1024) + b"x" * 100))
    abandoned = peer.connection.abandoned
    done = [abandoned.abandoned() for _ in range(LIMIT)]
    assert abandoned.holding and not peer.transport.reading
    await asyncio.sleep(0.25)  # five body timeouts
    assert not _statuses(await peer.written(), 1)
    for answered in done:
        answered()
    assert peer.transport.reading
    assert await until(lambda: _statuses(peer.transport.frames(), 1) == ["4"])
    for _ in range(LIMIT):  # held again: not said again
        abandoned.abandoned()
    held = [r.getMessage() for r in caplog.records if "not read while" in r.getMessage()]
    assert held == [
        "HTTP/2 connection from ('127.0.0.1', 50000) not read while 16 of its cancelled "
        "requests still run in the workers; read again once 8 are left (logged once a "
        "connection)"
    ]


async def test_a_stalled_stream_message_ends_its_stream() -> None:
    service = FakeService()
    settings = Settings(model_repository=".", body_timeout=0.05, min_transfer_rate=2**30)
    peer = GrpcPeer(service.table(settings))
    await asyncio.sleep(0)
    before = len(asyncio.all_tasks())
    peer.send(peer.headers(1, "ModelStreamInfer"))
    peer.send(frame(Frame.DATA, 0, 1, grpc_prefix(1024 * 1024) + b"x" * 1000))
    await asyncio.sleep(0.2)
    frames = await peer.written()
    resets = [f for f in frames if f[0] == Frame.RST_STREAM and f[2] == 1]
    assert [struct.unpack(">I", f[3])[0] for f in resets] == [ErrorCode.CANCEL]
    assert len(asyncio.all_tasks()) == before and not peer.connection.streams


async def test_a_whole_small_message_sets_no_upload_timer() -> None:
    """The hot path: a tiny call whose message arrives in one read arms no timer."""
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    peer.send(peer.headers(1, "ModelInfer"))
    peer.send(frame(Frame.DATA, END_STREAM, 1, grpc_message(b"request")))
    assert len(loop._scheduled) == before  # type: ignore[attr-defined]
    await asyncio.sleep(0.01)
    assert _statuses(await peer.written(), 1)[-1] == "0"


async def test_a_refused_stream_message_ends_its_task() -> None:
    """A ModelStreamInfer message refused by its declared length answered the call, and
    left its task waiting on its queue for the life of the connection."""
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    await asyncio.sleep(0)
    before = len(asyncio.all_tasks())
    peer.send(peer.headers(1, "ModelStreamInfer"))
    await asyncio.sleep(0.01)
    peer.send(frame(Frame.DATA, 0, 1, grpc_prefix(2**31)))
    await asyncio.sleep(0.01)
    assert _statuses(await peer.written(), 1) == ["8"]  # RESOURCE_EXHAUSTED
    assert len(asyncio.all_tasks()) == before and not peer.connection.streams


async def test_a_streams_window_gets_its_message_prefixes_back() -> None:
    """Each message's 5-byte prefix comes through the stream's and the connection's windows
    like its bytes: giving back only the bytes shrank a long stream's window 5 bytes a
    message, until the client could send nothing more (a stream of 1,000 empty messages
    here got back none of its 5,000 bytes)."""
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    await peer.written()
    peer.send(peer.headers(1, "ModelStreamInfer"))
    sent = 0
    for _ in range(50):
        data = grpc_message(b"") * 20
        peer.send(frame(Frame.DATA, 0, 1, data))
        sent += len(data)
        await asyncio.sleep(0)  # the stream's handler takes its messages
    given = {0: 0, 1: 0}
    for _ in range(200):  # until the handler has taken every message (or 2 s)
        for kind, _, stream, payload in await peer.written():
            if kind == Frame.WINDOW_UPDATE and stream in given:
                given[stream] += int.from_bytes(payload, "big")
        if given[1] >= sent:
            break
        await asyncio.sleep(0.01)
    assert given[1] == sent, given


async def test_a_message_taken_when_its_lease_comes_gets_its_window_back(
    pool: BufferPool,
) -> None:
    """A message larger than the stream's window, all of the window received while its
    lease was made (in a thread, its size's first): once the lease comes the window is
    given back, though less of the message is left than a frame. Judged on the frame, it
    was not, and the client waited until the upload timed out (a first 4 MiB tensor)."""
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository="."), pool))
    await peer.written()
    left = 100  # of the message, once the window is spent
    body = grpc_prefix(STREAM_WINDOW - 5 + left) + b"x" * (STREAM_WINDOW - 5)
    frames = [body[i : i + MAX_FRAME] for i in range(0, len(body), MAX_FRAME)]
    peer.send(peer.headers(1, "ModelInfer"))
    peer.send(b"".join(frame(Frame.DATA, 0, 1, part) for part in frames))
    assert pool.leased_count == 0  # all of it waits for the lease
    seen: list[tuple[int, int, int, bytes]] = []

    def window_given() -> bool:
        seen.extend(peer.transport.frames())  # (each write read once)
        return any(kind == Frame.WINDOW_UPDATE and stream == 1 for kind, _, stream, _ in seen)

    assert await until(window_given), "the stream's window was never given back"
    peer.send(frame(Frame.DATA, END_STREAM, 1, b"x" * left))
    assert await until(lambda: not peer.connection.streams), "the message never completed"
    assert "4" not in _statuses([*seen, *peer.transport.frames()], 1)  # not DEADLINE_EXCEEDED
