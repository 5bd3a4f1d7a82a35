"""One infer-lane request's body and response, compiled: the lane's part of uvicorn's cycle.

uvicorn serves each HTTP/1.1 request through a ``RequestResponseCycle`` (its body as ASGI
``receive`` events, its response as ``send`` events) and an ``asyncio.Event`` the protocol
sets when body bytes arrive. Both are interpreted Python: made, waited on and answered
through for every request, they were about a twentieth of the front's CPU for a tiny
request at c=1 (perf, 2026-12-01: ``benchmarks/results/2026-12-01-lane-cycle.md``). A
request the lane takes (``front.http.lane``) gets a ``LaneCycle`` instead: the same state
by the same names, so that the protocol and uvicorn's own callbacks (``connection_lost``,
``shutdown``, a pipelined request's turn) read and set it as they do uvicorn's cycle,
with the body handed over as bytes and the response written as uvicorn writes it
(``tests/e2e/test_infer_lane.py`` compares them byte for byte).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from oipserve.runtime.http_io import CorkedTransport

__all__ = ["BodyEvent", "LaneCycle", "default_lines", "response_head"]

#: What uvicorn answers when an application fails before its response started (and
#: ``connection: close``, which the head adds last, as uvicorn's list has it).
_FAILED_LINES: Final = b"content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n"
_FAILED_BODY: Final = b"Internal Server Error"
#: The end of a head, with ``connection: close`` or without.
_END: Final = b"\r\n"
_CLOSE_END: Final = b"connection: close\r\n\r\n"


class _DefaultLines:
    """The server's default headers as header lines, for the list they were made from.

    PERF: uvicorn makes a new list of them once a second (its ``date``); the lines were
    made again for every response (a list and a bytes object a field).
    """

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.lines = b""


_DEFAULTS: Final = _DefaultLines()


def default_lines(default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """``default_headers`` (``server``, ``date``) as a head writes them."""
    cached = _DEFAULTS
    if cached.headers is not default_headers:
        parts: list[bytes] = []
        for name, value in default_headers:
            parts += [name, b": ", value, b"\r\n"]
        cached.lines = b"".join(parts)
        cached.headers = default_headers
    return cached.lines


def response_head(
    status: int,
    default_headers: list[tuple[bytes, bytes]],
    fields: list[tuple[bytes, bytes]],
    close: bool,
) -> bytes:
    """A response's status line and header section as uvicorn writes it: its default
    headers (``server``, ``date``), then ``fields``, then ``connection: close`` if asked."""
    lines: list[bytes] = []
    for name, value in fields:
        lines.append(name)
        lines.append(b": ")
        lines.append(value)
        lines.append(b"\r\n")
    return head_of(status, default_headers, lines, close)


def head_of(
    status: int, default_headers: list[tuple[bytes, bytes]], lines: list[bytes], close: bool
) -> bytes:
    """``response_head`` of header ``lines`` already encoded, in parts (the list is taken)."""
    lines.insert(0, STATUS_LINE[status])
    lines.insert(1, default_lines(default_headers))
    lines.append(_CLOSE_END if close else _END)
    return b"".join(lines)


class BodyEvent:
    """``asyncio.Event``'s ``set``, ``clear``, ``is_set`` and ``wait`` for a request body's
    one reader (the responder's task), compiled: the protocol sets it when body bytes
    arrive, the body completes or the client goes away."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        #: The reader's wait (None: nobody waits).
        self._waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        if self._set:
            return
        waiter = self._waiter
        if waiter is None or waiter.done():
            waiter = self._waiter = self._loop.create_future()
        await waiter


class LaneCycle:
    """A lane request's state by uvicorn's ``RequestResponseCycle``'s names, its body read
    with ``next_part`` and its response written with ``send_whole`` or ``send_stream``."""

    def __init__(
        self,
        scope: dict[str, Any],
        transport: CorkedTransport,
        flow: FlowControl,
        default_headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
        on_response: Callable[[], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.default_headers = default_headers
        self.keep_alive = keep_alive
        #: Called once the response is complete (the protocol's ``on_response_complete``).
        self.on_response = on_response
        self.message_event = BodyEvent(loop)
        self.disconnected = False
        #: Never set: the lane takes no request with ``Expect`` (uvicorn's name, read by the
        #: protocol's ``receive_into``).
        self.waiting_for_100_continue = False
        #: Body bytes received and not yet handed over; more to come.
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        #: The task answering it, until its end (the protocol's; it leaves the server's
        #: tasks then).
        self.task: asyncio.Task[None] | None = None

    async def next_part(self) -> bytes:
        """The body bytes received since the last call, waiting for some; b"" once the body
        has all been handed over, or the client has gone (what came is what there is, as
        Falcon's request stream reads uvicorn's disconnect)."""
        while not (self.disconnected or self.response_complete):
            body = self.body
            if body:
                part = bytes(body)
                body.clear()  # (PERF: the same bytearray again, not a new one a part)
                return part
            if not self.more_body:
                break
            flow = self.flow
            if flow.read_paused:
                flow.resume_reading()
            event = self.message_event
            await event.wait()
            event.clear()
        return b""

    async def send_whole(self, status: int, lines: list[bytes], data: bytes) -> None:
        """A response whose body is ``data`` (its header ``lines``, encoded, in parts,
        give its length; the list is taken): one write of its head and body, once the
        transport takes writes (as uvicorn's ``send`` waits)."""
        if not await self._writable():
            return
        self.response_started = True
        head = head_of(status, self.default_headers, lines, not self.keep_alive)
        self.transport.write_whole(head, data)
        self._complete()

    async def send_stream(
        self,
        status: int,
        fields: list[tuple[bytes, bytes]],
        stream: AsyncIterator[bytes | memoryview] | None,
    ) -> None:
        """A response whose body comes in parts (None: no body), framed as uvicorn frames
        it: by its ``content-length`` when ``fields`` have one (the parts must add up to
        it), else chunked. The stream is read to its end even for a client gone (its parts
        may hold memory that the end gives back)."""
        length = _content_length(fields)
        if length is None:
            fields = [*fields, (b"transfer-encoding", b"chunked")]
        writing = await self._writable()
        if writing:
            self.response_started = True
            head = response_head(status, self.default_headers, fields, not self.keep_alive)
            self.transport.write(head)
        left = length or 0
        if stream is not None:
            async for part in stream:
                if part and writing:
                    writing = await self._writable()
                    if writing:
                        left = self._write_part(part, length is None, left)
        if not writing:
            return
        if left:
            raise RuntimeError("Response content shorter than Content-Length")
        if length is None:
            self.transport.write(b"0\r\n\r\n")
        self._complete()

    def _write_part(self, part: bytes | memoryview, chunked: bool, left: int) -> int:
        """Write one part of a streamed body; returns the bytes its length still allows."""
        if chunked:
            self.transport.write(b"%x\r\n" % len(part))
            self.transport.write(part)
            self.transport.write(b"\r\n")
            return left
        if len(part) > left:
            raise RuntimeError("Response content longer than Content-Length")
        self.transport.write(part)
        return left - len(part)

    async def send_failed(self) -> None:
        """uvicorn's answer to an application that failed before its response started: a
        500 with its text, and the connection closed."""
        self.keep_alive = False
        await self.send_whole(500, [_FAILED_LINES], _FAILED_BODY)

    async def _writable(self) -> bool:
        """Whether the client is there to write to, once the transport takes writes."""
        flow = self.flow
        if flow.write_paused and not self.disconnected:
            await flow.drain()  # as uvicorn's send: no more for a client that reads none
        return not self.disconnected

    def _complete(self) -> None:
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()


def _content_length(fields: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in fields:
        if name == b"content-length":
            return int(value)
    return None
