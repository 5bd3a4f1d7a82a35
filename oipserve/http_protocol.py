"""uvicorn's httptools protocol, with two changes for large tensors and small requests.

1. Writes are coalesced. uvicorn writes a response's head and body with two
   ``transport.write`` calls, each a ``send`` system call that wakes the
   client; holding them and handing them over with one ``writelines`` (one
   ``writev``) when the response is complete sends them together (writes not
   followed by a complete response go out at the end of the loop iteration).
   Nothing is copied: the transport gets the same objects, views of shared
   memory included.
2. A request body can be received straight into a caller's buffer. The ASGI
   scope carries ``extensions["oipserve.receive_into"]``, an async callable
   that takes a writable memoryview sized from Content-Length. Body bytes are
   then copied from the parser directly into it (a shared-memory segment),
   instead of being accumulated in uvicorn's per-request bytearray, copied
   again into an ASGI message and copied a third time by the application; and
   the application is woken once, when the body is complete, not per 64 KiB.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

RECEIVE_INTO = "oipserve.receive_into"


class ClientDisconnected(Exception):
    """The client went away before its request body was complete."""


class CorkedTransport:
    """A transport proxy that sends everything written in one loop iteration at once."""

    __slots__ = ("_transport", "_pending", "_loop")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._pending: list[Any] = []
        self._loop = loop

    def write(self, data: Any) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _BodySink:
    """Where the body of one request goes once the application asked for it."""

    __slots__ = ("target", "size")

    def __init__(self, target: memoryview) -> None:
        self.target = target
        self.size = 0

    def write(self, data: bytes | bytearray) -> None:
        end = self.size + len(data)
        if end > len(self.target):
            raise ValueError("the request body is longer than its Content-Length")
        self.target[self.size : end] = data
        self.size = end


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sinks: dict[RequestResponseCycle, _BodySink] = {}

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        corked = CorkedTransport(transport, asyncio.get_running_loop())
        super().connection_made(corked)  # type: ignore[arg-type]

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            extensions = self.scope.setdefault("extensions", {})  # type: ignore[misc]
            extensions[RECEIVE_INTO] = functools.partial(self._receive_into, cycle)

    def on_response_complete(self) -> None:
        # PERF: a finished response goes out now rather than at the end of the loop
        #   iteration: on an idle server that saves one iteration of latency, and a
        #   connection's responses never share a write unless pipelined anyway.
        self.transport.flush()  # type: ignore[attr-defined]
        super().on_response_complete()

    def on_body(self, body: bytes) -> None:
        sink = self._sinks.get(self.cycle)
        if sink is None:
            super().on_body(body)
            return
        try:
            sink.write(body)
        except ValueError:
            self.cycle.disconnected = True
            self.cycle.message_event.set()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._sinks.pop(self.cycle, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._sinks.clear()
        super().connection_lost(exc)

    async def _receive_into(self, cycle: RequestResponseCycle, target: memoryview) -> int:
        """Receive the rest of ``cycle``'s body into ``target``; returns the byte count."""
        sink = _BodySink(target)
        if cycle.body:
            sink.write(cycle.body)  # what arrived with the headers, before we were asked
            cycle.body = bytearray()
        if cycle.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if cycle.more_body:
            self._sinks[cycle] = sink
        while cycle.more_body and not cycle.disconnected:
            self.flow.resume_reading()
            await cycle.message_event.wait()
            cycle.message_event.clear()
        self._sinks.pop(cycle, None)
        if cycle.more_body or cycle.disconnected:
            raise ClientDisconnected("the client went away before its request body was complete")
        return sink.size
