"""What a connection's ModelStreamInfer streams may hold at once, all together.

A stream runs up to 64 of its requests at once and keeps up to 1,024 answers waiting to
leave in order (``front.grpc.streaming``), and a connection may open 1,024 streams: one
client's connection with its window closed held 64,000 requests and their answers, the
front grew by 660 MiB and every other client found the workers' queues full (found by
fuzzing). A connection's streams share one budget, as its unary calls share its stream
limit: ``LIMIT`` requests read and not yet answered to the client (running, or answered
and waiting to be sent), and ``LIMIT_BYTES`` of those answers. Past either, no stream of
the connection reads another request until something leaves.

The HTTP/2 connection (``front.grpc.h2.connection_state``) makes one; the private
socket on which other fronts forward their clients' requests has none (many clients).
"""

from __future__ import annotations

import asyncio

__all__ = ["LIMIT", "LIMIT_BYTES", "StreamBudget"]

#: A connection's stream requests read and not yet sent back (its unary calls' bound: the
#: streams it may open, ``MAX_CONCURRENT_STREAMS``).
LIMIT = 1024
#: Their answers' bytes waiting to be sent (at least one answer, however large).
LIMIT_BYTES = 64 << 20


class StreamBudget:
    """A connection's stream requests not yet answered to the client, and their answers'
    bytes; room for one more."""

    __slots__ = ("requests", "held_bytes", "limit", "limit_bytes", "_room")

    def __init__(self, limit: int = LIMIT, limit_bytes: int = LIMIT_BYTES) -> None:
        self.requests = 0
        self.held_bytes = 0
        self.limit = limit
        self.limit_bytes = limit_bytes
        self._room: asyncio.Event | None = None

    def take(self) -> None:
        """A request read."""
        self.requests += 1

    def hold(self, nbytes: int) -> None:
        """A request answered: its answer waits to be sent."""
        self.held_bytes += nbytes

    def give(self, requests: int, nbytes: int) -> None:
        """Requests whose answers were sent (or dropped), and their answers' bytes."""
        self.requests -= requests
        self.held_bytes -= nbytes
        if self._room is not None and self._has_room():
            self._room.set()

    def _has_room(self) -> bool:
        return self.requests < self.limit and (
            self.held_bytes < self.limit_bytes or self.held_bytes <= 0
        )

    async def room(self) -> None:
        """Return once the connection may read one more request (at once when it may)."""
        while not self._has_room():
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()
