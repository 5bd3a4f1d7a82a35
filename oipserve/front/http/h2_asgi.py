"""OIP REST over HTTP/2: a stream whose request is not gRPC is served by the REST ASGI app.

Knative gives a serverless predictor one port, and a port named ``h2c`` makes its
queue-proxy speak HTTP/2 with prior knowledge for every request: REST calls arrive as
HTTP/2 streams beside gRPC calls (issue #39). ``front.grpc.call.Call`` reads a stream's
header block as it does for every call; when the request is not gRPC (its content-type
is not ``application/grpc*``) it hands the stream to ``RestOverH2.serve``, which puts a
``RestStream`` in the call's place. The app is the same one HTTP/1.1 serves (Falcon's,
behind ``header_rules.HeadChecked``), handed in at start-up (``front.grpc.listener``):
this module never imports ``front.rest``.

What the app gets, and what holds on such a stream:

- the scope HTTP/1.1 gives (``http_version`` ``"2"``), built from the pseudo-headers;
  ``:authority`` becomes ``host`` when the request has none. A malformed request (RFC
  9113, 8.1.1: an upper-case or non-token name, NUL/CR/LF in a value, connection-specific
  fields, misplaced or missing pseudo-headers) is a stream error, RST_STREAM
  PROTOCOL_ERROR, as for a gRPC call; a value with another control byte or with a space
  or tab at either end (``header_rules.PaddedValue``), or a path that is not printable
  ASCII, is a 400; more than ``--max-header-fields`` fields or
  ``--max-header-bytes`` bytes a 431, as over HTTP/1.1 (all with ``{"error": ...}``;
  ``h2_head`` reads the head).
- the body: DATA as it comes, each chunk's window given back once the app has taken it,
  so a stream holds at most its window (4 MiB) of body the app has not read, and a
  connection its window (16 MiB), as for gRPC. ``RECEIVE_INTO`` receives a body of
  declared length straight into the app's buffer (a shared-memory lease), as over
  HTTP/1.1; a declared length past ``--max-request-bytes`` is answered 413 by the app
  before any byte is read; a body of no declared length is refused once it passes the
  limit (``BODY_REFUSED``: the app answers 413 and the rest is never taken).
- ``--body-timeout`` and ``--send-timeout`` (plus a second per ``--min-transfer-rate``
  bytes) bound a body that does not come and a response the client does not take: past
  either the stream is reset (CANCEL) and the app's task cancelled, which gives back what
  it holds (HTTP/1.1 drops the connection; here the other streams go on).
- the response: HEADERS (``:status`` and the app's headers, less the connection-specific
  ones, RFC 9113 8.2.2), then DATA as the windows allow; a response that ends before the
  client's request did is followed by RST_STREAM NO_ERROR (8.1).
- a stream the client resets, or a connection that goes, cancels the app's task and
  runs the ``ON_DISCONNECT`` callbacks (a queued inference leaves its batcher).

PERF: nothing here runs for a gRPC call: ``Call`` decides once, from the header block it
reads anyway. A REST stream costs one task, its scope and one header block encoded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from oipserve.front.grpc.h2.connection import Connection
from oipserve.front.grpc.h2.frames import DEFAULT_MAX_FRAME, ErrorCode
from oipserve.front.grpc.h2.headers import Headers
from oipserve.front.header_rules import App, HeadChecked, MalformedRequest
from oipserve.front.http.extensions import (
    BODY_REFUSED,
    ON_DISCONNECT,
    RECEIVE_INTO,
    TOO_LARGE,
    ClientDisconnected,
)
from oipserve.front.http.h2_connection import Http2Connection
from oipserve.front.http.h2_head import (
    JSON,
    Refusal,
    request_scope,
    response_block,
)
from oipserve.front.http.limits import ConnectionLimits

__all__ = ["RestOverH2", "RestStream"]

log = logging.getLogger("oipserve.http")

#: A response is handed to the connection in steps of this, each counted as taken by
#: the client once sent (``--send-timeout``'s progress), as a gRPC reply is.
_SEND_STEP = 256 * 1024
#: A body taken after the client ended its request is acknowledged only from this size:
#: a small one's window comes back to the connection when the stream ends (PERF: no
#: WINDOW_UPDATE for a tiny request), a large one's at once, so that bodies waiting on their
#: answers do not hold the connection's window (16 MiB) from its other streams.
_ACK_WHEN_ENDED = 64 * 1024


class RestOverH2:
    """The REST app, for the HTTP/2 streams of one listener whose requests are not gRPC."""

    def __init__(self, app: App, limits: ConnectionLimits, max_body: int) -> None:
        self.app: App = HeadChecked(app)
        self.limits = limits
        #: ``--max-request-bytes``: a body past it is refused.
        self.max_body = max_body

    def serve(
        self, conn: Connection, stream: int, headers: Headers, end_stream: bool, send_window: int
    ) -> None:
        """Serve ``stream`` (its call made by the connection, its headers just read) as a
        REST request: a ``RestStream`` takes the call's place on the connection."""
        if not isinstance(conn, Http2Connection):
            raise TypeError("REST over HTTP/2 needs the listener's Http2Connection")
        rest = RestStream(conn, stream, self)
        rest.send_window = send_window
        conn.streams[stream] = rest
        rest.headers_received(headers, end_stream)

    def scope(self, conn: Http2Connection, headers: Headers) -> dict[str, Any]:
        """The ASGI scope of a request's header block (``h2_head.request_scope``)."""
        return request_scope(headers, self.limits, conn.addresses())


class RestStream:
    """One REST request on one HTTP/2 stream: the connection feeds it, the app answers."""

    __slots__ = ("send_window", "_conn", "_stream", "_server", "_scope", "_chunks", "_held",
                 "_received", "_ended", "_told_end", "_gone", "_refused", "_wake", "_sink",
                 "_filled", "_task", "_status", "_head", "_started", "_complete", "_no_body",
                 "_watchers", "_body_timer", "_body_since", "_body_base", "_send_timer",
                 "_send_since", "_sent")  # fmt: skip

    def __init__(self, conn: Http2Connection, stream: int, server: RestOverH2) -> None:
        self.send_window = 0
        self._conn = conn
        self._stream = stream
        self._server = server
        self._scope: dict[str, Any] = {}
        #: Body received and not yet taken by the app (its window not given back).
        self._chunks: deque[bytes] = deque()
        self._held = 0
        #: Body bytes received so far (what the limit counts).
        self._received = 0
        #: The client ended its request (END_STREAM).
        self._ended = False
        #: The app was told the body ended (``more_body`` False).
        self._told_end = False
        #: The stream is over for the app: reset, the connection gone, or answered.
        self._gone = False
        #: The body passed ``max_body`` without a declared length: the rest is dropped.
        self._refused = False
        #: Set when the app's ``receive`` has something new to look at.
        self._wake: asyncio.Event | None = None
        #: ``RECEIVE_INTO``'s target while it waits, and the bytes in it so far.
        self._sink: memoryview | None = None
        self._filled = 0
        self._task: asyncio.Task[None] | None = None
        #: The response: its status and headers (``http.response.start``), whether its
        #: header block went out, whether its last byte did.
        self._status = 0
        self._head: list[tuple[bytes, bytes]] = []
        self._started = False
        self._complete = False
        #: A HEAD request: the response's body is not sent.
        self._no_body = False
        self._watchers: list[Callable[[], None]] = []
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_since = 0.0
        self._body_base = 0
        self._send_timer: asyncio.TimerHandle | None = None
        self._send_since = 0.0
        self._sent = 0

    # ---- from the connection ----------------------------------------------------------

    def headers_received(self, headers: Headers, end_stream: bool) -> None:
        self._ended = end_stream
        app: App
        try:
            self._scope = self._server.scope(self._conn, headers)
            app = self._server.app
        except MalformedRequest as exc:
            log.debug("HTTP/2 stream %d reset: %s", self._stream, exc)
            self._gone = True
            self._conn.reset_stream(self._stream, ErrorCode.PROTOCOL_ERROR)
            return
        except Refusal as refusal:
            self._scope = {"type": "http", "method": "GET", "headers": []}
            app = _answer(refusal.status, refusal.message)
        scope = self._scope
        self._no_body = scope["method"] == "HEAD"
        scope["extensions"] = {RECEIVE_INTO: self._receive_into, ON_DISCONNECT: self._on_disconnect}
        if not end_stream:
            self._body_timer_start()
        self._task = self._conn.run(self._run(app))

    def data_received(self, data: memoryview) -> None:
        if self._gone or self._refused:
            return  # dropped; its window comes back when the stream ends
        size = len(data)
        self._received += size
        limit = self._server.max_body
        if self._received > limit:
            self._refuse_body(limit)
            return
        sink = self._sink
        if sink is not None and self._filled + size <= len(sink):
            sink[self._filled : self._filled + size] = data
            self._filled += size
            self._conn.acknowledge(self._stream, size)
            return
        self._chunks.append(bytes(data))
        self._held += size
        if self._wake is not None:
            self._wake.set()

    def end_received(self) -> None:
        self._ended = True
        self._body_timer_stop()
        if self._wake is not None:
            self._wake.set()

    def reset(self) -> None:
        """The client reset the stream, or the connection went: the app's task is
        cancelled, and the ``ON_DISCONNECT`` callbacks run."""
        self._ended = True
        if self._gone:
            return
        self._gone = True
        self._stop_timers()
        self._chunks.clear()
        if self._wake is not None:
            self._wake.set()
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        watchers, self._watchers = self._watchers, []
        for callback in watchers:
            callback()

    def give_up(self, message: str) -> None:
        """The server's stop ran out of time: a 503 with ``{"error": message}`` if nothing
        was sent yet (the stream was reset, unanswered; found by fuzzing), else the stream
        is reset; the app's task is cancelled."""
        if not self._gone:
            if self._started:
                self._end(ErrorCode.CANCEL)
            else:
                self._started = self._complete = True
                body, fields = _error(message)
                if self._conn.fits(self, len(body)):
                    self._conn.send_headers(self._stream, response_block(503, fields))
                    self._conn.end_data(self, self._stream, body)
                    self._finished()
                else:  # no window left for its body: a reset, not a head without its body
                    self._end(ErrorCode.CANCEL)  # (it was that head: found by fuzzing)
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    # ---- the app's side ---------------------------------------------------------------

    async def _run(self, app: App) -> None:
        try:
            await app(self._scope, self._receive, self._send)
        except asyncio.CancelledError:
            self._cancelled()
            return
        except Exception:
            log.exception("the REST app failed on an HTTP/2 stream")
            await self._failed("internal server error")
            return
        finally:
            self._scope.pop("extensions", None)  # each holds this stream: no cycle left
        if not self._complete and not self._gone:
            await self._failed("the application sent no complete response")

    async def _failed(self, message: str) -> None:
        """The app failed: 500 if nothing was sent yet, else the stream is reset."""
        if self._gone:
            return
        if self._started:
            self._end(ErrorCode.INTERNAL_ERROR)
            return
        self._status, self._head = 0, []
        try:
            await _answer(500, message)(self._scope, self._receive, self._send)
        except (asyncio.CancelledError, ConnectionError):
            self._cancelled()

    def _cancelled(self) -> None:
        """The task ended by cancellation (a reset, a timeout): nothing more goes out."""
        if not self._gone:
            self._end(ErrorCode.CANCEL)

    async def _receive(self) -> dict[str, Any]:
        while True:
            if self._gone:
                return {"type": "http.disconnect"}
            if self._chunks:
                return self._take()
            if self._ended or self._refused:
                if not self._told_end:
                    self._told_end = True
                    return {"type": "http.request", "body": b"", "more_body": False}
                await self._wait_until(lambda: self._gone)
                continue
            await self._wait_until(
                lambda: bool(self._chunks) or self._ended or self._refused or self._gone
            )

    def _take(self) -> dict[str, Any]:
        """What came of the body, in one event; its window is given back."""
        chunks = self._chunks
        body = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._held = 0
        if not self._ended or len(body) >= _ACK_WHEN_ENDED:
            self._conn.acknowledge(self._stream, len(body))
        more = not (self._ended or self._refused)
        self._told_end = not more
        return {"type": "http.request", "body": body, "more_body": more}

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        wake = self._wake
        if wake is None:
            wake = self._wake = asyncio.Event()
        while not ready():
            wake.clear()
            await wake.wait()

    async def _receive_into(self, target: memoryview) -> int:
        """``RECEIVE_INTO``: the rest of the body straight into ``target`` (what came before
        it was asked for is copied); returns its size. ClientDisconnected if the stream
        ends first, or the body is longer than ``target``."""
        filled = 0
        chunks = self._chunks
        while chunks:
            chunk = chunks.popleft()
            if filled + len(chunk) > len(target):
                raise ClientDisconnected("the request body is longer than its Content-Length")
            target[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            self._conn.acknowledge(self._stream, len(chunk))
        self._held = 0
        self._sink, self._filled = target, filled
        try:
            await self._wait_until(
                lambda: self._ended or self._refused or self._gone or bool(self._chunks)
            )
            filled = self._filled
        finally:
            self._sink = None
        if self._gone or self._chunks:
            raise ClientDisconnected("the client went away before its request body was complete")
        self._told_end = True
        return filled

    def _on_disconnect(self, callback: Callable[[], None]) -> None:
        if self._gone and not self._complete:
            callback()
        elif not self._complete:
            self._watchers.append(callback)

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._status:
                raise RuntimeError("http.response.start sent twice")
            self._status = int(message["status"])
            self._head = list(message.get("headers") or ())
            return
        if kind != "http.response.body" or not self._status or self._complete:
            raise RuntimeError(f"ASGI message {kind!r} out of order")
        if self._gone:
            return  # as uvicorn: a response to a client gone is dropped
        body = message.get("body") or b""
        more = bool(message.get("more_body", False))
        if self._no_body:
            body = b""
        conn, stream = self._conn, self._stream
        if not more:
            self._complete = True
        if not self._started:
            self._started = True
            block = response_block(self._status, self._head)
            if not more and not body:
                conn.send_headers(stream, block, end_stream=True)
                self._finished()
                return
            conn.send_headers(stream, block)
        try:
            await self._data(body, last=not more)
        except ConnectionError:
            return  # reset meanwhile (``reset``, ``_drop``): nothing more goes out
        if not more:
            self._finished()

    async def _data(self, body: bytes | memoryview, last: bool) -> None:
        """Body bytes as the windows allow; the last ones end the stream (END_STREAM on
        their DATA frame, or on an empty one after them)."""
        conn, stream = self._conn, self._stream
        view = memoryview(body).cast("B")
        size = len(view)
        if size <= DEFAULT_MAX_FRAME:  # fits any peer's frame: one frame, copied if a view
            small = body if isinstance(body, bytes) else bytes(view)
            if last and conn.end_data(self, stream, small):
                return
            if size and conn.send_small(self, stream, small):
                size = 0
        if size:
            await self._send_steps(view)
        if last:
            conn.end_data(self, stream)

    async def _send_steps(self, view: memoryview) -> None:
        """A body that cannot leave at once, in steps; bounded in time by
        ``--send-timeout`` plus a second per ``--min-transfer-rate`` bytes taken."""
        loop = asyncio.get_running_loop()
        limits = self._server.limits
        self._send_since, self._sent = loop.time(), 0
        self._send_timer = loop.call_later(limits.send_timeout, self._send_expired)
        try:
            for pos in range(0, len(view), _SEND_STEP):
                await self._conn.send_data(self, self._stream, view[pos : pos + _SEND_STEP])
                self._sent += min(_SEND_STEP, len(view) - pos)
        finally:
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

    def _send_expired(self) -> None:
        """The client took too little of the response in time: the stream is reset."""
        self._send_timer = None
        if self._gone:
            return
        limits, loop = self._server.limits, asyncio.get_running_loop()
        until = self._send_since + limits.send_timeout + self._sent / limits.min_rate
        if loop.time() < until:
            self._send_timer = loop.call_later(until - loop.time(), self._send_expired)
            return
        log.info("HTTP/2 stream %d reset: its response was not read in time", self._stream)
        self._drop()

    # ---- ending -----------------------------------------------------------------------

    def _finished(self) -> None:
        """The response went out whole: a client still sending is told to stop (RFC 9113,
        8.1: RST_STREAM NO_ERROR)."""
        self._gone = True
        self._stop_timers()
        self._watchers.clear()
        if self._wake is not None:
            self._wake.set()  # an app still waiting on ``receive`` hears http.disconnect
        if not self._ended or self._refused:
            self._conn.reset_stream(self._stream, ErrorCode.NO_ERROR)
        self._chunks.clear()

    def _end(self, code: ErrorCode) -> None:
        """End the stream from this side with RST_STREAM ``code``."""
        self._gone = True
        self._stop_timers()
        self._watchers.clear()
        self._chunks.clear()
        if self._wake is not None:
            self._wake.set()
        self._conn.reset_stream(self._stream, code)

    def _drop(self) -> None:
        """A limit passed: the stream is reset (CANCEL) and the app's task cancelled."""
        watchers, self._watchers = self._watchers, []
        self._end(ErrorCode.CANCEL)
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        for callback in watchers:
            callback()

    def _refuse_body(self, limit: int) -> None:
        """A body of no declared length passed the limit: the app's reading ends there and
        finds ``BODY_REFUSED`` (its 413); what the client sends after is dropped."""
        self._refused = True
        self._scope[BODY_REFUSED] = TOO_LARGE.format(limit)
        self._body_timer_stop()
        if self._wake is not None:
            self._wake.set()

    # ---- the body's time --------------------------------------------------------------

    def _body_timer_start(self) -> None:
        loop = asyncio.get_running_loop()
        self._body_since, self._body_base = loop.time(), 0
        self._body_timer = loop.call_later(self._server.limits.body_timeout, self._body_expired)

    def _body_expired(self) -> None:
        """``--body-timeout`` plus a second per ``--min-transfer-rate`` bytes received
        since the app last took the body (a body it leaves unread is not the client's
        delay)."""
        self._body_timer = None
        if self._gone or self._ended or self._refused:
            return
        limits, loop = self._server.limits, asyncio.get_running_loop()
        now = loop.time()
        if self._held > 0 or self._conn.abandoned.holding:  # not read: not the client's delay
            self._body_since, self._body_base = now, self._received
        until = self._body_since + limits.body_timeout
        until += (self._received - self._body_base) / limits.min_rate
        if now < until:
            self._body_timer = loop.call_later(until - now, self._body_expired)
            return
        log.info(
            "HTTP/2 stream %d reset: its request body was not complete in time (%d bytes came)",
            self._stream,
            self._received,
        )
        self._drop()

    def _body_timer_stop(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _stop_timers(self) -> None:
        self._body_timer_stop()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None


def _answer(status: int, message: str) -> App:
    """An ASGI app answering every request with ``status`` and ``{"error": message}``."""
    body, head = _error(message)

    async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return answer


def _error(message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """``{"error": message}`` as a response body, and the header fields it goes with."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    return body, [(b"content-type", JSON), (b"content-length", b"%d" % len(body))]
