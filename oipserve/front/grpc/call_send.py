"""A call's reply written on its stream (``front.grpc.call``'s layers: ``call_state``).

A small reply is joined and written at once. A larger one goes part after part as the
windows allow, never copied, in steps that count as taken by the client, bounded in time
as a REST response is (``--send-timeout`` plus a second per ``--min-transfer-rate``
bytes taken): a client that keeps its window closed cannot hold a reply (views of a
worker's output segment) for the life of its connection.
"""

from __future__ import annotations

import asyncio
from typing import Final

from oipserve.errors import PayloadTooLarge
from oipserve.front.grpc.call_state import CallState
from oipserve.front.grpc.h2.frames import (
    MESSAGE_PREFIX,
    RESPONSE_HEADERS,
    TRAILERS_OK,
    ErrorCode,
)
from oipserve.runtime.off_loop import unmap_off_loop

#: Replies up to this size are written at once, without waiting on windows.
_SMALL_REPLY: Final = 64 * 1024
#: A larger reply is handed to the connection in steps of this, each counted as taken by
#: the client once it is sent: a client reading at ``--min-transfer-rate`` (64 KiB/s)
#: shows progress every 4 s, well within ``--send-timeout``.
_SEND_STEP: Final = 256 * 1024
#: Steps sent between two turns of the loop for others (1 MiB, as the connection's own
#: ``_SEND_SLICE``: its count starts again with every step).
_STEPS_A_TURN: Final = 4


class CallSender(CallState):
    """A call's layer that writes its reply's messages (``_send``)."""

    __slots__ = ()

    def _answer_at_once(self, data: bytes) -> bool:
        """A unary call's small reply answered whole: its headers, its message and the OK
        trailers in one go (``Connection.send_reply``: one write, at once when no other
        call of the connection is open). False, nothing sent, where the windows or the
        frame size do not allow it, or the call ended meanwhile: ``_send`` and ``_finish``
        then answer it as any other."""
        size = len(data)
        if self._done or size > _SMALL_REPLY or size > self._table.send_limit:
            return False
        message = MESSAGE_PREFIX.pack(0, size) + data
        if not self._conn.send_reply(self, self._stream, RESPONSE_HEADERS, message, TRAILERS_OK):
            return False
        self._sent_head = self._done = True
        self._stop_timer()
        self._close_stream()
        return True

    async def _send(self, parts: list[bytes | memoryview], first: bool) -> None:
        """One message, its wire bytes in ``parts``: joined when small, else sent one
        part after another as the windows allow (a large one is never copied).

        A part in memory of its own (a reply gathered in a thread, a mapped message) is
        unmapped in a thread once the transport has handed it to the kernel, or at once
        when nothing is sent from it (too large, the call gone).
        """
        try:
            size = sum(memoryview(part).nbytes for part in parts)
            limit = self._table.send_limit
            if size > limit:
                raise PayloadTooLarge(f"Sent message larger than max ({size} vs. {limit})")
            conn, stream = self._conn, self._stream
            if first:
                conn.send_headers(stream, RESPONSE_HEADERS)
                self._sent_head = True
            prefix = MESSAGE_PREFIX.pack(0, size)
            if size <= _SMALL_REPLY and conn.send_small(self, stream, b"".join([prefix, *parts])):
                return
            progress = self._send_timer()
            try:
                await conn.send_data(self, stream, memoryview(prefix))
                for part in parts:
                    await self._send_part(memoryview(part), progress)
                if any(type(part) is memoryview for part in parts):
                    await conn.sent()  # the transport holds views of them until then
            finally:
                progress.timer.cancel()
        finally:
            for part in parts:
                unmap_off_loop(part)

    async def _send_part(self, view: memoryview, progress: _Sending) -> None:
        """One part of a large reply, in steps whose bytes count as taken by the client.

        NOTE: a coroutine of its own, so that no view of the part outlives it in ``_send``'s
        frame: ``unmap_off_loop`` there unmaps it in a thread only once nothing views it.
        """
        conn, stream = self._conn, self._stream
        for step, pos in enumerate(range(0, len(view), _SEND_STEP), 1):
            await conn.send_data(self, stream, view[pos : pos + _SEND_STEP])
            progress.sent += min(_SEND_STEP, len(view) - pos)
            if step % _STEPS_A_TURN == 0:
                await asyncio.sleep(0)

    def _send_timer(self) -> _Sending:
        """A reply waiting on windows is bounded in time, as a REST response is:
        ``--send-timeout`` plus a second per ``--min-transfer-rate`` bytes the client has
        taken of it. A client that keeps its window closed would otherwise hold the reply
        (views of a worker's output segment) for the life of its connection; its size
        buys no time (a second per 64 KiB of it held a 200 MB image reply for an hour).
        Set only when a reply cannot leave at once: a small one sent whole costs none."""
        loop = asyncio.get_running_loop()
        progress = _Sending(loop.time())
        progress.timer = loop.call_later(self._table.send_timeout, self._send_expired, progress)
        return progress

    def _send_expired(self, progress: _Sending) -> None:
        """The client took too long to read the reply: the stream is reset (CANCEL) and the
        call's task cancelled, which lets go of the reply's memory (``_send``)."""
        if self._done:
            return
        table, loop = self._table, asyncio.get_running_loop()
        until = progress.since + table.send_timeout + progress.sent / table.min_transfer_rate
        if loop.time() < until:  # it took enough meanwhile: the deadline moves on
            progress.timer = loop.call_later(until - loop.time(), self._send_expired, progress)
            return
        self.reset()
        self._conn.reset_stream(self._stream, ErrorCode.CANCEL)


class _Sending:
    """A large reply's progress: when its send began, the bytes the client has taken, and
    the timer that ends it (``Call._send_timer``)."""

    __slots__ = ("since", "sent", "timer")

    def __init__(self, since: float) -> None:
        self.since = since
        self.sent = 0
        self.timer: asyncio.TimerHandle  # set by ``Call._send_timer``, which makes it
