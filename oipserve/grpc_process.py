"""A gRPC process (``--grpc-processes N``): the gRPC port, every call forwarded to the front.

The front starts it (``oipserve.grpc_relay.processes``) with one end of a socket
pair. The first frame brings the settings and the port; the process binds it
(with ``SO_REUSEPORT`` when several processes share it), says ``Listening`` and
from then on forwards each call's raw request bytes to the front and sends back
the bytes or the error the front answers. It speaks HTTP/2 with the front's own
implementation (``oipserve.grpc_h2``), so what a client sees is what the front would
have answered in-process: the restriction check, message limits, compression and
deadlines are checked here, the rest is the front's.

It stops when the front says ``Stop`` or on SIGTERM, letting running calls finish
(``GrpcServer.stop``), and at once when its socket to the front closes (the front
is gone: nothing could be answered any more). It imports no data plane and no
ONNX Runtime (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import signal
import socket
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import uvloop

from oipserve.collector import settle_garbage_collector
from oipserve.errors import Unavailable, from_kind
from oipserve.grpc_front.server import RPCS, STREAM_RPC, GrpcServer, Method, arrived
from oipserve.grpc_h2.call_table import CallTable
from oipserve.grpc_h2.server import H2Server
from oipserve.grpc_relay.frames import (
    MAPPED,
    Call,
    Cancel,
    Failed,
    FrameProtocol,
    Header,
    Listening,
    Payload,
    Reply,
    Start,
    Stop,
)
from oipserve.memory_trim import MemoryTrimmer, return_large_blocks_to_os
from oipserve.settings import Settings, configure_logging

log = logging.getLogger("oipserve.grpc_process")

#: How long the process waits for its settings before giving up on the front.
_START_WAIT = 60.0


class FrontLink(FrameProtocol):
    """This process's end of the socket: calls out, replies back to their callers.

    Payloads below ``MAPPED`` are read into one buffer kept from frame to frame (no fresh
    pages to fault in, no zeroing) and copied out; larger ones into memory of their own,
    which the reply is sent from.
    """

    def __init__(self) -> None:
        super().__init__()
        self._spare = bytearray()
        loop = asyncio.get_running_loop()
        self._waiting: dict[int, asyncio.Future[tuple[Reply, Payload]]] = {}
        self._ids = itertools.count()
        self.started: asyncio.Future[tuple[Start, bytes]] = loop.create_future()
        #: Set by ``Stop``, with the time running calls get to finish.
        self.stop_requested = asyncio.Event()
        self.stop_timeout: float | None = None
        self.closed = asyncio.Event()

    def memory_for(self, header: Header, length: int) -> memoryview | None:
        if length >= MAPPED:
            return None
        if len(self._spare) < length:
            self._spare = bytearray(length)
        return memoryview(self._spare)[:length]

    def frame_received(self, header: Header, payload: Payload) -> None:
        if type(header) is Reply:
            waiting = self._waiting.pop(header.id, None)
            if waiting is not None and not waiting.done():
                # NOTE: a payload below MAPPED is a view of the buffer reused for the next
                #   frame: copied. A larger one has memory of its own and is sent as it is.
                waiting.set_result((header, payload if len(payload) >= MAPPED else bytes(payload)))
        elif type(header) is Start and not self.started.done():
            self.started.set_result((header, bytes(payload)))
        elif type(header) is Stop:
            self.stop_timeout = header.timeout
            self.stop_requested.set()

    async def call(self, method: str, request: Payload) -> Payload:
        """Forward one call; its response bytes, or its error raised as the front raised it."""
        if self.closed.is_set():
            raise Unavailable("the server is shutting down")
        call_id = next(self._ids)
        answer: asyncio.Future[tuple[Reply, Payload]] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = answer
        self.send(Call(call_id, method), request)
        try:
            reply, payload = await answer
        except asyncio.CancelledError:
            if self._waiting.pop(call_id, None) is not None:
                self.send(Cancel(call_id))
            raise
        if reply.kind is not None:
            raise from_kind(reply.kind, reply.message)
        return payload

    def connection_lost(self, exc: Exception | None) -> None:
        gone = Unavailable("the server is shutting down")
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(gone)
        self._waiting.clear()
        if not self.started.done():
            self.started.cancel()
        self.closed.set()


class Forwarding:
    """This process's call table, every RPC forwarded as bytes, and what its drain counts."""

    def __init__(self, link: FrontLink) -> None:
        self.link = link
        self.active = 0
        self.arriving: deque[float] = deque()
        self.closing = asyncio.Event()

    async def infer(self, request: Payload) -> Payload:
        self.active += 1
        try:
            return await self.link.call("ModelInfer", request)
        finally:
            self.active -= 1

    def table(self, settings: Settings) -> CallTable:
        """Every RPC forwarded as it came (the front logs failures; they are not logged
        twice); the front parses the messages, so a stream's requests stay bytes here."""
        methods: dict[str, Method] = {}
        for name in RPCS:
            if name == STREAM_RPC:
                continue
            if name == "ModelInfer":
                methods[name] = Method(arrived(self.arriving, _same), self.infer, _same)
            else:
                methods[name] = Method(_same, self._forward(name), _same)
        return CallTable(
            settings,
            methods,
            self.infer,
            self.arriving,
            self.closing,
            pool=None,
            log_failures=False,
        )

    def _forward(self, method: str) -> Callable[[Payload], Awaitable[Payload]]:
        async def forward(request: Payload) -> Payload:
            return await self.link.call(method, request)

        return forward


def _same(payload: Payload) -> Payload:
    return payload


async def serve(link_fd: int) -> int:
    loop = asyncio.get_running_loop()
    link = FrontLink()
    transport, _ = await loop.connect_accepted_socket(lambda: link, socket.socket(fileno=link_fd))
    try:
        start, payload = await asyncio.wait_for(asyncio.shield(link.started), _START_WAIT)
    except (TimeoutError, asyncio.CancelledError):
        return 1
    settings = msgspec.json.decode(payload, type=Settings)
    configure_logging(settings)
    # The front's malloc settings, for the same reasons (oipserve.memory_trim): messages
    # below 8 MiB reuse the heap instead of faulting in fresh pages, larger ones and what
    # a refused compressed message inflated go back to the system.
    return_large_blocks_to_os()
    trimmer = MemoryTrimmer()
    trimmer.start()
    try:
        return await _serve(link, transport, start, settings)
    finally:
        await trimmer.stop()


async def _serve(
    link: FrontLink, transport: asyncio.BaseTransport, start: Start, settings: Settings
) -> int:
    loop = asyncio.get_running_loop()
    forwarding = Forwarding(link)
    own = H2Server(forwarding.table(settings))
    server = GrpcServer(own, forwarding)
    try:
        port = await own.serve(settings.host, start.port, start.reuse_port)
    except RuntimeError as exc:
        link.send(Failed(str(exc)))
        transport.close()
        return 3
    link.send(Listening(port))
    terminated = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, terminated.set)
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # the front decides; see workerproc
    settle_garbage_collector()
    waits = [
        asyncio.ensure_future(link.stop_requested.wait()),
        asyncio.ensure_future(terminated.wait()),
        asyncio.ensure_future(link.closed.wait()),
    ]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    if link.closed.is_set():
        log.error("the front process is gone; stopping")
        await own.stop(0)
        return 1
    timeout = link.stop_timeout
    await server.stop(settings.shutdown_timeout if timeout is None else timeout)
    transport.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oipserve.grpc_process")
    parser.add_argument("--link-fd", type=int, required=True, help="socket to the front")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(args.link_fd))


if __name__ == "__main__":
    sys.exit(main())
