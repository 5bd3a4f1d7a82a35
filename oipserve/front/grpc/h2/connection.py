"""One client's HTTP/2 connection: frames in, streams, flow control both ways, frames out.

Every stream is a gRPC call (``call.Call``) or, on the REST port, an ASGI request
(``front.http.h2_asgi``); this package knows nothing of either beyond ``Stream``.

A connection is one object, built in layers, one job a module, each a class over the one
below (no layer wraps another), read from the bottom up as a call's are:
``connection_state`` holds the state and ends streams and the connection (RST_STREAM,
stream errors, the flood budget, GOAWAY, the close); ``connection_send`` writes header
blocks and DATA under the peer's windows and applies its WINDOW_UPDATE frames;
``connection_receive`` handles every frame the peer sends and keeps the receive windows;
this module is asyncio's protocol: the socket made and lost, its bytes handed to the
frames, and when it is read. It is not read while the client does not read
(``pause_writing``), nor while 16 of its cancelled requests still run in the workers
(``runtime.abandoned_work``: the calls' tasks run in a context that counts them, ``run``),
and it lets the loop run others after each 1 MiB read.

PERF: all frames written in one loop iteration leave in one write (``_out``, an
``http_io.CorkedTransport``, as for HTTP/1.1), and the answer of the connection's only
open call leaves as it is written (``send_reply``), with no loop turn spent on a flush; a
tiny call costs one header-block lookup, one task, and no await for windows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final, cast

from mypy_extensions import mypyc_attr

from oipserve.front.grpc.h2.connection_receive import ConnectionReceiver
from oipserve.front.grpc.h2.connection_state import (
    MAX_FRAME,
    MAX_STREAMS,
    PREFACE_TIMEOUT,
    Linger,
    Stream,
)
from oipserve.front.grpc.h2.frames import (
    DEFAULT_WINDOW,
    ErrorCode,
    ProtocolError,
    Setting,
    settings_frame,
    window_update,
)
from oipserve.front.grpc.h2.headers import MAX_HEADER_LIST
from oipserve.front.grpc.h2.receive_windows import CONNECTION_WINDOW, STREAM_WINDOW
from oipserve.runtime.abandoned_work import LIMIT
from oipserve.runtime.http_io import CorkedTransport

log = logging.getLogger("oipserve.grpc")

#: Bytes read before the connection lets the loop run others: libuv reads a socket up
#: to 32 times a wake-up (7.5 MB measured in one turn, 64 MiB uploads), all copied into
#: their segments while every other client of the loop waited.
_READ_SLICE: Final = 1024 * 1024

_SETTINGS: Final = settings_frame(
    {
        Setting.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
        Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        Setting.MAX_FRAME_SIZE: MAX_FRAME,
        Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
        Setting.ENABLE_PUSH: 0,
    }
) + window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW)


# NOTE: compiled (mypyc), and extended by ``front.http.h2_connection.Http2Connection``,
#   which is not.
@mypyc_attr(allow_interpreted_subclasses=True)
class Connection(ConnectionReceiver):
    """The HTTP/2 server side of one client connection."""

    def __init__(
        self,
        new_stream: Callable[[Connection, int], Stream],
        closed: Callable[[Connection], None],
        preface_timeout: float = PREFACE_TIMEOUT,
        linger: Linger | None = None,
        one_client: bool = True,
    ) -> None:
        super().__init__(preface_timeout, linger, one_client)
        #: What runs a new stream (a gRPC call, a REST request), and who is told when
        #: the connection is gone.
        self._new_stream = new_stream
        self._closed = closed

    # ---- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # NOTE: asyncio types the hook for every protocol; a stream protocol's transport is
        #   a Transport (uvloop's is too, though not a subclass).
        self.transport = cast(asyncio.Transport, transport)
        self._out = CorkedTransport(self.transport, self._loop)
        self._write(_SETTINGS)
        self._flood_since = self._loop.time()

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        if self._pending:
            data = self._pending + data
            self._pending = b""
        try:
            end = self._frames(memoryview(data))
        except ProtocolError as exc:
            log.debug("gRPC connection closed: %s", exc)
            self._abort(exc.code, str(exc))
            return
        except Exception:
            log.exception("unexpected error on a gRPC connection; it is closed")
            self._abort(ErrorCode.INTERNAL_ERROR, "internal server error")
            return
        if end < len(data):
            self._pending = data[end:]
        self._read_slice += len(data)
        if self._read_slice >= _READ_SLICE:
            self._read_slice = 0
            self._yield_reading()

    def pause_writing(self) -> None:
        # NOTE: no reading while the client does not read: a client that sends calls and
        #   never reads their answers would otherwise grow the transport's buffer without
        #   bound (uvicorn does the same for HTTP/1.1).
        self._paused = True
        self._can_send.clear()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        self._can_send.set()
        self._resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._can_send.set()  # senders find the connection gone
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.reset()
        self._closed(self)

    def _open_stream(self, stream: int) -> Stream:
        return self._new_stream(self, stream)

    # ---- when the socket is read ----------------------------------------------------

    def _yield_reading(self) -> None:
        """No more reads this loop turn: the loop's other clients get their turn first."""
        transport = self.transport
        if transport is not None and not self._paused and not transport.is_closing():
            transport.pause_reading()
            self._loop.call_soon(self._resume_reading)

    def _resume_reading(self) -> None:
        transport = self.transport
        if (
            transport is not None
            and not self._paused
            and not self.abandoned.holding
            and not transport.is_closing()
        ):
            transport.resume_reading()

    def _hold_reading(self) -> None:
        """No reading while the client's abandoned requests run (``abandoned``); said
        once a connection, so that a client stalled so has a line in the log."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.pause_reading()
        if not self._held_before:
            self._held_before = True
            log.info(
                "HTTP/2 connection from %s not read while %d of its cancelled requests still "
                "run in the workers; read again once %d are left (logged once a connection)",
                transport.get_extra_info("peername"),
                self.abandoned.running,
                LIMIT // 2,
            )

    def run(self, call: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A call's task, in a context of its own that knows this connection's
        ``abandoned`` requests."""
        return self._loop.create_task(call, context=self._context.copy())

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The connection's event loop (PERF: ``asyncio.get_running_loop()`` makes a
        ``getpid()`` system call on each use)."""
        return self._loop

    @property
    def opened(self) -> int:
        """The highest stream id the client opened: it grows with every call, so the
        keepalive sees calls that began and ended between two of its looks."""
        return self._ids.last
