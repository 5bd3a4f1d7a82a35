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
   that takes a writable memoryview sized from Content-Length (a shared-memory
   segment). What arrived with the headers is copied from the parser into it;
   the rest of a large body is read from the socket directly into it (the
   transport is handed a ``BufferedProtocol`` for exactly the missing bytes),
   instead of being accumulated in uvicorn's per-request bytearray, copied
   again into an ASGI message and copied a third time by the application; and
   the application is woken once, when the body is complete, not per 64 KiB.

3. A request head must arrive within ``header_timeout`` seconds (a timer from
   the connection, or a keep-alive request's first byte, to the end of its
   headers); past it the connection is closed. uvicorn's ``timeout_keep_alive``
   covers idle connections between requests only, so a client sending its
   head a byte at a time (slowloris) would otherwise hold a connection forever.

4. A chunked request body is refused at the chunk-size line that declares it
   past ``max_body`` (``--max-request-bytes``): 413, ``Connection: close``,
   before the data it announces is received. httptools reports neither chunk sizes
   nor where they are, so ``ChunkSizes`` (``oipserve/chunk_sizes.py``) reads
   the framing from the raw bytes alongside the parser. It starts at the end
   of the read in which a chunked request's head completed: the events the
   parser reported in that read (``on_chunk_header``, ``on_body``,
   ``on_chunk_complete``, which httptools calls for chunked bodies only) say
   where the current size line begins. Later reads are checked before the
   parser sees them. A request without ``Transfer-Encoding`` costs a few
   attribute checks (its headers are looked at only if its body is incomplete
   at the end of the read that ended its head). A handler reading the body then finds
   ``BODY_REFUSED`` in its scope (``oipserve/rest/body.py`` raises 413 from it).

All lean on uvicorn internals, which is why pyproject.toml caps uvicorn (and
httptools) at the minor series this was written against: the hooks
``connection_made``, ``connection_lost``, ``eof_received``, ``data_received``,
``on_message_begin``, ``on_headers_complete``, ``on_body``, ``on_message_complete`` and
``on_response_complete`` (and httptools' ``on_chunk_header`` and ``on_chunk_complete``);
the protocol's ``transport`` (handed on to each cycle, so our ``CorkedTransport``
sees every write), ``flow``, ``cycle``, ``scope``, ``parser``,
``pipeline`` and ``server_state.default_headers``; and the cycle's ``scope``,
``body``, ``more_body``, ``disconnected``, ``message_event``,
``waiting_for_100_continue``, ``response_started``, ``response_complete`` and
``on_response``. ``tests/unit/test_framework_internals.py`` checks each by
name; when it fails after an upgrade, it says which to re-read.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from oipserve.chunk_sizes import MORE, OVER, ChunkSizes
from oipserve.http_io import BodyReader, BodySink, CorkedTransport

log = logging.getLogger("oipserve.http")

RECEIVE_INTO = "oipserve.receive_into"
#: ASGI extension: ``scope["extensions"][ON_DISCONNECT](callback)`` calls ``callback``
#: if the client goes away before the response is complete (a queued request can be
#: dropped before it runs); at once if it already has.
ON_DISCONNECT = "oipserve.on_disconnect"
#: Bodies with at least this many bytes still to come are read from the socket
#: straight into their target; below it, switching protocols costs more than
#: the parser's copies it saves.
DIRECT_READ_MIN = 64 * 1024
#: Seconds a request head may take to arrive (``--header-timeout``'s default).
HEADER_TIMEOUT = 10.0
#: Scope key set, to the 413's message, when a chunked body was refused by its declared size.
BODY_REFUSED = "oipserve.body_refused"
#: The message of every 413 for a body past ``--max-request-bytes``.
TOO_LARGE = "the request body is larger than the limit of {} bytes"


def _forget_extensions(cycle: RequestResponseCycle | None) -> None:
    """Drop our extensions from a finished cycle's scope.

    PERF: each holds the cycle (a partial over it), and the cycle holds the scope: a
    reference cycle per request, which only the cyclic collector frees. That garbage
    (about 16 objects a request) made the collector's passes long (6-7 ms every ~200
    requests at our gen0 threshold, the p99 of tiny requests); dropped here, each
    request's objects go by reference counting.
    """
    if cycle is not None:
        extensions = cycle.scope.get("extensions")
        if extensions:
            extensions.pop(RECEIVE_INTO, None)
            extensions.pop(ON_DISCONNECT, None)


class ClientDisconnected(Exception):
    """The client went away before its request body was complete."""


class _ChunkEvents:
    """What the parser reported of a chunked body during the read that completed its head."""

    __slots__ = ("open", "since", "completed")

    def __init__(self) -> None:
        self.open = False  # a chunk's size line was parsed, its data not yet complete
        self.since = 0  # body bytes since that size line
        self.completed = 0  # body bytes of the chunks completed before it


#: ``_chunk_events`` of a request whose head completed in this read, before any chunk event.
_HEAD_READ = _ChunkEvents()


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    #: Seconds from connection (or a request's first byte) to its complete head.
    header_timeout: float = HEADER_TIMEOUT
    #: Chunked bodies declaring more bytes than this are refused (None: not followed).
    max_body: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sinks: dict[RequestResponseCycle, BodySink] = {}
        self._watchers: dict[RequestResponseCycle, list[Callable[[], None]]] = {}
        self._head_timer: asyncio.TimerHandle | None = None
        #: Loop time the current request head began to arrive; None when no head is due.
        self._head_started: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Follows the chunked body being received, from the read after its head's.
        self._chunks: ChunkSizes | None = None
        #: Set while the read in which a chunked request's head completed is parsed.
        self._chunk_events: _ChunkEvents | None = None

    @classmethod
    def configured(
        cls, header_timeout: float, max_body: int | None = None
    ) -> type[CorkedHttpToolsProtocol]:
        """This protocol with its settings (uvicorn instantiates a class)."""
        settings = {"header_timeout": header_timeout, "max_body": max_body}
        return type(cls.__name__, (cls,), settings)

    def data_received(self, data: bytes) -> None:
        chunks = self._chunks
        if chunks is not None:
            verdict = chunks.feed(data)
            if verdict == OVER:
                self._refuse_chunked_body()
                return
            if verdict != MORE:  # the body ended, or framing the parser will judge
                self._chunks = None
        super().data_received(data)
        if self._chunk_events is not None:
            self._follow_chunks(data)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        loop = self._loop = asyncio.get_running_loop()
        corked = CorkedTransport(transport, loop)
        super().connection_made(corked)  # type: ignore[arg-type]
        self._head_started = loop.time()
        self._head_timer = loop.call_later(self.header_timeout, self._check_head)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_started is None:  # a keep-alive connection's next request
            self._head_started = self._loop.time()  # type: ignore[union-attr]

    def _check_head(self) -> None:
        """Close a connection whose request head is overdue, answering nothing (as nginx).

        PERF: one timer per connection, re-armed when it fires, rather than one per
        request: a request only notes when its head began (a clock read), and its
        complete head clears that.
        """
        loop = self._loop
        started = self._head_started
        wait = self.header_timeout
        if started is not None:
            wait = started + self.header_timeout - loop.time()  # type: ignore[union-attr]
            if wait <= 0:
                self._head_timer = None
                if not self.transport.is_closing():
                    self.transport.close()
                return
        self._head_timer = loop.call_later(wait, self._check_head)  # type: ignore[union-attr]

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def on_headers_complete(self) -> None:
        self._head_started = None
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            extensions = self.scope.setdefault("extensions", {})  # type: ignore[misc]
            extensions[RECEIVE_INTO] = functools.partial(self._receive_into, cycle)
            extensions[ON_DISCONNECT] = functools.partial(self._on_disconnect, cycle)
            if self.max_body is not None:
                # PERF: whether the body is chunked is looked at only if it is not
                #   complete at the end of this read (``_follow_chunks``).
                self._chunk_events = _HEAD_READ

    def on_chunk_header(self) -> None:
        """httptools: a chunk-size line was parsed (chunked bodies only)."""
        events = self._chunk_events
        if events is _HEAD_READ:
            events = self._chunk_events = _ChunkEvents()
        if events is not None:
            events.open = True
            events.since = 0

    def on_chunk_complete(self) -> None:
        """httptools: a chunk's data and its CRLF were parsed."""
        events = self._chunk_events
        if events is not None:
            events.completed += events.since
            events.open = False
            events.since = 0

    def on_response_complete(self) -> None:
        # PERF: a finished response goes out now rather than at the end of the loop
        #   iteration: on an idle server that saves one iteration of latency, and a
        #   connection's responses never share a write unless pipelined anyway.
        self.transport.flush()  # type: ignore[attr-defined]
        cycle = self.cycle
        self._watchers.pop(cycle, None)
        _forget_extensions(cycle)
        super().on_response_complete()

    def on_body(self, body: bytes) -> None:
        events = self._chunk_events
        if events is not None and events.open:
            events.since += len(body)
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
        self._chunks = self._chunk_events = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self._sinks.clear()
        watchers, self._watchers = self._watchers, {}
        super().connection_lost(exc)
        for callbacks in watchers.values():
            for callback in callbacks:
                callback()

    def _on_disconnect(self, cycle: RequestResponseCycle, callback: Callable[[], None]) -> None:
        if cycle.disconnected:
            callback()
        else:
            self._watchers.setdefault(cycle, []).append(callback)

    async def _receive_into(self, cycle: RequestResponseCycle, target: memoryview) -> int:
        """Receive the rest of ``cycle``'s body into ``target``; returns the byte count."""
        sink = BodySink(target)
        if cycle.body:
            sink.write(cycle.body)  # what arrived with the headers, before we were asked
            cycle.body = bytearray()
        if cycle.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        reader = None
        if cycle.more_body:
            if len(target) - sink.size >= DIRECT_READ_MIN and not self._chunked(cycle):
                # The parser has seen every byte received so far and waits for
                #   the rest of the body: read that past it, straight into ``target``.
                reader = BodyReader(self, sink)
                self.transport.set_protocol(reader)
            else:
                self._sinks[cycle] = sink
        try:
            while cycle.more_body and not cycle.disconnected:
                self.flow.resume_reading()
                await cycle.message_event.wait()
                cycle.message_event.clear()
        except BaseException:
            if reader is not None and sink.size < len(target):
                self.transport.close()  # mid-body: the connection cannot be resumed
            raise
        finally:
            self._sinks.pop(cycle, None)
        if cycle.more_body or cycle.disconnected:
            raise ClientDisconnected("the client went away before its request body was complete")
        return sink.size

    @staticmethod
    def _chunked(cycle: RequestResponseCycle) -> bool:
        # NOTE: llhttp refuses a request whose Transfer-Encoding does not end in chunked.
        for name, _ in cycle.scope["headers"]:
            if name == b"transfer-encoding":
                return True
        return False

    def _follow_chunks(self, data: bytes) -> None:
        """The end of the read in which a chunked request's head completed: start following.

        The current size line begins after the last LF before it: the head's
        last byte or the CRLF ending the previous chunk's data, both in ``data``.
        """
        events = self._chunk_events
        self._chunk_events = None
        cycle = self.cycle
        if events is None or cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        if events is _HEAD_READ and not self._chunked(cycle):
            return  # a Content-Length body, still to come
        if events.open:
            # In a chunk's data, or just past it with the CR of its CRLF (or in
            #   the last chunk's trailers): its size line ends ``since`` bytes
            #   before the end, or one more. At most one of the two ends in CRLF.
            end = len(data) - events.since
            if data[end - 2 : end] != b"\r\n":
                end -= 1
                if not data.endswith(b"\r") or data[end - 2 : end] != b"\r\n":
                    return  # in trailers: nothing more to follow
            start = data.rfind(b"\n", 0, end - 1) + 1
        else:
            start = data.rfind(b"\n") + 1  # a size line is due, or part of it came
        if start == 0:
            return  # not where this read can place it: the parser alone decides
        chunks = ChunkSizes(self.max_body, events.completed)  # type: ignore[arg-type]
        verdict = chunks.feed(data, start)
        if verdict == OVER:
            self._refuse_chunked_body()
        elif verdict == MORE:
            self._chunks = chunks

    def _refuse_chunked_body(self) -> None:
        """413 for a chunked body declared past ``max_body``, then close the connection.

        The handler reading the body sees the client go away and finds
        ``BODY_REFUSED`` in its scope; its own answer is dropped.
        """
        self._chunks = self._chunk_events = None
        cycle = self.cycle
        message = TOO_LARGE.format(self.max_body)
        log.debug("%s %s -> 413: %s", cycle.scope["method"], cycle.scope["path"], message)
        cycle.scope[BODY_REFUSED] = message  # type: ignore[literal-required]
        transport = self.transport
        if cycle.response_started or self.pipeline:
            transport.close()  # another answer is (or goes) first: no room for ours
        else:
            cycle.response_started = cycle.response_complete = True
            body = json.dumps({"error": message}, separators=(",", ":")).encode()
            head = [STATUS_LINE[413]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head.append(
                b"content-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % len(body)
            )
            transport.write(b"".join(head) + body)
            transport.close()  # as uvicorn's own 400s: what the client still sends is dropped
        cycle.disconnected = True
        cycle.message_event.set()

    def body_read(self) -> None:
        """The body was read past the parser: take the socket back with a fresh parser."""
        self.transport.set_protocol(self)
        # NOTE: the old parser still counts the body's bytes as missing; a new one
        #   starts at the next request, set up as uvicorn sets up its own.
        self.parser = httptools.HttpRequestParser(self)
        try:
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        except AttributeError:  # httptools < 0.6.3
            pass
        self.on_message_complete()
