"""The frames between a gRPC process and the front, on one Unix stream socket.

A frame is a 12-byte prefix (the header's length and the payload's length, network
order), a header (msgpack, one of the tagged structs below) and a payload: the raw
bytes of a request or response message, or the settings at start. Messages are never
parsed on the way: the gRPC process forwards what grpc.aio received, and sends back
what the front serialized.
"""

from __future__ import annotations

import asyncio
import mmap
import struct
from collections.abc import Awaitable

import msgspec

from oipserve.http_io import CorkedTransport
from oipserve.wire.messages import ErrorKind

PREFIX = struct.Struct("!IQ")

#: Payloads up to this size are read into the protocol's buffer and handed on as bytes.
_BUFFER = 256 * 1024
#: Larger payloads get memory of their own, filled straight from the socket: from the
#: heap (reused call after call), or, from this size, anonymous mmap: its pages are
#: zeroed by the kernel as they are first written, never all at once on the loop, and
#: go back to the system when the message is freed. The front's malloc takes blocks of
#: this size from mmap anyway (``oipserve.memory_trim``).
MAPPED = 8 * 1024 * 1024


class Start(msgspec.Struct, tag=True, array_like=True):
    """Front -> process: serve ``port`` (payload: the Settings, as JSON)."""

    port: int
    reuse_port: bool


class Listening(msgspec.Struct, tag=True, array_like=True):
    """Process -> front: serving on ``port``."""

    port: int


class Failed(msgspec.Struct, tag=True, array_like=True):
    """Process -> front: it cannot serve (the port could not be bound, say); it exits."""

    message: str


class Call(msgspec.Struct, tag=True, array_like=True):
    """Process -> front: run RPC ``method`` (payload: its request message)."""

    id: int
    method: str


class Cancel(msgspec.Struct, tag=True, array_like=True):
    """Process -> front: the client of call ``id`` is gone (cancelled, deadline passed)."""

    id: int


class Reply(msgspec.Struct, tag=True, array_like=True):
    """Front -> process: call ``id`` answered (payload: the response message), or failed
    with ``kind`` and ``message`` (``oipserve.errors`` turns them back into the error)."""

    id: int
    kind: ErrorKind | None = None
    message: str = ""


class Stop(msgspec.Struct, tag=True, array_like=True):
    """Front -> process: stop taking calls, let running ones finish within ``timeout``, exit."""

    timeout: float


Header = Start | Listening | Failed | Call | Cancel | Reply | Stop
Payload = bytes | memoryview

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Header).decode


class FrameProtocol(asyncio.BufferedProtocol):
    """Reads frames into ``frame_received``; ``send`` writes one (gathered per loop turn).

    The kernel copies small frames into one reusable buffer; a large payload is read
    straight into memory of its own (``memory_for`` lets a protocol choose where), so
    that a 100 MB message costs the loop only many short reads.
    """

    def __init__(self) -> None:
        self._buffer = bytearray(_BUFFER)
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        #: A large payload being filled: its header, memory and bytes so far.
        self._large_header: Header | None = None
        self._large: memoryview | None = None
        self._filled = 0
        #: What arrived of a payload whose memory is being prepared (``memory_for``).
        self._waiting_first = b""
        self._out: CorkedTransport | None = None
        self.transport: asyncio.Transport | None = None

    # ---- writing ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._out = CorkedTransport(transport, asyncio.get_running_loop())  # type: ignore[arg-type]

    async def sent(self) -> None:
        """Return once everything sent so far is in the kernel's hands."""
        if self._out is not None:
            await self._out.sent()

    def send(self, header: Header, payload: Payload = b"") -> None:
        if self._out is None or self._out.is_closing():
            return
        head = _encode(header)
        self._out.write(PREFIX.pack(len(head), len(payload)) + head)
        if payload:
            self._out.write(payload)

    # ---- reading ------------------------------------------------------------------

    def frame_received(self, header: Header, payload: Payload) -> None:
        raise NotImplementedError

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            # NOTE: a slice of at most _BUFFER: one read into fresh pages faults them in
            #   (~1 ms a MiB), and libuv reads again while reads fill the buffer.
            return self._large[self._filled : self._filled + _BUFFER]
        if self._end == len(self._buffer):
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._filled += nbytes
            if self._filled == len(self._large):
                self._deliver_large()
            return
        self._end += nbytes
        self._frames()

    def _frames(self) -> None:
        view = self._view
        while self._end - self._start >= PREFIX.size:
            start = self._start
            head_length, payload_length = PREFIX.unpack_from(view, start)
            head_end = start + PREFIX.size + head_length
            if head_end > self._end:
                if head_end - start > len(self._buffer):
                    self._grow(head_end - start)
                return
            header = _decode(view[start + PREFIX.size : head_end])
            end = head_end + payload_length
            if end <= self._end:
                self._start = end
                self.frame_received(header, bytes(view[head_end:end]))
                continue
            if end - start <= len(self._buffer):
                return  # fits the buffer: wait for the rest
            self._start = self._end
            self._begin_large(header, payload_length, view[head_end : self._end])
            return
        if self._start == self._end:
            self._start = self._end = 0

    def memory_for(self, header: Header, length: int) -> memoryview | Awaitable[memoryview] | None:
        """Where a large payload is to be read: ``length`` bytes of memory, or an awaitable
        of them (reading pauses until it is there); None: memory of its own (``MAPPED``).
        """
        return None

    def _begin_large(self, header: Header, length: int, first: memoryview) -> None:
        given = self.memory_for(header, length)
        if given is not None and not isinstance(given, memoryview):
            self._large_header = header
            self._waiting_first = bytes(first)
            self._start = self._end = 0
            assert self.transport is not None
            self.transport.pause_reading()
            asyncio.ensure_future(given).add_done_callback(self._memory_given)
            return
        if given is not None:
            memory = given
        elif length >= MAPPED:
            memory = memoryview(mmap.mmap(-1, length))
        else:
            memory = memoryview(bytearray(length))
        self._fill(header, memory, first)
        self._start = self._end = 0

    def _fill(self, header: Header, memory: memoryview, first: memoryview | bytes) -> None:
        memory[: len(first)] = first
        self._large_header, self._large, self._filled = header, memory, len(first)
        if self._filled == len(memory):
            self._deliver_large()

    def _memory_given(self, given: asyncio.Future[memoryview]) -> None:
        header, first = self._large_header, self._waiting_first
        self._waiting_first = b""
        assert header is not None and self.transport is not None
        if given.cancelled() or given.exception() is not None:
            self.transport.close()  # no memory for what the peer sends: nothing can follow
            return
        self._fill(header, given.result(), first)
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def _deliver_large(self) -> None:
        header, payload = self._large_header, self._large
        self._large_header, self._large, self._filled = None, None, 0
        assert header is not None and payload is not None
        self.frame_received(header, payload)

    def _compact(self) -> None:
        kept = self._end - self._start
        self._buffer[:kept] = self._view[self._start : self._end]
        self._start, self._end = 0, kept

    def _grow(self, size: int) -> None:
        """A header larger than the buffer (a long error message, say)."""
        kept = self._end - self._start
        buffer = bytearray(size)
        buffer[:kept] = self._view[self._start : self._end]
        # NOTE: a new buffer, not a resized one: the loop may still hold a view of the old.
        self._buffer, self._view = buffer, memoryview(buffer)
        self._start, self._end = 0, kept
