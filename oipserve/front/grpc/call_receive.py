"""A call's request messages read (``front.grpc.call``'s layers: ``call_state``).

Messages (5-byte prefix, then the payload) are refused by their declared length before
any memory is taken for them; a large ModelInfer message is read straight into a segment
of the input pool, where the worker reads its tensors (as a REST body is), other large
ones into anonymous memory that goes back to the system when freed, small ones joined on
the heap. A message only partly in is bounded in time as a REST body is. A unary call
runs once its one message is whole and the client is done; a stream's messages are
queued for its handler, its window given back as the handler keeps up; while it is
``QUEUED`` messages behind, what comes is kept unparsed (the window bounds it).
"""

from __future__ import annotations

import asyncio
import mmap
from typing import Any, Final

import grpc

from oipserve.errors import SHUTDOWN_STREAM
from oipserve.front.grpc.call_run import CallRunner
from oipserve.front.grpc.call_state import QUEUED, RUNNING, SHUT, SHUT_ITEM
from oipserve.front.grpc.h2.frames import MESSAGE_PREFIX, ErrorCode
from oipserve.runtime.off_loop import unmap_off_loop
from oipserve.wire.shm import CREATE_IN_THREAD, Lease

#: ModelInfer messages from this size are read into an input segment; other messages from
#: ``MAPPED`` into anonymous memory of their own.
LEASED: Final = 256 * 1024
#: Messages from this size (not leased) are read into anonymous mmap of their own: its pages
#: are zeroed by the kernel as they are first written, never all at once on the loop, and go
#: back to the system when the message is freed. Smaller ones are joined from the received
#: chunks on the heap (whose malloc takes blocks of this size from mmap anyway,
#: ``memory_trim.LARGE_BLOCK``).
MAPPED: Final = 8 * 1024 * 1024
#: A unary call's stream window is given back once this much of its message is in.
_STREAM_ACK: Final = 1024 * 1024

_DEADLINE: Final = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
_INTERNAL: Final = grpc.StatusCode.INTERNAL.value[0]
_EXHAUSTED: Final = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
_UNAVAILABLE: Final = grpc.StatusCode.UNAVAILABLE.value[0]


class CallReceiver(CallRunner):
    """A call's layer that reads its messages (the connection's ``data_received``,
    ``end_received``)."""

    __slots__ = ()

    def data_received(self, data: memoryview) -> None:
        if self._done:
            return
        if self._ended:
            self._sent_after_end()
            return
        unparsed = self._unparsed
        if unparsed is not None:  # the stream's handler is behind: kept as it came
            unparsed += data
            return
        used = self._parse(data)
        if used < len(data) and not self._done:
            self._unparsed = bytearray(data[used:])
            self._unparsed_at = 0

    def _parse(self, data: memoryview) -> int:
        """Read the messages in ``data``; return the bytes taken: all of them, unless a
        stream's handler is ``QUEUED`` messages behind at a message's start (the rest is
        then kept unparsed: ``_drain`` comes back), or the call ended."""
        taken = 0
        while taken < len(data):
            if self._left == 0:  # whole, its segment still being made: a second message
                self._release()
                self._fail(_INTERNAL, "more than one request message for a unary call")
                return taken
            if self._left < 0:  # the prefix
                if not self._prefix and self._behind():
                    return taken
                need = min(5 - len(self._prefix), len(data) - taken)
                self._prefix += bytes(data[taken : taken + need])
                taken += need
                self._parsed += need
                # NOTE: the prefix came through the stream's window too: given back with
                #   the message's bytes, or a long stream's window shrinks 5 bytes a message.
                self._unacked += need
                if len(self._prefix) < 5:
                    return taken
                compressed, length = MESSAGE_PREFIX.unpack(self._prefix)
                self._prefix = b""
                if not self._begin(compressed, length):
                    return taken
                if length == 0:
                    self._message_done()
                    if self._done:
                        return taken
                    continue
            take = min(self._left, len(data) - taken)
            self._fill(data[taken : taken + take])
            taken += take
            self._parsed += take
            self._left -= take
            self._give_back_window()
            if self._left == 0:
                self._message_done()
                if self._done:
                    return taken
        if self._left > 0 and self._upload is None:
            self._upload_timer()
        return taken

    def _behind(self) -> bool:
        """A stream's handler is ``QUEUED`` messages behind (its window is not given back
        meanwhile): what comes is kept unparsed. Parsed, a burst of tiny messages was a
        queue entry and an object each (~100 bytes of the front for a 5-byte message),
        which only a count bounded: past 4,096 a well-behaved client that merely wrote
        faster than the stream was read had its stream reset ENHANCE_YOUR_CALM. Unparsed,
        they are their bytes, which the stream's window bounds."""
        if not self._streaming or self._stopping != RUNNING:
            return False
        queue = self._queue
        return queue is not None and queue.qsize() >= QUEUED

    def _drain(self) -> None:
        """The stream's handler took messages: read on in what was kept unparsed, until
        it is ``QUEUED`` messages behind again (where the parse stops, no copy is made;
        the bytes read are let go once they are half the buffer). Once all is read, the
        client's end, if it came, follows the last message."""
        unparsed = self._unparsed
        if unparsed is None:
            return
        at = self._unparsed_at
        with memoryview(unparsed) as view:
            used = self._parse(view[at:])
        if self._done:
            return
        at += used
        if at < len(unparsed):
            if at > len(unparsed) // 2:
                del unparsed[:at]
                at = 0
            self._unparsed_at = at
            return
        self._unparsed = None
        if self._ended:
            (self._queue or self._start_stream()).put_nowait(None)

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
        conn = self._conn
        if self._holding_back() or conn.abandoned.holding or conn.window_withheld(self._left):
            # Held back by us (its window not given back, the connection not read while
            # its abandoned requests run, or the connection's window spent on its requests
            # that wait or run), not by the client. (Each of those ends: a request by its
            # deadline, --infer-timeout; the call's own grpc-timeout still ends it.)
            self._upload_timer()
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

    def _begin(self, flag: int, length: int) -> bool:
        """A message's prefix read: its compressed flag (0 or 1: gRPC's only values; any
        other was taken as 1, found by fuzzing) and length."""
        limit = self._table.receive_limit
        if length > limit:
            self._fail(_EXHAUSTED, f"Received message larger than max ({length} vs. {limit})")
            return False
        if flag > 1:
            self._fail(_INTERNAL, f"a message whose compressed flag is {flag}, not 0 or 1")
            return False
        compressed = flag == 1
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
        self._give_back_window()
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

    def _give_back_window(self) -> None:
        """What the stream's window lost to the bytes taken so far is given back, a
        ``_STREAM_ACK`` at a time: for a unary call while its message has more to come
        (after it, nothing does), for a stream while its handler keeps up.

        NOTE: judged on what is left of the message once the bytes are counted, never on
        the chunk: a message received while its lease was being made is taken in one go
        when the lease comes, and with less left of it then than a chunk, its window (all
        of it taken) was never given back: the client waited for it until the upload timed
        out (a 4 MiB tensor, a first call, waited 90 s for DEADLINE_EXCEEDED).
        """
        if self._unacked < _STREAM_ACK:
            return
        if not self._streaming:
            if self._left > 0:
                self._acknowledge()
        elif not self._holding_back():
            self._acknowledge()  # else once the stream's handler takes or answers messages

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
            if self._stopping == SHUT:  # begun after the server's stop cut it: not served
                unmap_off_loop(message)
                return
            (self._queue or self._start_stream()).put_nowait((self._compressed, message))
            self._backlog += memoryview(message).nbytes
            if 0 <= self._cut <= self._parsed:  # the last message begun before the cut
                self._shut()
            return
        self._messages.append((self._compressed, message, lease, mapped))
        self._conn.keep_window(self._stream)
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
            if self._unparsed is None:  # else once what is kept is read (``_drain``)
                (self._queue or self._start_stream()).put_nowait(None)
        else:
            self._run_when_whole()

    def _start_stream(self) -> asyncio.Queue[tuple[bool, Any] | None]:
        """A stream's first message (or its end) came: its queue, and its handler's task."""
        queue: asyncio.Queue[tuple[bool, Any] | None] = asyncio.Queue()
        self._queue = queue
        self._task = self._conn.run(self._run_stream())
        return queue

    def shutting_down(self) -> None:
        """The server stops, and its client has had the first GOAWAY (its connection's
        last went out: ``front.grpc.listener``): the stream is cut where its bytes have
        come to. It serves the messages begun before, whole or in part (a message still
        uploading is served once in, as a unary call's is; messages kept unparsed too:
        the client sent them before it could have heard of the stop), and ends once they
        are answered (UNAVAILABLE while its client has not ended its side: what it sends
        later is not served). A stream that received nothing ends now, UNAVAILABLE too.

        Until 2026-11-30 the cut came at the stop's start, before the first GOAWAY: a
        message the client sent in its round trip was not served, where a unary call
        opened then was; and a stream that received nothing ended OK, as if its client
        had been answered in full."""
        if not self._streaming or self._done or self._stopping != RUNNING:
            return
        unparsed = self._unparsed
        kept = 0 if unparsed is None else len(unparsed) - self._unparsed_at
        self._cut = self._parsed + kept
        if kept or self._prefix or self._left >= 0:
            return  # shut at the end of the message begun last (``_message_done``)
        if self._task is None:
            self._end(_UNAVAILABLE, SHUTDOWN_STREAM, False)
        else:
            self._shut()

    def _shut(self) -> None:
        """No later message of the stream is served: its handler ends after those queued."""
        self._stopping = SHUT
        (self._queue or self._start_stream()).put_nowait(SHUT_ITEM)

    def _run_when_whole(self) -> None:
        """Run a unary call whose client is done sending, once its message is whole."""
        if self._waiting is not None:
            return  # ``_leased`` comes back here
        if self._left >= 0 or self._prefix:
            self._fail(_INTERNAL, "the request ended inside a message")
        elif not self._messages:
            self._fail(_INTERNAL, "no request message for a unary call")
        else:
            self._task = self._conn.run(self._run_unary())
