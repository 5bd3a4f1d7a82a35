"""uvicorn's httptools protocol, with the front's changes for large tensors, small
requests and hostile clients.

It is the hub of uvicorn's hooks; what each change judges lives beside it:
``extensions`` (what the REST app is given beyond ASGI), ``limits`` (the connection's
limits and deadlines), ``framing`` (the versions and transfer codings a head may ask
for), ``chunk_sizes`` (a chunked body's declared sizes) and ``h2c`` (the
HTTP/2 preface on this port).

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
   nor where they are, so ``ChunkSizes`` (``oipserve/front/http/chunk_sizes.py``) reads
   the framing from the raw bytes alongside the parser. It starts at the end
   of the read in which a chunked request's head completed: the events the
   parser reported in that read (``on_chunk_header``, ``on_body``,
   ``on_chunk_complete``, which httptools calls for chunked bodies only) say
   where the current size line begins. Later reads are checked before the
   parser sees them. A request without ``Transfer-Encoding`` costs a few
   attribute checks (its headers are looked at only if its body is incomplete
   at the end of the read that ended its head). A handler reading the body then finds
   ``BODY_REFUSED`` in its scope (``oipserve/front/rest/body.py`` raises 413 from it).

5. Limits against abuse (issue #35), one timer per connection checking them all:
   a request head may take ``max_head_bytes`` and ``max_header_fields`` (past
   either: 431, ``Connection: close``); a body must arrive within ``body_timeout``
   seconds plus one second per ``min_rate`` bytes received, and a response that the
   client leaves unread may wait ``send_timeout`` seconds plus one per ``min_rate``
   bytes it did read (past either the connection is dropped: the body's lease and
   the response's segments are given back; ``limits`` judges). Trailer fields of a chunked body are
   dropped unread: nothing after the head may act as a header (a restricted API's
   key sent as a trailer opened it).

6. HTTP/2 with prior knowledge (h2c, RFC 9113 3.3) on the same port: a connection
   whose first bytes are the client preface ``PRI * HTTP/2.0...`` is handed over, with
   the bytes read so far, to ``h2c`` (the front's gRPC listener adopts it: issue #39,
   REST and gRPC on one port; without gRPC it is closed). Only a connection's first
   read is looked at (``h2c.PrefaceSniffer``): a keep-alive request after it costs one
   attribute check. The preface is never a valid HTTP/1.1 request, so nothing served before is
   taken for one.

7. The keep-alive timeout (uvicorn's ``timeout_keep_alive``: an idle connection is closed
   that long after its last response) is kept by the same per-connection timer as the
   limits (``_check_deadlines``), from the loop time the last response completed.
   uvicorn arms a timer for it at every response and cancels it at the next request's
   first bytes: a timer made and unmade per request, for a deadline that almost never
   comes. The timer looks at least once a ``timeout_keep_alive``, and when a connection
   is idle it is re-armed for the exact moment, so the connection closes on time.

8. A plain infer request is answered below the ASGI app, by the ``lane`` (``lane``: which
   requests, and why): at its complete head the protocol makes a ``LaneCycle`` for it
   (``lane_cycle``: uvicorn's cycle's state by its names, compiled; its body, disconnect
   and keep-alive work unchanged) and runs the lane's responder in a task of the server's,
   where uvicorn would have run the app.

9. uvicorn's ``data_received``, ``on_message_begin``, ``on_body`` and ``on_message_complete``
   are done here, step for step, rather than called: each was an interpreted call a
   request (``_parse``).

All lean on uvicorn internals, which is why pyproject.toml caps uvicorn (and
httptools) at the minor series this was written against: the hooks
``connection_made``, ``connection_lost``, ``eof_received``, ``data_received``,
``send_400_response``, ``_unsupported_upgrade_warning``, ``on_message_begin``, ``on_url``,
``on_header``, ``on_headers_complete``, ``on_body``, ``on_message_complete`` and
``on_response_complete`` (and httptools' ``on_chunk_header`` and ``on_chunk_complete``),
and the names those of them done here use;
the protocol's ``transport`` (handed on to each cycle, so our ``CorkedTransport``
sees every write), ``flow``, ``cycle``, ``scope``, ``parser``, ``url``, ``headers``,
``expect_100_continue``,
``pipeline``, ``connections`` (left at an h2c handover, as uvicorn's websocket upgrade
does), ``timeout_keep_alive``, ``timeout_keep_alive_handler``, ``_start_asgi_task``,
``server_state.total_requests``, ``server_state.default_headers``, ``tasks`` and
``logger``; and the cycle's ``default_headers``, ``keep_alive``, ``scope``, ``body``,
``more_body``, ``disconnected``, ``message_event``, ``waiting_for_100_continue``,
``response_started``, ``response_complete`` and ``on_response``, which the lane's cycle
keeps by the same names. ``tests/unit/test_framework_internals.py`` checks each by name;
when it fails after an upgrade, it says which to re-read.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NoReturn, cast

import httptools
from mypy_extensions import mypyc_attr
from uvicorn.protocols.http.httptools_impl import (
    HIGH_WATER_LIMIT,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from oipserve.front.http.chunk_sizes import MORE, OVER, ChunkEvents, ChunkSizes, size_line_start
from oipserve.front.http.extensions import (
    BODY_REFUSED,
    ON_DISCONNECT,
    RECEIVE_INTO,
    TOO_LARGE,
    ClientDisconnected,
)
from oipserve.front.http.framing import (
    VERSIONS,
    frame_by_transfer_encoding,
    is_chunked,
    transfer_coding_refusal,
    without_content_length,
)
from oipserve.front.http.h2c import H2Handover, PrefaceSniffer
from oipserve.front.http.lane import InferLane, LaneRequest, LaneResponse, lane_request, respond
from oipserve.front.http.lane_cycle import LaneCycle, response_head
from oipserve.front.http.limits import (
    ConnectionLimits,
    UnreadResponse,
    body_overdue,
    head_too_large,
    reset,
    too_many_fields,
)
from oipserve.runtime.bounded_memo import BoundedMemo
from oipserve.runtime.http_io import BodyReader, BodySink, CorkedTransport

if TYPE_CHECKING:
    from uvicorn._types import HTTPScope

__all__ = ["CorkedHttpToolsProtocol"]

log = logging.getLogger("oipserve.http")

#: Bodies with at least this many bytes still to come are read from the socket
#: straight into their target; below it, switching protocols costs more than
#: the parser's copies it saves.
DIRECT_READ_MIN: Final = 64 * 1024


class _HeadRefused(Exception):
    """Raised from a parser callback: the head is refused (past a limit, or an HTTP version
    this port does not speak); the parser stops there."""


#: The request a connection is receiving or answering: uvicorn's cycle (the ASGI way) or
#: the lane's, which keeps the same state by the same names.
AnyCycle = RequestResponseCycle | LaneCycle


def _forget_extensions(cycle: AnyCycle | None) -> None:
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


async def _no_lane(
    request: LaneRequest, response: LaneResponse, model: str, version: str | None
) -> None:
    """``_serve`` of a protocol without a lane (never called: no request takes it)."""
    raise RuntimeError("no infer lane on this port")


def _nothing() -> None:
    """A finished cycle's ``on_response`` (as uvicorn leaves its own)."""


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"


#: Field names as received, lower-cased. PERF: a field name lower-cased was a new bytes
#: object a field (each request sends the same few).
_LOWERED: Final[BoundedMemo[bytes, bytes]] = BoundedMemo(bytes.lower)


#: ``_chunk_events`` of a request whose head completed in this read, before any chunk event.
_HEAD_READ: Final = ChunkEvents()
#: The name of a lane's task (asyncio's default, "Task-N", is formatted for each).
_LANE_TASK: Final = "oipserve-lane"


# NOTE: not a native class when compiled (mypyc): it extends uvicorn's protocol, a Python
#   class, which a native class cannot; its methods are compiled all the same.
@mypyc_attr(native_class=False)
class CorkedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(
        self,
        *args: Any,
        limits: ConnectionLimits | None = None,
        max_body: int | None = None,
        h2c: H2Handover | None = None,
        lane: InferLane | None = None,
        **kwargs: Any,
    ) -> None:
        self.limits = limits or ConnectionLimits()
        #: Chunked bodies declaring more bytes than this are refused (None: not followed).
        self.max_body = max_body
        #: Who takes a connection that opens with the HTTP/2 preface (None: not looked for;
        #: the preface is then a bad request, as it always was).
        self.h2c = h2c
        #: Who answers a plain infer request below the ASGI app (None: every request goes
        #: to the app; ``front.http.lane``), and its ``serve``, bound once (PERF: a bound
        #: method a request).
        self.lane = lane
        self._serve = lane.serve if lane is not None else _no_lane
        super().__init__(*args, **kwargs)
        frame_by_transfer_encoding(self.parser)
        #: The current head has a Transfer-Encoding field.
        self._transfer_encoded = False
        self._sinks: dict[AnyCycle, BodySink] = {}
        self._watchers: dict[AnyCycle, list[Callable[[], None]]] = {}
        self._head_timer: asyncio.TimerHandle | None = None
        #: Loop time the current request head began to arrive; None when no head is due.
        self._head_started: float | None = None
        #: The running loop and the corked transport (from ``connection_made`` on);
        #: ``self.transport``, uvicorn's name, is the same proxy.
        self._loop: asyncio.AbstractEventLoop
        self._corked: CorkedTransport
        #: Follows the chunked body being received, from the read after its head's.
        self._chunks: ChunkSizes | None = None
        #: Set while the read in which a chunked request's head completed is parsed.
        self._chunk_events: ChunkEvents | None = None
        #: The current head: bytes counted so far, fields, the bytes of its complete
        #: pieces (line, fields) parsed in the current read, and whether it began there.
        self._head_bytes = 0
        self._head_fields = 0
        self._head_pieces = 0
        self._head_began = False
        #: Why the head was refused (431, 505): status and message, for ``send_400_response``.
        self._head_refusal: tuple[int, str] | None = None
        #: A refusal (the parser failed) answered once the requests before it are.
        self._refusal_due: tuple[int, str] | None = None
        #: The body being received: loop time it began (None: none), bytes so far.
        self._body_started: float | None = None
        self.body_bytes = 0
        #: Loop time the last response completed with no request after it (None: a
        #: request is under way or due): the keep-alive timeout counts from it.
        self._idle_since: float | None = None
        #: A response the client is not reading.
        self._unread = UnreadResponse(self.limits)
        #: Until the first read shows what the connection speaks (None: it may not be
        #: HTTP/2, or it is known), and the raw transport.
        self._sniffer = PrefaceSniffer() if self.h2c is not None else None
        self._raw: asyncio.Transport
        #: ``on_response_complete``, bound once: each lane cycle's ``on_response``.
        self._on_response = self.on_response_complete
        #: The scope's "asgi" entry, one for the connection's requests (PERF: uvicorn
        #:   makes a dict a request; nothing here writes to it).
        self._asgi = {"version": self.asgi_version, "spec_version": "2.3"}

    @classmethod
    def configured(
        cls,
        limits: ConnectionLimits,
        max_body: int | None = None,
        h2c: H2Handover | None = None,
        lane: InferLane | None = None,
    ) -> type[CorkedHttpToolsProtocol]:
        """This protocol with its settings: what uvicorn takes as its protocol class (it
        calls it with its own keywords for each connection)."""
        # NOTE: a partial, not a subclass made with type(): a compiled method refuses an
        #   instance of a class made at run time from this one.
        made = functools.partial(cls, limits=limits, max_body=max_body, h2c=h2c, lane=lane)
        return cast("type[CorkedHttpToolsProtocol]", made)

    def data_received(self, data: bytes) -> None:
        self._idle_since = None
        sniffer = self._sniffer
        if sniffer is not None:
            data = self._sniff(sniffer, data)
            if not data:
                return
        chunks = self._chunks
        if chunks is not None:
            verdict = chunks.feed(data)
            if verdict == OVER:
                self._refuse_chunked_body()
                return
            if verdict != MORE:  # the body ended, or framing the parser will judge
                self._chunks = None
        if self._body_started is not None:
            self.body_bytes += len(data)
        self._head_began = False
        self._head_pieces = 0
        self._parse(data)
        if self._head_started is not None:
            self._count_head(data)
        if self._chunk_events is not None:
            self._follow_chunks(data)

    def _parse(self, data: bytes) -> None:
        """uvicorn's ``data_received``, done here (its keep-alive timer, which it cancels
        first, is never armed: 7. above).

        PERF: uvicorn's ``data_received``, and its hooks that ``on_message_begin``,
        ``on_body`` and ``on_message_complete`` now do themselves, were each an interpreted
        call a request (with the lane's cycle, about a twentieth of the front's CPU a tiny
        request at c=1, perf, 2026-12-01); ``tests/unit/test_framework_internals.py`` says
        when uvicorn's change.
        """
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _sniff(self, sniffer: PrefaceSniffer, data: bytes) -> bytes:
        """The connection's first bytes: HTTP/2's preface is handed over to ``h2c``.

        Returns what HTTP/1.1 parses (b"" when nothing: handed over, or a preface begun
        and held until the rest of it comes; the head timer still runs meanwhile).
        """
        h2, seen = sniffer.feed(data)
        if h2 is None:
            return b""
        self._sniffer = None
        if not h2:
            return seen
        started = self._head_started
        self._stop_head_timer()
        # NOTE: as uvicorn's own websocket upgrade: out of its connections, so that its
        #   shutdown neither closes nor waits for what is now a gRPC connection (the gRPC
        #   listener's stop drains it).
        self.connections.discard(self)
        handover = self.h2c
        if handover is not None:
            handover(self._raw, seen, self._loop.time() if started is None else started)
        return b""

    def _count_head(self, data: bytes) -> None:
        """A head is still arriving after this read: count its bytes, 431 past the limit.

        A read wholly inside the head counts whole; in the read where a head began,
        only its complete pieces are known (the bytes before it were the previous
        request's), so a head is refused at most one read late.
        """
        self._head_bytes += self._head_pieces if self._head_began else len(data)
        if self._head_bytes > self.limits.max_head_bytes and not self.transport.is_closing():
            self._refuse_head(431, head_too_large(self.limits))

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._head_pieces += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_started is None:
            # NOTE: a trailer field of a chunked body: the head is complete and the
            #   application has its headers. Dropped, as Triton and most servers do;
            #   uvicorn would add it to the scope's headers, where a restricted API's
            #   check found a key sent after the head (issue #35).
            return
        self._head_fields += 1
        self._head_pieces += len(name) + len(value)
        if self._head_fields > self.limits.max_header_fields:
            self._refuse_in_parser(431, too_many_fields(self.limits))
        name = _LOWERED.get(name)
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        elif name == b"transfer-encoding":
            self._transfer_encoded = True
        self.headers.append((name, value))

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what httptools cannot parse (an unknown method, a byte out
        of place in the head): a 400 with ``{"error": ...}`` as every other, where uvicorn
        writes plain text; or the answer to a refused head (``_head_refusal``).

        Requests before it on the connection, received whole, are answered first, in
        order (pipelined, or the one whose response is under way): the 400 and the close
        came at once, and their answers were lost (found by fuzzing). Nothing more is
        read meanwhile: the parser has failed.
        """
        refusal = self._head_refusal
        self._head_refusal = None
        cycle = self.cycle
        queued = [entry for entry in self.pipeline if entry[0] is not cycle]
        if cycle is not None and cycle.more_body and len(queued) < len(self.pipeline):
            # The request whose body failed to parse, queued behind a response under way
            #   (so one is): it never runs; it waited for a body that never came, and the
            #   400 with it (found by fuzzing).
            self.pipeline.clear()
            self.pipeline.extend(queued)
            cycle.disconnected = True
            underway = True
        else:
            underway = cycle is not None and not cycle.response_complete and not cycle.more_body
        if (underway or self.pipeline) and not self.transport.is_closing():
            self._refusal_due = refusal or (400, msg)
            self._head_started = None  # (no head is due: none will be read)
            self.flow.pause_reading()
        elif refusal is not None:
            self._refuse_head(*refusal)
        else:
            self._answer_and_close(400, msg)  # (uvicorn's warning said it: parser_log)

    def _unsupported_upgrade_warning(self) -> None:
        # NOTE: uvicorn logs two warnings for every request asking for an upgrade this
        #   port does not make (CONNECT; Upgrade: websocket without a WebSocket library),
        #   and answers it as any request (a 405 for CONNECT). Any client may send
        #   them as often as it likes: one debug line each instead.
        log.debug("upgrade request from %s not taken (no such protocol here)", _peer(self.client))

    def _refuse_in_parser(self, status: int, message: str) -> NoReturn:
        """From a parser callback: stop the parser; ``send_400_response`` answers."""
        self._head_refusal = (status, message)
        raise _HeadRefused(message)

    def _refuse_head(self, status: int, message: str) -> None:
        """Answer a refused head (431, 505; or a 400 that waited for the requests before
        it), then close: the rest is never parsed."""
        self._head_refusal = None
        log.debug("request head refused (%d): %s", status, message)
        self._answer_and_close(status, message)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        loop = self._loop = asyncio.get_running_loop()
        # NOTE: a stream protocol's transport is a Transport (asyncio types the hook for all
        #   protocols); uvicorn gets the proxy, which stands in for it (it forwards the rest).
        self._raw = cast(asyncio.Transport, transport)
        corked = self._corked = CorkedTransport(self._raw, loop)
        super().connection_made(cast(asyncio.Transport, corked))
        self._head_started = loop.time()
        first = min(self.limits.tick, self.timeout_keep_alive)
        self._head_timer = loop.call_later(first, self._check_deadlines)

    def on_message_begin(self) -> None:
        # uvicorn's own steps (_parse's PERF note)
        self.url = b""
        self.expect_100_continue = False
        headers: list[tuple[bytes, bytes]] = []
        self.headers = headers
        scope = {
            "type": "http",
            "asgi": self._asgi,
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": headers,
            "state": self.app_state.copy(),
        }
        self.scope = cast("HTTPScope", scope)
        if self._head_started is None:  # a keep-alive connection's next request
            self._head_started = self._loop.time()
        self._head_bytes = self._head_fields = self._head_pieces = 0
        self._head_began = True
        self._transfer_encoded = False

    def _check_deadlines(self) -> None:
        """Close a connection whose head or body is overdue, or whose client reads nothing.

        An overdue head is closed answering nothing (as nginx); an overdue body or
        unread response is aborted, which drops what the transport still holds.
        PERF: one timer per connection, re-armed when it fires, rather than one per
        request: a request only notes when its head began (a clock read), and its
        complete head clears that.
        """
        loop = self._loop
        now = loop.time()
        limits = self.limits
        wait = min(limits.tick, self.timeout_keep_alive)
        idle = self._idle_since
        if idle is not None:
            left = idle + self.timeout_keep_alive - now
            if left > 0:
                wait = min(wait, left)
            elif not self._corked.get_write_buffer_size():
                self._head_timer = None
                self.timeout_keep_alive_handler()
                return
            # NOTE: a response the client has not read is no idle connection: uvicorn's
            #   close waits for it to drain, for ever, and this timer stopped, so the
            #   unread check below never came (a 200 MiB answer and its segments held
            #   for good, found by fuzzing). It goes on until the client reads or is cut.
        started = self._head_started
        if started is not None:
            left = started + limits.header_timeout - now
            if left <= 0:
                self._head_timer = None
                if not self.transport.is_closing():
                    self.transport.close()
                return
            wait = min(wait, left)
        corked = self._corked
        why = self._overdue_body(now) or self._unread.overdue(
            now, corked.get_write_buffer_size(), corked.written
        )
        if why:
            self._head_timer = None
            log.info("connection from %s dropped: %s", _peer(self.client), why)
            reset(self.transport)
            return
        self._head_timer = loop.call_later(wait, self._check_deadlines)

    def _overdue_body(self, now: float) -> str:
        """Why the body being received is overdue ('' while it is not)."""
        started = self._body_started
        if started is None:
            return ""
        if self.flow.read_paused:
            # NOTE: not the client's delay: the application has not asked for more yet.
            self._body_started = now
            self.body_bytes = 0
            return ""
        return body_overdue(self.limits, started, self.body_bytes, now)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def on_headers_complete(self) -> None:
        self._head_started = None
        if self._head_bytes + self._head_pieces > self.limits.max_head_bytes:
            self._refuse_in_parser(431, head_too_large(self.limits))
        version = self.parser.get_http_version()
        if version not in VERSIONS:
            # NOTE: a request line without a version is HTTP/0.9 to llhttp; the ASGI app
            #   (Falcon) raised on it, a 500 with a traceback (found by fuzzing).
            self._refuse_in_parser(505, f"HTTP/{version} is not supported: HTTP/1.0 or 1.1")
        if self._transfer_encoded:
            refusal = transfer_coding_refusal(self.headers)
            if refusal is not None:
                self._refuse_in_parser(*refusal)
        self._body_started = self._loop.time()
        self.body_bytes = 0
        both = self._transfer_encoded and without_content_length(self.headers)
        lane = self.lane
        if lane is not None and not self._transfer_encoded:
            # PERF: module functions, not methods: a method of this (non-native) class
            #   called from compiled code is a new bound method a call.
            taken = _lane_request(self, lane, version)
            if taken is not None:
                path, headers, model, model_version = taken
                _start_lane(self, path, headers, model, model_version)
                return
        super().on_headers_complete()
        cycle = self.cycle
        if both and cycle is not None:
            cycle.keep_alive = False  # RFC 9112, 6.1: close after answering it
        if cycle is not None and cycle.scope is self.scope:
            # (uvicorn types extensions' values as dicts; ours are functions)
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
            extensions.update(_extensions(self, cycle))
            if self.max_body is not None:
                # PERF: whether the body is chunked is looked at only if it is not
                #   complete at the end of this read (``_follow_chunks``).
                self._chunk_events = _HEAD_READ

    def on_chunk_header(self) -> None:
        """httptools: a chunk-size line was parsed (chunked bodies only)."""
        events = self._chunk_events
        if events is _HEAD_READ:
            events = self._chunk_events = ChunkEvents()
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
        self._corked.flush()
        cycle = self.cycle
        self._watchers.pop(cycle, None)
        _forget_extensions(cycle)
        # uvicorn's own steps, but for its keep-alive timer (see 7. above).
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        due = self._refusal_due
        if due is None and self.flow.read_paused:  # (an interpreted call saved a request)
            self.flow.resume_reading()
        if self.pipeline:
            waiting, app = self.pipeline.pop()
            self._start_asgi_task(waiting, app)
        elif due is not None:
            self._refusal_due = None
            self._refuse_head(*due)
        else:
            self._idle_since = self._loop.time()

    def on_body(self, body: bytes) -> None:
        events = self._chunk_events
        if events is not None and events.open:
            events.since += len(body)
        cycle = self.cycle
        sink = self._sinks.get(cycle)
        if sink is None:
            # uvicorn's own steps (_parse's PERF note)
            if not self._body_unwanted(cycle):
                cycle.body += body
                if len(cycle.body) > HIGH_WATER_LIMIT:
                    self.flow.pause_reading()
                cycle.message_event.set()
            return
        try:
            sink.write(body)
        except ValueError:
            cycle.disconnected = True
            cycle.message_event.set()

    def on_message_complete(self) -> None:
        self._body_started = None
        cycle = self.cycle
        if not self._body_unwanted(cycle):  # uvicorn's own steps (_parse's PERF note)
            cycle.more_body = False
            cycle.message_event.set()
        self._sinks.pop(cycle, None)
        self._chunks = self._chunk_events = None

    def _body_unwanted(self, cycle: AnyCycle) -> bool:
        """uvicorn's test: body events go nowhere once the response is complete (or for a
        WebSocket upgrade, which this port never makes: no WebSocket protocol is set)."""
        return (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self._sinks.clear()
        watchers, self._watchers = self._watchers, {}
        super().connection_lost(exc)
        for callbacks in watchers.values():
            for callback in callbacks:
                callback()

    def _on_disconnect(self, cycle: AnyCycle, callback: Callable[[], None]) -> None:
        if cycle.disconnected:
            callback()
        else:
            self._watchers.setdefault(cycle, []).append(callback)

    async def _receive_into(self, cycle: AnyCycle, target: memoryview) -> int:
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
            if len(target) - sink.size >= DIRECT_READ_MIN and not is_chunked(
                cycle.scope["headers"]
            ):
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

    def _follow_chunks(self, data: bytes) -> None:
        """The end of the read in which a chunked request's head completed: start following."""
        events = self._chunk_events
        self._chunk_events = None
        cycle = self.cycle
        limit = self.max_body
        if events is None or cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        if limit is None:  # (events are followed only under a limit)
            return
        if events is _HEAD_READ and not is_chunked(cycle.scope["headers"]):
            return  # a Content-Length body, still to come
        start = size_line_start(data, events)
        if start == 0:
            return  # not where this read can place it: the parser alone decides
        chunks = ChunkSizes(limit, events.completed)
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
        # NOTE: a key of our own, which uvicorn's type of the scope (ASGI's keys) leaves out.
        cast("dict[str, object]", cycle.scope)[BODY_REFUSED] = message
        if cycle.response_started or self.pipeline:
            self.transport.close()  # another answer is (or goes) first: no room for ours
        else:
            cycle.response_started = cycle.response_complete = True
            self._answer_and_close(413, message)
        cycle.disconnected = True
        cycle.message_event.set()

    def refuse_unanswered(self, message: str) -> None:
        """At the shutdown timeout, before uvicorn cancels what still runs: a request
        without its response gets a 503 and the connection closes (its task's own answer,
        uvicorn's 500 once cancelled, is not sent: the response has started)."""
        cycle = self.cycle
        if cycle is None or cycle.response_started or self.transport.is_closing():
            return
        cycle.response_started = cycle.response_complete = True
        # NOTE: and gone, for the app: whatever it still sends is dropped, as uvicorn drops
        #   a response to a client gone (Falcon's own answer raised on a completed one).
        cycle.disconnected = True
        cycle.message_event.set()
        self._answer_and_close(503, message)

    def _answer_and_close(self, status: int, message: str) -> None:
        """Answer ``{"error": message}`` with ``status`` and close (as uvicorn's own 400s:
        what the client still sends is dropped)."""
        body = json.dumps({"error": message}, separators=(",", ":")).encode()
        fields = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        head = response_head(status, self.server_state.default_headers, fields, close=True)
        self.transport.write(head + body)
        self.transport.close()

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
        frame_by_transfer_encoding(self.parser)
        self.on_message_complete()


def _extensions(protocol: CorkedHttpToolsProtocol, cycle: AnyCycle) -> dict[str, Any]:
    """What ``cycle``'s request is given beyond ASGI (``front.http.extensions``), on
    either way; ``_forget_extensions`` drops them when its response is complete.

    PERF: partials of the class's functions with the protocol, not of bound methods (a
    bound method each, a request)."""
    protocol_class = CorkedHttpToolsProtocol
    return {
        RECEIVE_INTO: functools.partial(protocol_class._receive_into, protocol, cycle),
        ON_DISCONNECT: functools.partial(protocol_class._on_disconnect, protocol, cycle),
    }


def _lane_request(
    protocol: CorkedHttpToolsProtocol, lane: InferLane, version: str
) -> tuple[str, dict[bytes, bytes], str, str | None] | None:
    """The path, headers, model and version when the lane takes ``protocol``'s request
    (its head is complete); None when it goes the ASGI way (``front.http.lane``)."""
    cycle = protocol.cycle
    if cycle is not None and not cycle.response_complete:
        return None  # pipelined behind a response under way: uvicorn queues it
    if protocol.expect_100_continue:
        return None
    method = protocol.parser.get_method()
    # (the scope's headers: the list ``on_message_begin`` made, which on_header fills)
    return lane_request(lane, method, version, protocol.url, protocol.headers)


def _start_lane(
    protocol: CorkedHttpToolsProtocol,
    path: str,
    headers: dict[bytes, bytes],
    model: str,
    version: str | None,
) -> None:
    """Serve the request on the lane: a ``LaneCycle`` for its body and its response,
    a task of the server's (shutdown waits for it) for the responder."""
    scope = cast("dict[str, Any]", protocol.scope)
    loop = protocol._loop
    cycle = LaneCycle(
        scope,
        protocol._corked,
        protocol.flow,
        protocol.server_state.default_headers,
        protocol.parser.should_keep_alive(),
        protocol._on_response,
        loop,
    )
    # NOTE: uvicorn types its cycle as its own class; the lane's keeps the same state by
    #   the same names, which is all uvicorn's callbacks read of it.
    protocol.cycle = cycle  # type: ignore[assignment]
    scope["method"] = "POST"
    scope["path"] = path
    scope["extensions"] = _extensions(protocol, cycle)
    request = LaneRequest(path, scope, headers, cycle)
    # NOTE: a Task made here, named: the loop's create_task formats a "Task-N" name
    #   for every task (~1 % of the front's samples a tiny request at c=1, perf,
    #   2026-11-30); no task factory is set on the server's loop. It leaves the server's
    #   tasks as its coroutine ends (``_run_lane``), not by a done callback (PERF: a bound
    #   method, a handle and its arguments a request).
    coro = _run_lane(protocol, cycle, request, model, version)
    task = cycle.task = asyncio.Task(coro, loop=loop, name=_LANE_TASK)
    protocol.tasks.add(task)


async def _run_lane(
    protocol: CorkedHttpToolsProtocol,
    cycle: LaneCycle,
    request: LaneRequest,
    model: str,
    version: str | None,
) -> None:
    """The lane's request, answered; what escapes the responder's own error handling
    is answered as uvicorn answers what escapes an ASGI app (a 500, or a close)."""
    response = LaneResponse()
    try:
        await protocol._serve(request, response, model, version)
        await respond(cycle, response)
    except BaseException as exc:
        protocol.logger.error("Exception in ASGI application\n", exc_info=exc)
        if not cycle.response_started:
            await cycle.send_failed()
        else:
            protocol.transport.close()
    finally:
        cycle.on_response = _nothing
        # NOTE: a task cancelled before its first step (only shutdown cancels, past its
        #   timeout, when nothing waits for the tasks any more) is left in the set.
        #   (Not asyncio.current_task: interpreted on Python 3.11; and the cycle lets go
        #   of its task, which holds it: no reference cycle left for the collector.)
        task = cycle.task
        cycle.task = None
        if task is not None:
            protocol.tasks.discard(task)
