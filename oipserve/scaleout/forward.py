"""A secondary front's path to the primary front, for every request it does not answer itself.

With ``--http-workers N`` the N front processes share the HTTP port (SO_REUSEPORT), so the
kernel hands a client's connection to any of them. A secondary front answers some requests
itself; everything else belongs to the primary front, whose uvicorn also listens on a private
Unix socket. A ``Forwarder`` is the ASGI application that sends such a request there,
unchanged, and streams the answer back, so that a client cannot tell which front took its
connection.

How, and why so:

* HTTP/1.1 framing, both ways, is h11's: no hand-written parsing to get wrong.
* Bodies are streamed both ways, never held whole (tensors can be large). The request body
  is sent by a task of its own while the answer is read: the primary may answer before it
  has read the body (a 404 for an unknown model, a 413), or stream its answer while it
  reads, and sending the whole body first could then stall both sides.
* Connections are kept alive and pooled, a few, briefly: uvicorn closes an idle connection
  after 5 s by default, and one closed while we send on it costs a retry or a 503.
* Until the answer starts, a failure is answered with a 503 (JSON, ``retry-after``); after,
  the client's connection is cut, since a started answer cannot be taken back.
* A client that leaves cuts the request to the primary short (its connection is closed), so
  the primary stops working on it and the connection never goes back to the pool.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import quote

import h11

from oipserve.front.header_rules import HOP_BY_HOP, NOT_FORWARDED

__all__ = ["CONNECT_TIMEOUT", "Forwarder"]

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

#: Added by this front's own server to every answer (uvicorn's ``date`` and ``server``):
#: the primary's copies would make the client see each twice.
_ADDED_HERE = HOP_BY_HOP | {b"date", b"server"}

#: Seconds to connect to the primary. Reads have no limit: inference may take long, and the
#: primary keeps its own deadlines.
CONNECT_TIMEOUT = 5.0

#: Bytes read from the primary at a time (also the stream's buffer limit).
_READ_SIZE = 256 * 1024


class Forwarder:
    """Forwards ASGI HTTP requests, unchanged, to another HTTP/1.1 server on a Unix socket.

    ``address`` is a file-system path or a Linux abstract name (starting with ``"\\0"``).
    At most ``idle_limit`` idle connections are kept, none for longer than ``idle_seconds``.
    One instance serves one event loop.
    """

    def __init__(self, address: str, idle_limit: int = 16, idle_seconds: float = 2.0) -> None:
        self._address = address
        self._idle_limit = idle_limit
        self._idle_seconds = idle_seconds
        #: Idle connections, the most recently used last (taken first: the least likely to
        #: have been closed by the other side).
        self._idle: deque[_Upstream] = deque()
        self._closed = False

    def close(self) -> None:
        """Close the idle connections; connections in use are closed when their requests end.

        Requests that come later are still forwarded, on connections of their own.
        """
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        """Forward one request (``scope["type"] == "http"``) and relay its answer."""
        if scope["type"] != "http":
            raise ValueError(f"a Forwarder forwards HTTP requests, not {scope['type']!r}")
        # The first body message decides the framing (see _request_head). For a request
        # without a body it is at hand at once.
        first = await receive()
        if first["type"] == "http.disconnect":
            return
        try:
            request = _request_head(scope, first)
        except h11.LocalProtocolError as exc:
            await _answer_json(send, 400, f"the request cannot be forwarded: {exc}")
            return
        upstream = self._take_idle()
        while True:
            if upstream is None:
                try:
                    upstream = await self._connect()
                except OSError as exc:  # TimeoutError included
                    reason = f"cannot connect to {_shown(self._address)}: {_describe(exc)}"
                    await _answer_unavailable(send, reason)
                    return
            exchange = _Exchange(upstream, request, first, receive, send)
            try:
                await exchange.run()
            except _NoAnswer as failure:
                upstream.abort()
                if upstream.reused and failure.retryable:
                    # Most likely closed by the primary as idle just as the request left:
                    # once more, on a fresh connection (which is never retried).
                    upstream = None
                    continue
                await _answer_unavailable(send, failure.reason)
                return
            except _ClientGone:
                upstream.abort()
                return
            except BaseException:
                upstream.abort()
                raise
            self._release(upstream)
            return

    async def _connect(self) -> _Upstream:
        """A new connection to the primary (OSError if none within CONNECT_TIMEOUT).

        The socket is made and connected here, not by ``loop.create_unix_connection``: an
        abstract name (``"\\0..."``) is then a plain ``connect`` on every event loop. Nor by
        ``loop.sock_connect``: when the primary's backlog is full, a non-blocking Unix
        ``connect`` fails with EAGAIN and is not pending, yet the socket turns writable, so
        ``sock_connect`` reports it connected (and the first write fails). It is tried again
        instead, as a blocking ``connect`` would wait.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            async with asyncio.timeout(CONNECT_TIMEOUT):
                pause = 0.001
                while True:
                    try:
                        sock.connect(self._address)  # a Unix connect is done or refused at once
                        break
                    except (BlockingIOError, InterruptedError):  # the backlog is full
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 0.05)
                reader, writer = await asyncio.open_unix_connection(sock=sock, limit=_READ_SIZE)
        except BaseException:
            sock.close()
            raise
        return _Upstream(reader, writer)

    def _take_idle(self) -> _Upstream | None:
        """The most recently used idle connection still fit for a request, if any."""
        now = time.monotonic()
        while self._idle:
            upstream = self._idle.pop()
            if upstream.fit(now, self._idle_seconds):
                upstream.reused = True
                return upstream
            upstream.close()
        return None

    def _release(self, upstream: _Upstream) -> None:
        """Pool ``upstream`` after a complete exchange if HTTP/1.1 lets it be reused."""
        http = upstream.http
        if self._closed or not (http.our_state is h11.DONE and http.their_state is h11.DONE):
            upstream.close()
            return
        http.start_next_cycle()
        upstream.idle_since = now = time.monotonic()
        upstream.received = 0
        self._idle.append(upstream)
        while self._idle and (
            len(self._idle) > self._idle_limit
            or now - self._idle[0].idle_since >= self._idle_seconds
        ):
            self._idle.popleft().close()


class _Upstream:
    """One HTTP/1.1 connection to the primary, with h11's state of it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.http = h11.Connection(h11.CLIENT)
        #: Taken from the pool: it may have been closed by the primary meanwhile.
        self.reused = False
        self.idle_since = 0.0
        #: Bytes received in this request's exchange (none: the answer never began).
        self.received = 0

    def fit(self, now: float, idle_seconds: float) -> bool:
        """Whether this idle connection may carry a request: not too old, not seen closed.

        A close the event loop has already seen is caught here; one still in flight is
        caught by the retry in ``Forwarder.__call__``.
        """
        return (
            now - self.idle_since < idle_seconds
            and not self.reader.at_eof()
            and self.reader.exception() is None
            and not self.writer.is_closing()
        )

    def write(self, event: h11.Event) -> None:
        """Frame ``event`` (h11 passes a body's bytes through) and hand it to the transport.

        On a closed connection it raises ConnectionResetError, as on every event loop
        (asyncio would drop the bytes, uvloop raise RuntimeError).
        """
        if self.writer.is_closing():
            raise ConnectionResetError("the connection to the primary front is closed")
        self.writer.writelines(self.http.send_with_data_passthrough(event) or ())

    async def next_event(self) -> h11.Event:
        """The primary's next HTTP event, reading as needed (h11 raises if it closes early)."""
        while True:
            event = self.http.next_event()
            if isinstance(event, h11.Event):
                return event
            if event is not h11.NEED_DATA:  # PAUSED: more after a complete answer
                raise h11.RemoteProtocolError("the primary sent more than one answer")
            await self.receive_more()

    async def receive_more(self) -> None:
        """Read once from the primary into h11 (an empty read tells it of the close)."""
        data = await self.reader.read(_READ_SIZE)
        self.received += len(data)
        self.http.receive_data(data)

    def close(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        """Close at once, dropping unsent bytes: the exchange on it is not complete."""
        self.writer.transport.abort()


class _NoAnswer(Exception):
    """The primary failed before its answer began: the client can still be told (503)."""

    def __init__(self, reason: str, retryable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        #: Nothing came back and the request can be sent again whole.
        self.retryable = retryable


class _ClientGone(Exception):
    """The client disconnected, so there is no one left to answer."""


class _Exchange:
    """One request and its answer over one connection to the primary."""

    def __init__(
        self,
        upstream: _Upstream,
        request: h11.Request,
        first: Message,
        receive: Receive,
        send: Send,
    ) -> None:
        self.upstream = upstream
        self.request = request
        self.first = first
        self.receive = receive
        self.send = send
        #: Every body byte read from ``receive`` is still at hand (in ``first``).
        self.replayable = True
        #: The primary's answer has arrived whole: the connection no longer needs the client.
        self.answered = False
        #: ``http.response.start`` went to the client: a failure can no longer be a 503.
        self.started = False
        self.client_gone = False
        #: What stopped the request body, other than the connection (the client's server).
        self.body_error: Exception | None = None

    async def run(self) -> None:
        """Send the request and relay the answer.

        Raises _NoAnswer (no answer began), _ClientGone, or ConnectionError (the answer
        broke off after it started).
        """
        body_task: asyncio.Task[None] | None = None
        try:
            self.upstream.write(self.request)
            body_task = asyncio.create_task(self._send_body())
            await self._relay_answer()
        except (OSError, h11.ProtocolError) as exc:
            if self.client_gone:
                raise _ClientGone from None
            if self.body_error is not None:
                raise self.body_error from exc
            if not self.started:
                retryable = self.upstream.received == 0 and self.replayable
                reason = _no_answer_reason(exc, self.upstream.received)
                raise _NoAnswer(reason, retryable) from exc
            raise ConnectionError(f"the primary front's answer broke off: {exc}") from exc
        finally:
            if body_task is not None:
                body_task.cancel()
                await asyncio.wait([body_task])

    async def _send_body(self) -> None:
        """Send the request body as it arrives, then watch for the client leaving."""
        message = self.first
        try:
            while True:
                body = message.get("body", b"")
                if body:
                    self.upstream.write(h11.Data(data=body))
                    await self.upstream.writer.drain()
                if not message.get("more_body", False):
                    break
                self.replayable = False
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    self._client_left()
                    return
            self.upstream.write(h11.EndOfMessage())
            # After the body, receive() returns only when the client disconnects (or, with
            # uvicorn, once the answer is complete: _client_left tells the two apart).
            while (await self.receive())["type"] != "http.disconnect":
                pass
            self._client_left()
        except (OSError, h11.ProtocolError):
            # The connection broke (or the body broke its framing): the answer's reader
            # sees the connection end and says so.
            self.upstream.abort()
        except Exception as exc:
            self.body_error = exc
            self.upstream.abort()

    def _client_left(self) -> None:
        self.client_gone = True
        if not self.answered:
            self.upstream.abort()  # wakes the answer's reader; the primary sees the close

    async def _relay_answer(self) -> None:
        response = await self._answer_head()
        headers = _end_to_end(response.headers, _ADDED_HERE)
        await self.send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        self.started = True
        http = self.upstream.http
        # The latest piece is held until h11 says whether more follows, so that an answer
        # that arrived in one read goes out as one message, the last.
        held: bytes | None = None
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                if held is not None:
                    await self._send_piece(held, more=True)
                    held = None
                await self.upstream.receive_more()
            elif isinstance(event, h11.Data):
                if held is not None:
                    await self._send_piece(held, more=True)
                held = bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.answered = True
                await self._send_piece(held or b"", more=False)
                return
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in an answer")

    async def _answer_head(self) -> h11.Response:
        while True:
            event = await self.upstream.next_event()
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse):  # 1xx: not the answer yet
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} for an answer")

    async def _send_piece(self, body: bytes, more: bool) -> None:
        await self.send({"type": "http.response.body", "body": body, "more_body": more})


def _request_head(scope: Message, first: Message) -> h11.Request:
    """The request line and headers to send the primary.

    The headers are the client's, less those ``oipserve.front.header_rules`` keeps from a forward
    (``NOT_FORWARDED``); every front has applied the rest of those rules already, so what is
    left is what the primary would have received from the client itself. Those a
    ``Connection`` header names are kept: they are for the server, and the client cannot
    tell which front that is.

    The body's framing is the body this front's parser delivered: when the first body
    message holds all of it, its length (the primary reads a body of known length straight
    into place); else, while more is coming, the client's ``Content-Length`` if it sent
    one, or chunked. (Not always the client's length: llhttp delivers no body for a request
    it takes as an upgrade, whatever its ``Content-Length`` says.)
    """
    headers = [(name.lower(), value) for name, value in scope["headers"]]
    headers = [(name, value) for name, value in headers if name not in NOT_FORWARDED]
    names = {name for name, _ in headers}
    if b"host" not in names:
        headers.insert(0, (b"host", _host(scope)))
    if not first.get("more_body", False):
        length = b"%d" % len(first.get("body", b""))
        if b"content-length" in names:  # the parser allows one
            headers = [(n, length if n == b"content-length" else v) for n, v in headers]
        elif length != b"0":
            headers.append((b"content-length", length))
    elif b"content-length" not in names:
        headers.append((b"transfer-encoding", b"chunked"))
    target = scope.get("raw_path") or quote(scope["path"]).encode("ascii")
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    return h11.Request(method=scope["method"].encode("ascii"), target=target, headers=headers)


def _end_to_end(headers: Iterable[tuple[bytes, bytes]], dropped: frozenset[bytes]) -> Headers:
    """The primary's answer's ``headers`` in their order, repeats kept, less ``dropped``
    and those its ``Connection`` names (RFC 9110, 7.6.1: they are for this front)."""
    headers = [(name.lower(), value) for name, value in headers]
    named = {
        token.strip().lower()
        for name, value in headers
        if name == b"connection"
        for token in value.split(b",")
    }
    return [(name, value) for name, value in headers if name not in dropped and name not in named]


def _host(scope: Message) -> bytes:
    """A ``Host`` for a request that came without one (HTTP/1.0): this front's address."""
    server = scope.get("server")
    if not server or not server[0]:
        return b"localhost"
    host, port = server
    return (host if port is None else f"{host}:{port}").encode("idna")


def _no_answer_reason(exc: BaseException, received: int) -> str:
    """Why no answer came, for the 503 (``received``: the bytes of it that did)."""
    if received == 0:
        detail = f" ({exc.strerror})" if isinstance(exc, OSError) and exc.strerror else ""
        return f"it closed the connection before answering{detail}"
    if isinstance(exc, h11.RemoteProtocolError):
        return f"its answer is not valid HTTP/1.1 ({exc})"
    return f"its answer broke off ({_describe(exc)})"


def _describe(exc: BaseException) -> str:
    """An OS error as the OS words it ("Connection refused"), without errno and address."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, TimeoutError):
        return f"no connection within {CONNECT_TIMEOUT:g} s"
    return str(exc) or type(exc).__name__


def _shown(address: str) -> str:
    """``address`` for a message: an abstract name as ``@name``, the way ``ss`` shows it."""
    return "@" + address[1:] if address.startswith("\0") else address


async def _answer_unavailable(send: Send, reason: str) -> None:
    await _answer_json(
        send, 503, f"the primary front is not reachable: {reason}", [(b"retry-after", b"1")]
    )


async def _answer_json(
    send: Send, status: int, error: str, extra: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers + [*extra]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
