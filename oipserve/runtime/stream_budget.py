"""What a connection's ModelStreamInfer streams may hold at once, all together.

A stream runs up to 64 of its requests at once and keeps up to 1,024 answers waiting to
leave in order (``front.grpc.streaming``), and a connection may open 1,024 streams: one
client's connection with its windows closed held 64,000 requests and their answers, the
front grew by 660 MiB and every other client found the workers' queues full (found by
fuzzing). A connection's streams share one budget, as its unary calls share its stream
limit: ``LIMIT`` requests running or answered and held back by the client (its window
closed), and ``LIMIT_BYTES`` of those answers; besides, ``BEHIND`` answers waiting for an
earlier request of their stream that still runs (a sequence's START waiting for a slot:
not the client's doing, and another stream's request may be what frees it), and
``BEHIND_BYTES`` of what they cost (their bytes, and ``ANSWER_COST`` each). Past any of
them, no stream of the connection reads another request until something leaves.

The HTTP/2 connection (``front.grpc.h2.connection_state``) makes one; the private
socket on which other fronts forward their clients' requests has none (many clients).
"""

from __future__ import annotations

import asyncio

__all__ = ["ANSWER_COST", "BEHIND", "BEHIND_BYTES", "LIMIT", "LIMIT_BYTES", "StreamBudget"]

#: A connection's stream requests running, or answered and not yet taken by the client
#: (its unary calls' bound: the streams it may open, ``MAX_CONCURRENT_STREAMS``).
LIMIT = 1024
#: Their answers' bytes (at least one answer, however large).
LIMIT_BYTES = 64 << 20
#: Answers waiting for an earlier request of their stream, still running; and what they
#: cost the front, their bytes and ``ANSWER_COST`` each. A stream counts its own only
#: while none of its requests waits for a sequence slot (``front.grpc.stream_window``):
#: the slot may be freed only by a request the stream has yet to read, and then their
#: count stops nothing but this bound, of bytes.
BEHIND = 64 * LIMIT
BEHIND_BYTES = 256 << 20
#: What an answer held costs the front besides its bytes (its finished task, its entry in
#: the stream's queue): an empty answer is not free.
ANSWER_COST = 1024


class StreamBudget:
    """What a connection's streams hold; room for one more request."""

    __slots__ = ("requests", "behind", "held_bytes", "behind_bytes", "limit", "limit_bytes",
                 "limit_behind", "limit_behind_bytes", "_room")  # fmt: skip

    def __init__(
        self,
        limit: int = LIMIT,
        limit_bytes: int = LIMIT_BYTES,
        limit_behind: int = BEHIND,
        limit_behind_bytes: int = BEHIND_BYTES,
    ) -> None:
        self.requests = 0
        self.behind = 0
        self.held_bytes = 0
        self.behind_bytes = 0
        self.limit = limit
        self.limit_bytes = limit_bytes
        self.limit_behind = limit_behind
        self.limit_behind_bytes = limit_behind_bytes
        self._room: asyncio.Event | None = None

    def change(self, requests: int, behind: int, nbytes: int, behind_bytes: int = 0) -> None:
        """A stream's charge changed by so much (``front.grpc.stream_window``)."""
        self.requests += requests
        self.behind += behind
        self.held_bytes += nbytes
        self.behind_bytes += behind_bytes
        if self._room is not None and self._has_room():
            self._room.set()

    def _has_room(self) -> bool:
        return (
            self.requests < self.limit
            and self.behind < self.limit_behind
            and (self.held_bytes < self.limit_bytes or self.held_bytes <= 0)
            and (self.behind_bytes < self.limit_behind_bytes or self.behind <= 1)
        )

    async def room(self) -> None:
        """Return once the connection may read one more request (at once when it may)."""
        while not self._has_room():
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()
