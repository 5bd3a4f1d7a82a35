"""A front's link to a worker that is not there: what it sends is kept and read back."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec

from oipserve.pool.link import WorkerLink
from oipserve.wire.framing import FrameSplitter
from oipserve.wire.messages import ToWorker


class LinkToNoWorker:
    """A live ``WorkerLink`` (on the running loop) whose transport keeps what is written."""

    def __init__(self) -> None:
        self.link = WorkerLink(1, "cpu", "oipserve-0-w1-")
        self.link.alive, self.link._loop = True, asyncio.get_running_loop()
        self.written: list[bytes] = []
        transport = SimpleNamespace(write=self.written.append, abort=lambda: None)
        self.link.transport = transport  # type: ignore[assignment]

    def sent(self) -> list[object]:
        """The messages the link sent, and those queued to send, in order."""
        decoder = msgspec.msgpack.Decoder(ToWorker)
        stream = b"".join(self.written) + bytes(self.link._outbox)
        return [decoder.decode(body) for body in FrameSplitter().feed(stream)]
