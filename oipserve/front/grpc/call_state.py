"""What one gRPC call holds, and how it ends: the base of ``front.grpc.call.Call``.

``Call`` is one class built in layers, one job a module, each a subclass of the one below
it, so that a reader of one job reads one module; no layer wraps another (a call does
the work it did as one class, and every layer adds no slot of its own): ``call`` (the
headers and the deadline) over ``call_receive`` (the request's messages read) over
``call_run`` (the method run) over ``call_send`` (the reply written) over this module:
the call's state (``__slots__``, all set in ``__init__``), the stream's window given back
as its handler keeps up, and every way a call ends: the status or trailers that answer
it, a reset from either side, and what it gives back (its message's lease or memory, its
task and queued messages).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

import grpc

from oipserve.front.grpc.call_table import CallTable
from oipserve.front.grpc.h2.connection import Connection
from oipserve.front.grpc.h2.frames import ErrorCode, trailers, trailers_only
from oipserve.front.grpc.h2.receive_windows import STREAM_WINDOW
from oipserve.front.grpc.rpcs import Method
from oipserve.front.grpc.status import log_failure, status_of
from oipserve.runtime.off_loop import unmap_off_loop
from oipserve.wire.shm import Lease

if TYPE_CHECKING:
    from oipserve.front.grpc.h2.headers import Headers

#: A stream's messages read ahead of its handler: past them its window stops being given
#: back, and what comes is kept as it came, unparsed (``call_receive``), until the handler
#: takes some.
QUEUED: Final = 64
#: A stream's bytes received and not yet answered (queued, or running) before its window
#: stops being given back: with the window the client may still fill, a stream holds at
#: most two windows of requests, whatever its messages' count (64 messages of 1 MiB each
#: queued and 64 more running held ~150 MiB a stream whose client did not read).
_BACKLOG: Final = STREAM_WINDOW

#: A stream's states at the server's stop (``CallState._stopping``).
RUNNING, SHUT = 0, 1
#: What a stream's queue holds after the last message it serves at the server's stop.
SHUT_ITEM: Final[tuple[bool, Any]] = (False, None)

_DEADLINE: Final = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
_UNAVAILABLE: Final = grpc.StatusCode.UNAVAILABLE.value[0]


class CallState:
    """A call's state, its stream's window, and its end (the layers above run it)."""

    __slots__ = ("send_window", "_conn", "_stream", "_table", "_name", "_method", "_encoding",
                 "_metadata", "_timer", "_upload", "_deadline_at", "_task",
                 "_done", "_sent_head", "_ended", "_expired",
                 "_prefix", "_left", "_compressed", "_parts", "_memory", "_mapped", "_filled",
                 "_lease", "_waiting", "_unacked", "_messages", "_streaming", "_queue",
                 "_backlog", "_stopping", "_parsed", "_cut",
                 "_unparsed", "_unparsed_at")  # fmt: skip

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
        #: The loop's time at the call's deadline (``grpc-timeout``), if it has one.
        self._deadline_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        #: Answered (or reset): nothing more is read or written.
        self._done = False
        #: The response's headers went out (``_send``): a status now goes as trailers.
        self._sent_head = False
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
        #: A stream's bytes received whole and not yet answered: ``_holding_back``.
        self._backlog = 0
        #: A stream at the server's stop: ``RUNNING``, or ``SHUT`` once no later message is
        #: served (``call_receive.shutting_down``).
        self._stopping = RUNNING
        #: A stream's bytes parsed so far (where the next message's prefix starts, between
        #: messages), and the bytes it had received when the server's stop cut it (-1:
        #: none yet): a message begun before the cut is served, one begun after is not.
        self._parsed = 0
        self._cut = -1
        #: A stream's bytes received while its handler is ``QUEUED`` messages behind, kept
        #: as they came (their memory is what the stream's window bounds, not a message
        #: count: ``call_receive``), and where in them the parse goes on; None: none.
        self._unparsed: bytearray | None = None
        self._unparsed_at = 0

    # What the connection drives (``h2.connection_state.Stream``), defined by the layers
    #   above: declared here so that each layer may hand ``self`` to the connection. (Not
    #   under TYPE_CHECKING: mypyc compiles no statement but a definition in a class body.)

    def headers_received(self, headers: Headers, end_stream: bool) -> None:
        raise NotImplementedError("call.Call")

    def data_received(self, data: memoryview) -> None:
        raise NotImplementedError("call_receive.CallReceiver")

    def end_received(self) -> None:
        raise NotImplementedError("call_receive.CallReceiver")

    def _drain(self) -> None:
        raise NotImplementedError("call_receive.CallReceiver")

    # ---- the stream's window ----------------------------------------------------------

    def _acknowledge(self) -> None:
        self._conn.acknowledge(self._stream, self._unacked)
        self._unacked = 0

    def _holding_back(self) -> bool:
        """A stream's window is not given back while its handler is this far behind: too
        many messages queued (and so bytes kept unparsed), or too many bytes received and
        not yet answered."""
        queue = self._queue
        return (
            self._backlog >= _BACKLOG
            or self._unparsed is not None
            or (queue is not None and queue.qsize() >= QUEUED)
        )

    def _answered(self, size: int) -> None:
        """A stream's message of ``size`` bytes was answered (its answer may wait for
        earlier ones'): its bytes leave the backlog, and the window held back for them is
        given back."""
        self._backlog -= size
        if self._unacked and not self._holding_back():
            self._acknowledge()

    # ---- ending ---------------------------------------------------------------------

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
            if item is not None and item[1] is not None:
                unmap_off_loop(item[1])

    def _end(self, code: int, message: str, started: bool) -> None:
        self._finish(trailers(code, message) if started else trailers_only(code, message))

    def _fail(self, code: int, message: str) -> None:
        """Answer with a status alone (nothing was sent yet)."""
        self._finish(trailers_only(code, message))

    def _fail_with(self, exc: BaseException) -> None:
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

    def give_up(self, message: str) -> None:
        """The server's stop ran out of time (``H2Server.stop``): UNAVAILABLE with
        ``message``, after what was sent (it only reset the stream, so clients saw the
        connection close; found by fuzzing), then the call's work stops as at a reset."""
        if not self._done:
            self._end(_UNAVAILABLE, message, self._sent_head)
        self.reset()

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
        """Give back what a message being read holds (a finished call holds nothing)."""
        self._waiting = None
        self._unparsed = None
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
