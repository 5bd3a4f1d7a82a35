"""The asyncio protocols on a worker's sockets, feeding its ``WorkerLink`` (or ``WorkerHandle``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import msgspec

from oipserve.wire.messages import FrameSplitter, FromWorker

if TYPE_CHECKING:
    from oipserve.worker_handle import WorkerHandle
    from oipserve.worker_link import WorkerLink

__all__ = ["HeartbeatProtocol", "MessageProtocol"]

_DECODER = msgspec.msgpack.Decoder(FromWorker)


class MessageProtocol(asyncio.Protocol):
    """Frames from the worker's message socket, decoded and handed to its handle."""

    __slots__ = ("worker", "splitter")

    def __init__(self, worker: WorkerLink) -> None:
        self.worker = worker
        self.splitter = FrameSplitter()

    def data_received(self, data: bytes) -> None:
        for body in self.splitter.feed(data):
            self.worker.on_message(_DECODER.decode(body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.worker.connection_closed()


class HeartbeatProtocol(asyncio.Protocol):
    """The worker's echoes of our heartbeats: each one says it is still responsive."""

    __slots__ = ("worker",)

    def __init__(self, worker: WorkerHandle) -> None:
        self.worker = worker

    def data_received(self, data: bytes) -> None:
        self.worker.answered_heartbeat()
