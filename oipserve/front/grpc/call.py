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

A call is one object, built in layers, one job a module, each a class over the one below
(no layer wraps another: a call does what it did as one class): this module reads the
headers and keeps the deadline; ``call_receive`` reads the messages (``LEASED``,
``MAPPED``; a stream's ``QUEUED`` ahead of its handler); ``call_run`` runs the method,
unary or stream; ``call_send`` writes the reply under the windows and the send timeout;
``call_state`` holds the call's state, gives the stream's window back, and ends the call.

Failures leave as a status (``status.status_of``, the one mapping); a call whose
deadline passes is cancelled (a queued request leaves its batcher) and answered
DEADLINE_EXCEEDED; a call the client resets is cancelled and not answered. However a call
ends (either side's RST_STREAM, the connection gone, its deadline, a refusal, a message
that does not arrive within the REST body's timeout) it gives back all it holds: its
message's lease or memory, its task and queued messages.
"""

from __future__ import annotations

import asyncio
from typing import Final

import grpc

from oipserve.front.grpc.call_receive import CallReceiver
from oipserve.front.grpc.h2.frames import ErrorCode
from oipserve.front.grpc.h2.headers import Headers
from oipserve.front.grpc.inflate import ENCODINGS
from oipserve.front.grpc.rpcs import STREAM_RPC
from oipserve.front.header_rules import (
    MalformedRequest,
    PaddedValue,
    grpc_timeout,
    read_call_head,
)
from oipserve.front.http.h2_head import is_grpc

_DEADLINE: Final = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
_INTERNAL: Final = grpc.StatusCode.INTERNAL.value[0]
_INVALID_ARGUMENT: Final = grpc.StatusCode.INVALID_ARGUMENT.value[0]
_UNIMPLEMENTED: Final = grpc.StatusCode.UNIMPLEMENTED.value[0]


#: ``grpc-timeout`` values read before and the seconds each gives (None: no deadline): a
#: client sends the same few call after call (grpc's HPACK encoder indexes the value
#: it sent last while the deadline it stands for is close enough), so a call's is a
#: lookup: the regular expression's parse was ~1.7 % of a tiny call's front CPU (perf).
_TIMEOUTS: Final[dict[str, float | None]] = {}
_CACHED_TIMEOUTS: Final = 64
#: ``_TIMEOUTS`` has no such value yet.
_UNREAD: Final = -1.0


class Call(CallReceiver):
    """One call: the connection feeds it frames' contents; it answers on the stream."""

    __slots__ = ()

    # ---- headers --------------------------------------------------------------------

    def headers_received(self, headers: Headers, end_stream: bool) -> None:
        try:
            head = read_call_head(headers)
        except MalformedRequest as exc:
            if self._table.rest is not None and not is_grpc(headers):
                self._to_rest(headers, end_stream)  # a GET, say: REST judges it (h2_asgi)
                return
            if isinstance(exc, PaddedValue):  # answered: see PaddedValue
                self._fail(_INVALID_ARGUMENT, str(exc))
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
        seconds = _TIMEOUTS.get(text, _UNREAD)
        if seconds == _UNREAD:
            try:
                seconds = grpc_timeout(text)
            except ValueError as exc:
                self._fail(_INTERNAL, str(exc))  # as grpc-go answers it
                return
            if len(_TIMEOUTS) >= _CACHED_TIMEOUTS:
                _TIMEOUTS.clear()
            _TIMEOUTS[text] = seconds
        if seconds is None:
            return  # longer than any deadline is kept: none (``header_rules``)
        loop = self._conn.loop
        self._deadline_at = at = loop.time() + seconds
        self._timer = loop.call_at(at, self._expire)

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
