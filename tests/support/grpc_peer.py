"""A gRPC client made of raw HTTP/2 frames, driving a real ``Connection`` and its calls
(``front.grpc.call.Call``) through a fake transport: no socket, no grpc library, so a test
can send what no real client would (a prefix then silence, a reset mid-message).
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import hpack

from oipserve.config.settings import Settings
from oipserve.front.grpc.call import Call
from oipserve.front.grpc.call_table import CallTable
from oipserve.front.grpc.h2.connection import Connection
from oipserve.front.grpc.h2.frames import (
    END_HEADERS,
    HEADER,
    PREFACE,
    Frame,
    frame,
    settings_frame,
)
from oipserve.front.grpc.rpcs import RPCS, STREAM_RPC, Method
from oipserve.wire.shm import BufferPool, Lease


class FakeTransport:
    """What the connection writes, kept to be read back as frames."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True
        #: The connection's writes so far (``write`` or ``writelines`` calls): each is one
        #: system call on a real socket.
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.written += data

    def writelines(self, parts: list[bytes]) -> None:
        self.writes += 1
        for part in parts:
            self.written += part

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 50000) if name == "peername" else default

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """Everything written so far, as (type, flags, stream, payload); then forgotten."""
        out, pos, data = [], 0, bytes(self.written)
        while pos < len(data):
            high, low, kind, flags, stream = HEADER.unpack_from(data, pos)
            length = (high << 8) | low
            out.append((kind, flags, stream, data[pos + 9 : pos + 9 + length]))
            pos += 9 + length
        self.written.clear()
        return out


class Parsed(bytes):
    """A request message as parsed: its bytes, and the lease it was read into (if any),
    which the answer gives back as the real service does."""

    lease: Lease | None = None


def _parse(payload: bytes | memoryview) -> Parsed:
    return Parsed(payload)


class FakeService:
    """What a front's table answers, without a data plane: records each call (its request
    bytes, unparsed) and answers ``b"reply"``, after ``delay`` seconds if set."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.arriving: deque[float] = deque()
        self.delay = delay
        #: Answers still running now.
        self.running = 0

    def table(self, settings: Settings, pool: BufferPool | None = None) -> CallTable:
        """Every unary RPC; messages stay bytes."""
        methods = {
            name: Method(_parse, self._answer(name), bytes) for name in RPCS if name != STREAM_RPC
        }
        return CallTable(settings, methods, self._answer(STREAM_RPC), pool=pool)

    def _answer(self, method: str) -> Callable[..., Awaitable[bytes]]:
        """A unary RPC's answer, or a stream's request's (with its ``parked``, not used)."""

        async def answer(request: bytes | memoryview, _parked: object = None) -> bytes:
            lease = getattr(request, "lease", None)
            self.running += 1
            try:
                self.calls.append((method, bytes(request)))
                if self.delay:
                    await asyncio.sleep(self.delay)
                return b"reply"
            finally:
                self.running -= 1
                if lease is not None:
                    lease.release()

        return answer


class RecordingStream:
    """A call that records what the connection hands it."""

    def __init__(self) -> None:
        self.send_window = 0
        self.headers: list[tuple[str, str]] = []
        self.data = bytearray()
        self.ended = False
        self.was_reset = False

    def headers_received(self, headers: Any, end_stream: bool) -> None:
        self.headers = list(headers)
        self.ended = end_stream

    def data_received(self, data: memoryview) -> None:
        self.data += data

    def end_received(self) -> None:
        self.ended = True

    def reset(self) -> None:
        self.was_reset = True


class Peer:
    """A connection under test, its transport, and the streams it made."""

    def __init__(self, connection: type[Connection] = Connection) -> None:
        self.streams: dict[int, RecordingStream] = {}
        self.connection = connection(self._stream, lambda _: None)
        self.transport = FakeTransport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.encoder = hpack.Encoder()

    def _stream(self, connection: Connection, stream: int) -> RecordingStream:
        self.streams[stream] = RecordingStream()
        return self.streams[stream]

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)

    def headers(self, stream: int, flags: int = END_HEADERS) -> bytes:
        block = self.encoder.encode([(":method", "POST"), (":path", "/s/M")])
        return frame(Frame.HEADERS, flags, stream, block)

    async def written(self) -> list[tuple[int, int, int, bytes]]:
        await asyncio.sleep(0)  # writes leave at the end of the loop iteration
        return self.transport.frames()


class GrpcPeer:
    """A client connection to a table's calls, past its preface and settings."""

    def __init__(self, table: CallTable) -> None:
        self.transport = FakeTransport()
        self.encoder = hpack.Encoder()
        self.connection = Connection(lambda conn, stream: Call(conn, stream, table), lambda _: None)
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.send(PREFACE + settings_frame({}))

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)

    def headers(self, stream: int, method: str, *extra: tuple[str, str], flags: int = 0) -> bytes:
        """A call's HEADERS frame (``extra``: more headers, say ``grpc-timeout``)."""
        block = self.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", f"/inference.GRPCInferenceService/{method}"),
                ("content-type", "application/grpc"),
                *extra,
            ]
        )
        return frame(Frame.HEADERS, END_HEADERS | flags, stream, block)

    async def written(self) -> list[tuple[int, int, int, bytes]]:
        await asyncio.sleep(0)  # writes leave at the end of the loop iteration
        return self.transport.frames()


def grpc_message(payload: bytes) -> bytes:
    """A gRPC message: its 5-byte prefix (uncompressed), then ``payload``."""
    return struct.pack(">BI", 0, len(payload)) + payload


def grpc_prefix(length: int) -> bytes:
    """A message's prefix alone, declaring ``length`` bytes to come."""
    return struct.pack(">BI", 0, length)


async def until(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds, polled on the loop
    (which keeps running the connection's timers meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True
