"""A call's method run (``front.grpc.call``'s layers: ``call_state``).

A unary call runs once its one message is whole: inflated if compressed, parsed, its
lease handed to the service, answered, or forwarded to the primary front. A stream's
handler takes its messages from the queue the messages were read into, and its responses
are written in request order (``streaming.ordered_responses``); each request message
received into memory of its own is unmapped in a thread once it is answered (``_answer``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc

from oipserve.errors import SHUTDOWN_STREAM
from oipserve.front.grpc.call_send import CallSender
from oipserve.front.grpc.call_state import QUEUED
from oipserve.front.grpc.codec import model_named, request_id, wire_bytes
from oipserve.front.grpc.h2.frames import TRAILERS_OK
from oipserve.front.grpc.handler_context import Context
from oipserve.front.grpc.inflate import inflate
from oipserve.front.grpc.rpcs import INFER_RPC, STREAM_RPC
from oipserve.front.grpc.status import log_failure, status_of
from oipserve.front.grpc.stream_window import StreamWindow
from oipserve.front.grpc.streaming import StreamRequestFailed, ordered_responses
from oipserve.front.header_rules import FORWARDED_CONNECTION
from oipserve.request.inference import Parked
from oipserve.runtime.off_loop import unmap_off_loop
from oipserve.runtime.worker_share import WORKER_SHARE, place_in_share

_OK: Final = grpc.StatusCode.OK.value[0]
_UNAVAILABLE: Final = grpc.StatusCode.UNAVAILABLE.value[0]


class CallRunner(CallSender):
    """A call's layer that runs its method: ``_run_unary``, ``_run_stream``."""

    __slots__ = ()

    async def _run_unary(self) -> None:
        method = self._method
        compressed, message, lease, mapped = self._messages.pop()
        payload: Any = None
        try:
            payload = await self._inflated(message) if compressed else message
            if method is None:  # answered by another front
                data: bytes | memoryview = await self._forwarded(bytes(payload))
            else:
                request = method.deserialize(payload)
                table = self._table
                if (
                    table.answers is not None
                    and self._name == INFER_RPC
                    and table.elsewhere(request.message.model_name, request.message.model_version)
                ):  # a model another front serves: its lease stays ours, released below
                    data = await self._forwarded_infer(bytes(payload))
                else:
                    if lease is not None:
                        request.lease, lease = lease, None  # the service owns it now
                    if self._name == INFER_RPC:
                        if self._deadline_at is not None:
                            request.deadline = self._deadline_at  # (workers skip it past that)
                        if self._conn.worker_share is None:  # the private socket's
                            self._count_forwarded()
                    data = await wire_bytes(await method.call(request), method.serialize)
        except asyncio.CancelledError:
            self._cancelled()
            return
        except Exception as exc:
            self._fail_with(exc)
            return
        finally:
            self._release_message(message, lease, mapped)
            if compressed and payload is not None:
                unmap_off_loop(payload)
        if type(data) is bytes and self._answer_at_once(data):
            return
        try:
            await self._send([data], first=True)
        except (asyncio.CancelledError, ConnectionError):
            self._cancelled()
            return
        except Exception as exc:  # too large to send: nothing was sent
            self._fail_with(exc)
            return
        self._finish(TRAILERS_OK)

    def _forwarded(
        self, request: bytes, method: str | None = None, connection: int = 0
    ) -> Awaitable[bytes]:
        """``request`` answered by the primary front, as ``method`` (this call's own by
        default), with this call's metadata and what is left of its deadline; an
        inference marked with ``connection``, its connection's share's serial."""
        forward = self._table.forward
        if forward is None:
            raise RuntimeError(f"{self._name} is to be forwarded by a table that cannot forward")
        left = None
        if self._deadline_at is not None:
            left = max(0.0, self._deadline_at - self._conn.loop.time())
        return forward(method or self._name, request, self._metadata, left, connection)

    async def _forwarded_infer(self, request: bytes, method: str | None = None) -> bytes:
        """An inference forwarded to the primary (a model only it serves: a worker
        endpoint's), in this connection's share of the workers' queues until the primary
        answers (which bounds the bytes its calls hold of the connection's window too),
        and marked with the connection, so that the primary counts it in the share it
        keeps for it until the worker answers (``_count_forwarded``): a call the primary
        ends at its deadline frees its place here at once, but not there while the worker
        has it (counted here alone, such calls from one connection filled the endpoint
        worker's queue)."""
        table = self._table
        deadline = self._deadline_at
        if deadline is None:
            deadline = self._conn.loop.time() + table.infer_timeout
        share = await place_in_share(table.max_share, deadline)
        try:
            return await self._forwarded(request, method, 0 if share is None else share.serial)
        finally:
            if share is not None:
                share.back()

    def _count_forwarded(self) -> None:
        """An inference on the primary's private socket, which another front forwarded
        from one of its client connections: counted in the share the primary keeps for
        that connection (``runtime.worker_share.ForwardedShares``), held from its send to
        the worker until the worker answers, as a connection's of its own; one without the
        mark is counted by no share. The share is this call's task's alone (its context
        is a copy of the connection's)."""
        for key, mark in self._metadata:
            if key == FORWARDED_CONNECTION:
                WORKER_SHARE.set(self._table.forwarded.of(mark, self._conn.loop))
                return

    async def _stream_request(
        self, message: bytes | memoryview, parked: Parked | None
    ) -> bytes | memoryview:
        """One request of a stream, answered here, or as a ModelInfer by the primary when
        its model is not this front's (``CallTable.elsewhere``: no sequence model); in-band
        either way."""
        if self._table.elsewhere(*model_named(message)):
            try:
                return await self._forwarded_infer(bytes(message), INFER_RPC)
            except Exception as exc:  # its in-band error names the request, as here
                raise StreamRequestFailed(exc, request_id(message)) from exc
        return await self._table.stream_infer(message, parked)

    async def _run_stream(self) -> None:
        started = False
        try:
            context = Context(self._metadata)
            table = self._table
            infer = table.stream_infer if table.answers is None else self._stream_request
            window = StreamWindow(self._conn.stream_requests)
            answer = functools.partial(self._answer, infer, self._parking(window))
            requests = self._requests()
            responses = ordered_responses(requests, answer, context, window)
            async for parts in responses:
                await self._send(parts, first=not started)
                started = True
            if not requests.ended:
                # NOTE: the server is stopping (``shutting_down``) and the client has not
                #   ended its side: what it sends next is not served. UNAVAILABLE says so;
                #   it was OK, and a request lost unseen (found by fuzzing).
                self._end(_UNAVAILABLE, SHUTDOWN_STREAM, started)
                return
        except asyncio.CancelledError:
            self._cancelled()
            return
        except ConnectionError:
            return
        except Exception as exc:
            code, message = status_of(exc)
            log_failure(STREAM_RPC, code, message, exc)
            self._end(code.value[0], message, started)
            return
        self._end(_OK, "", started)

    def _parking(self, window: StreamWindow) -> Parked:
        """What the stream's requests tell while one waits for a sequence slot
        (``Inference.parked``): it leaves what the stream holds unanswered, its count
        (``window``) and its bytes (``_backlog``, its window given back), until it is
        placed. Counted, 64 of them stopped the reading, and the request that would free
        a slot (an END, later on the same stream) was never read (found by fuzzing)."""

        def parked(waiting: bool, nbytes: int) -> None:
            window.parked(waiting)
            if waiting:
                self._answered(nbytes)
            else:
                self._backlog += nbytes

        return parked

    async def _answer(
        self,
        infer: Callable[[Any, Parked | None], Awaitable[bytes | memoryview]],
        parked: Parked,
        request: tuple[Any, int],
    ) -> bytes | memoryview:
        """A stream's request answered (its answer then waits for the earlier ones').

        Its message is let go, and its bytes leave the stream's backlog, when it is
        answered, not when its answer leaves: an answer waiting behind a request that
        waits long (a sequence's START waiting for a slot) held the stream's window, and
        the request that would free the slot, later on the stream, was never read (found
        by fuzzing). One received into memory of its own (``MAPPED``) is unmapped in a
        thread, not by its last reference's release on the loop (64 MiB: tens of ms).
        """
        message, size = request
        try:
            return await infer(message, parked)
        finally:
            unmap_off_loop(message)
            self._answered(size)

    def _requests(self) -> _RequestStream:
        if self._queue is None:
            raise RuntimeError(f"the request stream of {self._name} has no queue")
        return _RequestStream(self, self._queue)

    async def _next_request(
        self, queue: asyncio.Queue[tuple[bool, Any] | None]
    ) -> tuple[Any, int] | None:
        """The stream's next request message (inflated) and its size as received; None
        once the server stops (no later message is served: ``shutting_down``);
        StopAsyncIteration once the client is done."""
        item = await queue.get()
        if item is None:
            raise StopAsyncIteration
        compressed, message = item
        item = None
        if self._unparsed is not None and queue.qsize() <= QUEUED // 2:
            self._drain()  # the bytes kept while the handler was behind
            if self._done:  # ended by what was read there (a message over the limit)
                unmap_off_loop(message)
                message = None
        if message is None:  # ``SHUT_ITEM``, or the stream ended
            return None
        size = memoryview(message).nbytes
        if self._unacked and not self._holding_back():
            self._acknowledge()
        if compressed:
            inflated = await self._inflated(message)
            unmap_off_loop(message)
            message = inflated
        return message, size

    def _inflated(self, message: bytes | memoryview) -> Awaitable[bytes | memoryview]:
        return inflate(message, self._encoding, self._table.receive_limit)


class _RequestStream:
    """A stream's request messages for its handler (``CallRunner._next_request``). An
    iterator class: mypyc compiles no async generator."""

    __slots__ = ("_call", "_queue", "ended")

    def __init__(self, call: CallRunner, queue: asyncio.Queue[tuple[bool, Any] | None]) -> None:
        self._call = call
        self._queue = queue
        #: The client ended its side: every request it sent was read.
        self.ended = False

    def __aiter__(self) -> _RequestStream:
        return self

    async def __anext__(self) -> Any:
        if self.ended:
            raise StopAsyncIteration
        try:
            request = await self._call._next_request(self._queue)
        except StopAsyncIteration:
            self.ended = True
            raise
        if request is None:  # the server stops: the client's end may have come meanwhile
            try:
                self.ended = self._queue.get_nowait() is None
            except asyncio.QueueEmpty:
                pass
            raise StopAsyncIteration
        return request
