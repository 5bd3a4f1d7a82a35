"""Either end of a socket between two fronts: the control socket, a batch socket.

Framed like the workers' sockets (``oipserve.wire.framing.frame``: a length, then
msgpack); each end decodes what it receives with the decoder of the messages that side
gets and hands each to ``on_message``. What one turn of the loop sends goes in one write,
at the turn's end or at an earlier ``flush``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, Generic, TypeVar, cast

import msgspec

from oipserve.wire.framing import FrameSplitter, frame

__all__ = ["FramedProtocol"]

_ENCODER: Final = msgspec.msgpack.Encoder()


#: What a socket's end receives (``control.ToReplica`` in a replica, ``control.FromReplica``
#: in the primary; ``batch_wire``'s messages on a batch socket).
Incoming = TypeVar("Incoming")


class FramedProtocol(asyncio.Protocol, Generic[Incoming]):
    """Either end of a control or batch socket: frames in to ``on_message``, ``send`` out."""

    def __init__(
        self,
        decoder: msgspec.msgpack.Decoder[Incoming],
        on_message: Callable[[Incoming], None],
        on_closed: Callable[[], None],
    ) -> None:
        self._decoder = decoder
        self._on_message = on_message
        self._on_closed = on_closed
        self._splitter = FrameSplitter()
        self.transport: asyncio.Transport | None = None
        #: Frames sent during this turn of the loop, written together at its end.
        self._outgoing: list[bytes] = []
        #: Set when the connection is made (made in the loop's thread, no system call).
        self._loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (asyncio types the hook for every protocol; a stream's transport is a Transport)
        self.transport = cast(asyncio.Transport, transport)
        # PERF: asyncio.get_running_loop() makes a getpid() system call on each use.
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        for body in self._splitter.feed(data):
            self._on_message(self._decoder.decode(body))

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_closed()

    def send(self, message: object) -> None:
        """Queue ``message``; what is sent during one turn of the loop goes in one write,
        at the turn's end or at ``flush``.

        PERF: the batch sockets carry a message per request each way. A replica's
        requests written one by one each woke the primary once, and its batcher took the
        requests of one turn of the replica's loop in as many turns of its own, forming
        smaller batches. The answers back are flushed by the batcher as soon as a batch's
        crossed answers are queued (``batch_desk``): the turn's end came after the
        primary's own responses (``docs/scaling.md``, "Batches formed across fronts").
        """
        transport = self.transport
        loop = self._loop
        if transport is None or loop is None or transport.is_closing():
            return
        if not self._outgoing:
            loop.call_soon(self.flush)
        self._outgoing.append(frame(_ENCODER, message))

    def flush(self) -> None:
        """Write what was sent and not written yet, in one write (nothing: no write)."""
        outgoing = self._outgoing
        if not outgoing:
            return
        self._outgoing = []
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(b"".join(outgoing) if len(outgoing) > 1 else outgoing[0])
