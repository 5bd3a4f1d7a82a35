"""The byte-level I/O under the HTTP protocol (``oipserve.front.http.protocol``).

``CorkedTransport`` holds what a response writes in one loop iteration and hands it
to the socket in one ``writelines`` (one ``writev``), or at once with what it holds
(``write_now``) when nothing later in the iteration would join it. ``BodySink`` and
``BodyReader`` receive a request body into a caller's buffer (a shared-memory segment):
the sink takes what the parser already has, the reader has the kernel copy the rest out
of the socket straight into the buffer and gives the socket back when the body is
complete.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, Protocol


class _Owner(Protocol):
    """The HTTP protocol a ``BodyReader`` stands in for while it reads."""

    #: Body bytes received so far (its body timeout reads them).
    body_bytes: int

    def body_read(self) -> None: ...

    def eof_received(self) -> bool | None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


#: How often ``CorkedTransport.sent`` looks at the transport's buffer.
_SENT_POLL: Final = 0.002


class CorkedTransport:
    """A transport proxy that sends everything written in one loop iteration at once.

    PERF: it forwards asyncio's ``Transport`` methods one by one rather than through
    ``__getattr__``: a class with ``__getattr__`` gets a new bound method from every method
    looked up on it (``write``, ``is_closing``: CPython's method-call shortcut is for
    classes with the generic attribute lookup only), several objects a request.
    """

    __slots__ = ("_transport", "_pending", "_spare", "_loop", "_flush", "written")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        #: What this iteration wrote, and an empty list that takes over at a flush (PERF:
        #: the two take turns, rather than a new list a flush).
        self._pending: list[Any] = []
        self._spare: list[Any] = []
        self._loop = loop
        #: ``flush``, bound once (PERF: not a new bound method a write that schedules it).
        self._flush = self.flush
        #: Bytes written so far (less the transport's buffer: what the client took).
        self.written = 0

    def write(self, data: Any) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)
        self.written += data.nbytes if type(data) is memoryview else len(data)

    def write_whole(self, head: bytes, body: bytes) -> None:
        """A whole response, handed to the socket now with what this iteration wrote
        before it (one ``writelines``): for a response complete when written, whose end
        (``on_response_complete``) would flush it at once anyway. PERF: no flush scheduled
        for it (a handle a response)."""
        self.written += len(head) + len(body)
        pending = self._pending
        pending.append(head)
        pending.append(body)
        self.flush()

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def write_now(self, data: bytes) -> None:
        """``data`` handed to the socket now, after what this loop iteration wrote before
        it: for a write that nothing later in the iteration would join (a connection's
        only call answered). PERF: with nothing held, no flush is scheduled, so no loop
        iteration is spent on one (one ``epoll_pwait`` and one handle a call at c=1)."""
        self.written += len(data)
        if self._pending:
            self._pending.append(data)
            self.flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        # NOTE: a write made while the transport takes these (none is known) goes to the
        #   other list, scheduling its own flush, as before.
        self._pending, self._spare = self._spare, pending
        if not self._transport.is_closing():
            self._transport.writelines(pending)
        pending.clear()

    async def sent(self) -> None:
        """Return once everything written so far is in the kernel's hands (or the
        transport is closing).

        A transport keeps views of what it could not send yet; memory it views is freed
        by its last release of it, wherever that happens (a 100 MB unmap on the loop's
        thread). Awaiting this before ``off_loop.unmap_off_loop`` keeps the unmap in a
        thread.
        """
        self.flush()
        transport = self._transport
        while not transport.is_closing() and transport.get_write_buffer_size():
            await asyncio.sleep(_SENT_POLL)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    # asyncio's Transport, forwarded (the class docstring's PERF note)
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def abort(self) -> None:
        self._transport.abort()


class BodySink:
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


class BodyReader(asyncio.BufferedProtocol):
    """Reads the rest of one request body from the socket into its sink, then hands back.

    The transport reads into ``get_buffer``'s view, so the kernel's copy out of
    the socket is the only one. Exactly the missing bytes are asked for: what
    follows (a pipelined request) stays in the socket for the HTTP protocol.
    """

    def __init__(self, http: _Owner, sink: BodySink) -> None:
        self.http = http
        self.sink = sink

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.sink.target[self.sink.size :]

    def buffer_updated(self, nbytes: int) -> None:
        self.sink.size += nbytes
        self.http.body_bytes += nbytes
        if self.sink.size == len(self.sink.target):
            self.http.body_read()

    def eof_received(self) -> bool | None:
        return self.http.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)
