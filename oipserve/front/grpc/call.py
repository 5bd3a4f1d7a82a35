"""One gRPC call on one HTTP/2 stream: headers checked, messages read, the method run,
the answer written (gRPC over HTTP/2, grpc/doc/PROTOCOL-HTTP2.md).

The request headers are checked before any message is read: the path names a method
of the table, the call passes its restriction, the encoding is one this server reads,
and ``grpc-timeout`` (if sent) becomes the call's deadline. Messages (5-byte prefix,
then the payload) are refused by their declared length before any memory is taken
for them; a large ModelInfer message is read straight into a segment of the input
pool, where the worker reads its tensors (as a REST body is), other large ones into
anonymous memory that goes back to the system when freed. A compressed message is
inflated in a thread, bounded by the same limit (``front.grpc.inflate``). What all calls share
is their ``CallTable`` (``front.grpc.call_table``).

Failures leave as a status (``status.status_of``, the one mapping); a call whose
deadline passes is cancelled (a queued request leaves its batcher) and answered
DEADLINE_EXCEEDED; a call the client resets is cancelled and not answered. However a call
ends (either side's RST_STREAM, the connection gone, its deadline, a refusal, a message
that does not arrive within the REST body's timeout) it gives back all it holds: its
message's lease or memory, its task and queued messages, its ``arriving`` entry.
"""

from __future__ import annotations

import asyncio
import mmap
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc

from oipserve.errors import PayloadTooLarge
from oipserve.front.grpc.call_table import CallTable
from oipserve.front.grpc.codec import wire_bytes
from oipserve.front.grpc.h2.connection import STREAM_WINDOW, Connection
from oipserve.front.grpc.h2.frames import (
    MESSAGE_PREFIX,
    RESPONSE_HEADERS,
    TRAILERS_OK,
    ErrorCode,
    trailers,
    trailers_only,
)
from oipserve.front.grpc.h2.headers import Headers
from oipserve.front.grpc.handler_context import Aborted, Context
from oipserve.front.grpc.inflate import ENCODINGS, inflate
from oipserve.front.grpc.rpcs import STREAM_RPC, Method, forget
from oipserve.front.grpc.status import log_failure, status_of
from oipserve.front.grpc.streaming import ordered_responses
from oipserve.front.header_rules import MalformedRequest, grpc_timeout, read_call_head
from oipserve.front.http.h2_asgi import is_grpc
from oipserve.runtime.off_loop import unmap_off_loop
from oipserve.wire.shm import CREATE_IN_THREAD, Lease

#: ModelInfer messages from this size are read into an input segment; other messages from
#: ``MAPPED`` into anonymous memory of their own.
LEASED = 256 * 1024
#: Messages from this size (not leased) are read into anonymous mmap of their own: its pages
#: are zeroed by the kernel as they are first written, never all at once on the loop, and go
#: back to the system when the message is freed. Smaller ones are joined from the received
#: chunks on the heap (whose malloc takes blocks of this size from mmap anyway,
#: ``memory_trim.LARGE_BLOCK``).
MAPPED = 8 * 1024 * 1024
#: A unary call's stream window is given back once this much of its message is in.
_STREAM_ACK = 1024 * 1024
#: A stream's messages read ahead of its handler before its window stops being given back.
_QUEUED = 64
#: A stream's bytes received and not yet answered (queued, or running) before its window
#: stops being given back: with the window the client may still fill, a stream holds at
#: most two windows of requests, whatever its messages' count (64 messages of 1 MiB each
#: queued and 64 more running held ~150 MiB a stream whose client did not read).
_BACKLOG = STREAM_WINDOW
#: The most messages a stream may have queued for its handler: past it, RST_STREAM
#: ENHANCE_YOUR_CALM. Its bytes are bounded by its window (checked by the connection), but
#: within one window of 4 MiB a client could queue 800,000 empty messages, ~100 bytes of
#: the front's each; a client pipelining real requests (64 in flight) stays far below.
MAX_QUEUED = 4096
#: Replies up to this size are written at once, without waiting on windows.
_SMALL_REPLY = 64 * 1024
#: A larger reply is handed to the connection in steps of this, each counted as taken by
#: the client once it is sent: a client reading at ``--min-transfer-rate`` (64 KiB/s)
#: shows progress every 4 s, well within ``--send-timeout``.
_SEND_STEP = 256 * 1024
#: Steps sent between two turns of the loop for others (1 MiB, as the connection's own
#: ``_SEND_SLICE``: its count starts again with every step).
_STEPS_A_TURN = 4

_OK = grpc.StatusCode.OK.value[0]
_DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED.value[0]
_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


class Call:
    """One call: the connection feeds it frames' contents; it answers on the stream."""

    __slots__ = ("send_window", "_conn", "_stream", "_table", "_name", "_method", "_encoding",
                 "_metadata", "_timer", "_upload", "_arrived_at", "_deadline_at", "_task",
                 "_done", "_ended", "_expired",
                 "_prefix", "_left", "_compressed", "_parts", "_memory", "_mapped", "_filled",
                 "_lease", "_waiting", "_unacked", "_messages", "_streaming", "_queue",
                 "_backlog", "_sizes")  # fmt: skip

    def __init__(self, conn: Connection, stream: int, table: CallTable) -> None:
        self.send_window = 0
        self._conn = conn
        self._stream = stream
        self._table = table
        self._name = ""
        self._method: Method | None = None
        self._encoding = "identity"
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._timer: asyncio.TimerHandle | None = None
        #: Set while a message is partly in: past it the call is dropped (``_upload_expired``).
        self._upload: asyncio.TimerHandle | None = None
        #: This ModelInfer call's entry in the table's ``arriving``, until its message is
        #: parsed (``rpcs.arrived`` takes it off then) or the call ends without (``_release``).
        self._arrived_at: float | None = None
        #: The loop's time at the call's deadline (``grpc-timeout``), if it has one.
        self._deadline_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        #: Answered (or reset): nothing more is read or written.
        self._done = False
        #: The client has sent its last message (END_STREAM).
        self._ended = False
        self._expired = False
        # The message being read: its prefix so far, payload bytes left, where they go.
        self._prefix = b""
        self._left = -1
        self._compressed = False
        self._parts: list[bytes] = []
        self._memory: memoryview | None = None
        #: ``_memory`` is anonymous memory of this call's (not a lease).
        self._mapped = False
        self._filled = 0
        self._lease: Lease | None = None
        #: Chunks that came while a large message's segment was being made.
        self._waiting: list[bytes] | None = None
        self._unacked = 0
        #: A unary call's whole message: (compressed, message, its lease, mapped).
        self._messages: list[tuple[bool, Any, Lease | None, bool]] = []
        #: A ModelStreamInfer call (its messages go to ``_queue``, not ``_messages``).
        self._streaming = False
        #: A stream's messages, for its handler to take (None: the client is done); made,
        #: and the handler's task started, with its first message (``_start_stream``).
        self._queue: asyncio.Queue[tuple[bool, Any] | None] | None = None
        #: A stream's bytes received whole and not yet answered, and each message's size
        #: in order (one response a message, in request order): ``_holding_back``.
        self._backlog = 0
        self._sizes: deque[int] = deque()

    # ---- headers --------------------------------------------------------------------

    def headers_received(self, headers: Headers, end_stream: bool) -> None:
        try:
            head = read_call_head(headers)
        except MalformedRequest:
            if self._table.rest is not None and not is_grpc(headers):
                self._to_rest(headers, end_stream)  # a GET, say: REST judges it (h2_asgi)
                return
            # A malformed request (RFC 9113, 8.1.1): a stream error, and no call starts.
            self._done = self._ended = True
            self._conn.reset_stream(self._stream, ErrorCode.PROTOCOL_ERROR)
            return
        path, timeout, self._encoding = head.path, head.timeout, head.encoding
        # NOTE: what is not metadata was dropped there, on every front alike
        #   (``oipserve.front.header_rules``): the primary's answer and a forward's agree.
        self._metadata = head.metadata
        if not head.content_type.startswith("application/grpc"):
            if self._table.rest is not None:
                self._to_rest(headers, end_stream)
                return
            # Not gRPC at all: an HTTP answer, as gRPC servers give (PROTOCOL-HTTP2.md).
            self._finish(b"\x08\x03415")  # :status 415
            return
        if timeout:
            self._deadline(timeout)
            if self._done:
                return
        if path == self._table.stream_path:
            self._name = STREAM_RPC
        else:
            found = self._table.methods.get(path)
            if found is None:
                self._fail(_UNIMPLEMENTED, f"Method not found: {path}")
                return
            self._name, self._method = found
        refusal = self._table.refusal(self._name, self._metadata)
        if refusal is not None:
            self._fail_with(refusal)
            return
        if self._encoding not in ENCODINGS:
            self._fail(_UNIMPLEMENTED, f"grpc-encoding {self._encoding!r} is not supported")
            return
        if self._name == STREAM_RPC:
            # NOTE: no queue and no task until a message comes (``_start_stream``): a
            #   stream opened and left silent costs its call alone (issue 37, row 4).
            self._streaming = True
        elif self._name == "ModelInfer":
            self._arrived_at = time.monotonic()
            self._table.arriving.append(self._arrived_at)
        if end_stream:
            self.end_received()

    def _to_rest(self, headers: Headers, end_stream: bool) -> None:
        """Not a gRPC request: the REST app serves the stream (``front.http.h2_asgi``),
        whose ``RestStream`` takes this call's place on the connection."""
        rest = self._table.rest
        if rest is not None:
            self._done = self._ended = True
            rest.serve(self._conn, self._stream, headers, end_stream, self.send_window)

    def _deadline(self, text: str) -> None:
        try:
            seconds = grpc_timeout(text)
        except ValueError as exc:
            self._fail(_INTERNAL, str(exc))  # as grpc-go answers it
            return
        if seconds is None:
            return  # longer than any deadline is kept: none (``header_rules``)
        loop = asyncio.get_running_loop()
        self._deadline_at = loop.time() + seconds
        self._timer = loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._done:
            return
        self._expired = True
        if self._task is not None and not self._task.done():
            self._task.cancel()  # answered in the task, once it has let go of everything
            # NOTE: a task cancelled before its first step never runs its handler at all
            #   (``grpc-timeout: 1n``): then it is answered once done.
            self._task.add_done_callback(self._answer_expired)
        else:
            self._release()
            self._fail(_DEADLINE, "Deadline Exceeded")

    def _answer_expired(self, _task: asyncio.Task[None]) -> None:
        """The expired call's task is done: answer DEADLINE_EXCEEDED if it could not."""
        if not self._done:
            self._release()
            self._fail(_DEADLINE, "Deadline Exceeded")

    # ---- messages -------------------------------------------------------------------

    def data_received(self, data: memoryview) -> None:
        if self._done:
            return
        if self._ended:
            self._sent_after_end()
            return
        while data:
            if self._left == 0:  # whole, its segment still being made: a second message
                self._release()
                self._fail(_INTERNAL, "more than one request message for a unary call")
                return
            if self._left < 0:  # the prefix
                need = 5 - len(self._prefix)
                self._prefix += bytes(data[:need])
                # NOTE: the prefix came through the stream's window too: given back with
                #   the message's bytes, or a long stream's window shrinks 5 bytes a message.
                self._unacked += min(need, len(data))
                data = data[need:]
                if len(self._prefix) < 5:
                    return
                compressed, length = MESSAGE_PREFIX.unpack(self._prefix)
                self._prefix = b""
                if not self._begin(bool(compressed), length):
                    return
                if length == 0:
                    self._message_done()
                    if self._done:
                        return
                    continue
            take = min(self._left, len(data))
            self._fill(data[:take])
            data = data[take:]
            self._left -= take
            if self._left == 0:
                self._message_done()
                if self._done:
                    return
        if self._left > 0 and self._upload is None:
            self._upload_timer()

    def _upload_timer(self) -> None:
        """A message only partly in is bounded in time, as a REST body is: ``--body-timeout``
        plus a second per ``--min-transfer-rate`` bytes received meanwhile. A prefix
        declaring a large size, then silence, would otherwise hold its memory until the
        connection closed; what is only declared buys no time (a second per 64 KiB still
        to come gave a 256 MiB prefix 68 minutes). Set only when a message spans reads: a
        small one arriving whole costs none."""
        loop = asyncio.get_running_loop()
        self._upload = loop.call_later(
            self._table.body_timeout, self._upload_expired, loop.time(), self._left
        )

    def _upload_expired(self, since: float, left: int) -> None:
        """The message did not arrive in time (``since``: the timer's start, ``left``: its
        bytes to come then): what it holds goes back, the call ends."""
        self._upload = None
        if self._done:
            return
        if self._holding_back():
            self._upload_timer()  # held back by us (its window not given back), not the client
            return
        # NOTE: the bytes received are counted here, at the deadline, not per read: a
        #   message that keeps arriving re-arms its one timer, never one a chunk.
        table, loop = self._table, asyncio.get_running_loop()
        until = since + table.body_timeout + (left - max(self._left, 0)) / table.min_transfer_rate
        if loop.time() < until:
            self._upload = loop.call_later(until - loop.time(), self._upload_expired, since, left)
            return
        if not self._streaming:  # unary, not running yet: answered
            self._release()
            self._fail(_DEADLINE, "the request message did not arrive in time")
        else:  # a stream, its responses perhaps begun: reset (``reset`` releases)
            self.reset()
            self._conn.reset_stream(self._stream, ErrorCode.CANCEL)

    def _begin(self, compressed: bool, length: int) -> bool:
        limit = self._table.receive_limit
        if length > limit:
            self._fail(_EXHAUSTED, f"Received message larger than max ({length} vs. {limit})")
            return False
        if compressed and self._encoding == "identity":
            self._fail(_INTERNAL, "a compressed message without a grpc-encoding")
            return False
        self._compressed = compressed
        self._left = length
        self._filled = 0
        pool = self._table.pool
        if not compressed and length >= LEASED and self._name == "ModelInfer" and pool:
            if length < CREATE_IN_THREAD:
                self._take_lease(pool.acquire(length), length)
            else:
                self._waiting = []
                made = asyncio.ensure_future(pool.acquire_async(length))
                made.add_done_callback(lambda done: self._leased(done, length))
        elif length >= MAPPED:
            self._memory = memoryview(mmap.mmap(-1, length))
            self._mapped = True
        return True

    def _take_lease(self, lease: Lease, length: int) -> None:
        self._lease = lease
        self._memory = lease.buf[:length]

    def _leased(self, made: asyncio.Future[Lease], length: int) -> None:
        if made.cancelled():
            return
        failure = made.exception()
        if failure is not None or self._done:
            if failure is None:
                made.result().release()  # the call ended meanwhile
            elif not self._done:
                self._fail_with(failure)
            return
        self._take_lease(made.result(), length)
        waiting, self._waiting = self._waiting or [], None
        for chunk in waiting:
            self._fill(memoryview(chunk))
        if self._left == 0:
            self._message_done()
        if self._ended and not self._done:
            self._run_when_whole()

    def _fill(self, chunk: memoryview) -> None:
        if self._waiting is not None:
            self._waiting.append(bytes(chunk))
            return
        if self._memory is not None:
            self._memory[self._filled : self._filled + len(chunk)] = chunk
            self._filled += len(chunk)
        else:
            self._parts.append(bytes(chunk))
        self._unacked += len(chunk)
        if self._unacked < _STREAM_ACK:
            return
        if not self._streaming:
            # A unary call takes its one message as it arrives; no more comes after it.
            if self._left > len(chunk):
                self._acknowledge()
        elif not self._holding_back():
            self._acknowledge()  # else once the stream's handler takes or answers messages

    def _acknowledge(self) -> None:
        self._conn.acknowledge(self._stream, self._unacked)
        self._unacked = 0

    def _holding_back(self) -> bool:
        """A stream's window is not given back while its handler is this far behind: too
        many messages queued, or too many bytes received and not yet answered."""
        queue = self._queue
        return self._backlog >= _BACKLOG or (queue is not None and queue.qsize() >= _QUEUED)

    def _answered(self) -> None:
        """A stream's oldest message was answered: its bytes leave the backlog, and the
        window held back for them is given back."""
        if self._sizes:
            self._backlog -= self._sizes.popleft()
        if self._unacked and not self._holding_back():
            self._acknowledge()

    def _message_done(self) -> None:
        if self._waiting is not None:
            return  # completed by ``_leased``
        self._left = -1
        if self._upload is not None:
            self._upload.cancel()
            self._upload = None
        if self._memory is not None:
            message: Any = self._memory
            self._memory = None
        elif len(self._parts) == 1:
            message = self._parts[0]
        else:
            message = b"".join(self._parts)
        self._parts = []
        lease, self._lease = self._lease, None
        mapped, self._mapped = self._mapped, False
        if self._streaming:
            queue = self._queue or self._start_stream()
            if queue.qsize() >= MAX_QUEUED:
                unmap_off_loop(message)
                self.reset()
                self._conn.reset_stream(self._stream, ErrorCode.ENHANCE_YOUR_CALM)
                return
            queue.put_nowait((self._compressed, message))
            size = memoryview(message).nbytes
            self._backlog += size
            self._sizes.append(size)
            return
        self._messages.append((self._compressed, message, lease, mapped))
        if len(self._messages) > 1:
            self._fail(_INTERNAL, "more than one request message for a unary call")

    def end_received(self) -> None:
        if self._ended and not self._done:
            self._sent_after_end()
            return
        self._ended = True
        if self._done:
            return
        if self._streaming:
            (self._queue or self._start_stream()).put_nowait(None)
        else:
            self._run_when_whole()

    def _start_stream(self) -> asyncio.Queue[tuple[bool, Any] | None]:
        """A stream's first message (or its end) came: its queue, and its handler's task."""
        queue: asyncio.Queue[tuple[bool, Any] | None] = asyncio.Queue()
        self._queue = queue
        self._task = asyncio.ensure_future(self._run_stream())
        return queue

    def shutting_down(self) -> None:
        """The server stops: a stream whose handler never started (no message came) ends
        now with OK, as a started one does once ``closing`` is set and it has answered
        what it read (``streaming.ordered_responses``)."""
        if self._streaming and self._task is None and not self._done:
            self._end(_OK, "", False)

    def _run_when_whole(self) -> None:
        """Run a unary call whose client is done sending, once its message is whole."""
        if self._waiting is not None:
            return  # ``_leased`` comes back here
        if self._left >= 0 or self._prefix:
            self._fail(_INTERNAL, "the request ended inside a message")
        elif not self._messages:
            self._fail(_INTERNAL, "no request message for a unary call")
        else:
            self._task = asyncio.ensure_future(self._run_unary())

    # ---- running --------------------------------------------------------------------

    async def _run_unary(self) -> None:
        method = self._method
        compressed, message, lease, mapped = self._messages.pop()
        payload: Any = None
        try:
            payload = await self._inflated(message) if compressed else message
            if method is None:  # answered by another front
                data: bytes | memoryview = await self._forwarded(bytes(payload))
            else:
                self._arrived_at = None  # parsing takes it off ``arriving`` (``rpcs.arrived``)
                request = method.deserialize(payload)
                if lease is not None:
                    request.lease, lease = lease, None  # the service owns it now
                data = await wire_bytes(await method.call(request), method.serialize)
        except asyncio.CancelledError:
            self._cancelled()
            return
        except Exception as exc:
            self._fail_with(exc)
            return
        finally:
            self._release_message(message, lease, mapped)
            if compressed and payload is not None:
                unmap_off_loop(payload)
        try:
            await self._send([data], first=True)
        except (asyncio.CancelledError, ConnectionError):
            self._cancelled()
            return
        except Exception as exc:  # too large to send: nothing was sent
            self._fail_with(exc)
            return
        self._finish(TRAILERS_OK)

    def _forwarded(self, request: bytes) -> Awaitable[bytes]:
        forward = self._table.forward
        if forward is None:
            raise RuntimeError(f"{self._name} is to be forwarded by a table that cannot forward")
        left = None
        if self._deadline_at is not None:
            left = max(0.0, self._deadline_at - asyncio.get_running_loop().time())
        return forward(self._name, request, self._metadata, left)

    async def _run_stream(self) -> None:
        started = False
        #: The request messages, in order, until their responses are sent: then one
        #: received into memory of its own (``MAPPED``) is unmapped in a thread, not by
        #: its last reference's release on the loop (64 MiB: tens of ms).
        held: deque[Any] = deque()
        try:
            context = Context(self._metadata)
            table = self._table
            responses = ordered_responses(
                self._requests(held), table.stream_infer, table.closing, context
            )
            async for parts in responses:
                try:
                    await self._send(parts, first=not started)
                    started = True
                finally:
                    if held:  # its request's message (responses come in request order)
                        unmap_off_loop(held.popleft())
                    self._answered()
        except asyncio.CancelledError:
            self._cancelled()
            return
        except ConnectionError:
            return
        except Aborted as exc:
            self._end(exc.code.value[0], exc.message, started)
            return
        except Exception as exc:
            code, message = status_of(exc)
            log_failure(STREAM_RPC, code, message, exc)
            self._end(code.value[0], message, started)
            return
        finally:
            while held:
                unmap_off_loop(held.popleft())
        self._end(_OK, "", started)

    async def _requests(self, held: deque[Any]) -> AsyncIterator[Any]:
        if self._queue is None:
            raise RuntimeError(f"the request stream of {self._name} has no queue")
        while True:
            item = await self._queue.get()
            if item is None:
                return
            compressed, message = item
            item = None
            if self._unacked and not self._holding_back():
                self._acknowledge()
            if compressed:
                inflated = await self._inflated(message)
                unmap_off_loop(message)
                message = inflated
            held.append(message)
            yield message

    def _inflated(self, message: bytes | memoryview) -> Awaitable[bytes | memoryview]:
        return inflate(message, self._encoding, self._table.receive_limit)

    # ---- answering ------------------------------------------------------------------

    async def _send(self, parts: list[bytes | memoryview], first: bool) -> None:
        """One message, its wire bytes in ``parts``: joined when small, else sent one
        part after another as the windows allow (a large one is never copied).

        A part in memory of its own (a reply gathered in a thread, a mapped message) is
        unmapped in a thread once the transport has handed it to the kernel, or at once
        when nothing is sent from it (too large, the call gone).
        """
        try:
            size = sum(memoryview(part).nbytes for part in parts)
            limit = self._table.send_limit
            if size > limit:
                raise PayloadTooLarge(f"Sent message larger than max ({size} vs. {limit})")
            conn, stream = self._conn, self._stream
            if first:
                conn.send_headers(stream, RESPONSE_HEADERS)
            prefix = MESSAGE_PREFIX.pack(0, size)
            if size <= _SMALL_REPLY and conn.send_small(self, stream, b"".join([prefix, *parts])):
                return
            progress = self._send_timer()
            try:
                await conn.send_data(self, stream, memoryview(prefix))
                for part in parts:
                    await self._send_part(memoryview(part), progress)
                if any(type(part) is memoryview for part in parts):
                    await conn.sent()  # the transport holds views of them until then
            finally:
                progress.timer.cancel()
        finally:
            for part in parts:
                unmap_off_loop(part)

    async def _send_part(self, view: memoryview, progress: _Sending) -> None:
        """One part of a large reply, in steps whose bytes count as taken by the client.

        NOTE: a coroutine of its own, so that no view of the part outlives it in ``_send``'s
        frame: ``unmap_off_loop`` there unmaps it in a thread only once nothing views it.
        """
        conn, stream = self._conn, self._stream
        for step, pos in enumerate(range(0, len(view), _SEND_STEP), 1):
            await conn.send_data(self, stream, view[pos : pos + _SEND_STEP])
            progress.sent += min(_SEND_STEP, len(view) - pos)
            if step % _STEPS_A_TURN == 0:
                await asyncio.sleep(0)

    def _send_timer(self) -> _Sending:
        """A reply waiting on windows is bounded in time, as a REST response is:
        ``--send-timeout`` plus a second per ``--min-transfer-rate`` bytes the client has
        taken of it. A client that keeps its window closed would otherwise hold the reply
        (views of a worker's output segment) for the life of its connection; its size
        buys no time (a second per 64 KiB of it held a 200 MB image reply for an hour).
        Set only when a reply cannot leave at once: a small one sent whole costs none."""
        loop = asyncio.get_running_loop()
        progress = _Sending(loop.time())
        progress.timer = loop.call_later(self._table.send_timeout, self._send_expired, progress)
        return progress

    def _send_expired(self, progress: _Sending) -> None:
        """The client took too long to read the reply: the stream is reset (CANCEL) and the
        call's task cancelled, which lets go of the reply's memory (``_send``)."""
        if self._done:
            return
        table, loop = self._table, asyncio.get_running_loop()
        until = progress.since + table.send_timeout + progress.sent / table.min_transfer_rate
        if loop.time() < until:  # it took enough meanwhile: the deadline moves on
            progress.timer = loop.call_later(until - loop.time(), self._send_expired, progress)
            return
        self.reset()
        self._conn.reset_stream(self._stream, ErrorCode.CANCEL)

    def _finish(self, block: bytes) -> None:
        """The last header block (trailers), ending the stream from this side."""
        if self._done:
            return
        self._done = True
        self._stop_timer()
        self._conn.send_headers(self._stream, block, end_stream=True)
        self._close_stream()
        if self._queue is not None:
            self._stop_stream()

    def _stop_stream(self) -> None:
        """A stream answered from outside its task (a message refused by its length, its
        upload or deadline past): the task would wait on its queue for good; it is
        cancelled, and the messages queued for it are given back."""
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            if not task.cancelling():  # ``reset`` may have cancelled it already
                task.cancel()
        queue = self._queue
        while queue is not None and not queue.empty():
            item = queue.get_nowait()
            if item is not None:
                unmap_off_loop(item[1])

    def _end(self, code: int, message: str, started: bool) -> None:
        self._finish(trailers(code, message) if started else trailers_only(code, message))

    def _fail(self, code: int, message: str) -> None:
        """Answer with a status alone (nothing was sent yet)."""
        self._finish(trailers_only(code, message))

    def _fail_with(self, exc: BaseException) -> None:
        if isinstance(exc, Aborted):
            self._fail(exc.code.value[0], exc.message)
            return
        code, message = status_of(exc)
        log_failure(self._name or "gRPC call", code, message, exc)
        self._fail(code.value[0], message)

    def _cancelled(self) -> None:
        if self._expired:
            self._fail(_DEADLINE, "Deadline Exceeded")
        else:
            self._done = True
            self._stop_timer()

    def _close_stream(self) -> None:
        """Done before the client was: it is told to stop sending (RST_STREAM NO_ERROR)."""
        if not self._ended:
            self._conn.reset_stream(self._stream, ErrorCode.NO_ERROR)
        self._release()

    def _sent_after_end(self) -> None:
        """DATA, or a second END_STREAM, after the client ended its side: a stream error,
        STREAM_CLOSED (RFC 9113, 5.1). The call ends as if the client had reset it: a
        run already started is cancelled, and what its messages hold is given back."""
        self.reset()
        self._conn.reset_stream(self._stream, ErrorCode.STREAM_CLOSED)

    def reset(self) -> None:
        """The client reset the stream, or the connection went."""
        self._ended = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._done = True
        self._stop_timer()
        self._release()
        if self._queue is not None:
            self._stop_stream()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._upload is not None:
            self._upload.cancel()
            self._upload = None

    def _release(self) -> None:
        """Give back what a message being read holds (a finished call holds nothing), and
        the call's ``arriving`` entry if its message was never parsed (refused, reset,
        expired): else it would be kept for the life of the process."""
        if self._arrived_at is not None:
            forget(self._table.arriving, self._arrived_at)
            self._arrived_at = None
        self._waiting = None
        lease, self._lease = self._lease, None
        memory, self._memory = self._memory, None
        mapped, self._mapped = self._mapped, False
        self._release_message(memory, lease, mapped)
        for _, message, held, in_map in self._messages:
            self._release_message(message, held, in_map)
        self._messages.clear()

    @staticmethod
    def _release_message(message: Any, lease: Lease | None, mapped: bool) -> None:
        if lease is not None:
            lease.release()
        elif mapped:
            unmap_off_loop(message)


class _Sending:
    """A large reply's progress: when its send began, the bytes the client has taken, and
    the timer that ends it (``Call._send_timer``)."""

    __slots__ = ("since", "sent", "timer")

    def __init__(self, since: float) -> None:
        self.since = since
        self.sent = 0
        self.timer: asyncio.TimerHandle  # set by ``Call._send_timer``, which makes it
