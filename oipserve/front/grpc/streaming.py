"""ModelStreamInfer: requests of one stream run concurrently, responses leave in order.

The loop takes a function from a request to the serialized ModelInferResponse
(``handlers.stream_infer``) and yields ModelStreamInferResponses as wire bytes in parts
(the field's tag and length, then the message as it came), so no response is parsed or
copied again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from oipserve.front.grpc.handler_context import Context
from oipserve.front.grpc.status import log_failure, status_of
from oipserve.front.grpc.varint import varint_bytes
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.runtime.stream_budget import StreamBudget

Request = TypeVar("Request")

#: ModelStreamInferResponse.infer_response (field 2), length-delimited.
_INFER_RESPONSE_TAG = bytes([(2 << 3) | 2])
#: Requests of one stream that may run at once before reading the stream waits.
_RUNNING = 64
#: Answers of one stream that may wait for an earlier request's (answers leave in order)
#: before reading the stream waits: so many, and so many bytes (at least one, however large).
_HELD = 1024
_HELD_BYTES = 64 << 20


#: One response of the stream: its wire bytes, in parts to be sent one after another.
Response = list[bytes | memoryview]


def infer_response(serialized: bytes | memoryview) -> Response:
    """A ModelStreamInferResponse carrying a serialized ModelInferResponse, neither parsed
    nor copied: the field's tag and length, then the message itself."""
    return [_INFER_RESPONSE_TAG + varint_bytes(memoryview(serialized).nbytes), serialized]


class StreamRequestFailed(Exception):
    """A stream's request failed: ``cause`` says how, ``request_id`` is its ``id``, which
    the in-band error carries back (Triton's, so that a client knows which request failed;
    it was left out here, found by fuzzing)."""

    def __init__(self, cause: Exception, request_id: str) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.request_id = request_id


def error_response(message: str, request_id: str = "") -> bytes:
    """A stream's in-band error, as Triton writes it: ``error_message``, and an
    ``infer_response`` holding only the request's ``id``."""
    response = pb.ModelStreamInferResponse(error_message=message)
    response.infer_response.id = request_id
    return response.SerializeToString()


def strict_errors(context: Context) -> bool:
    """Triton's ``triton_grpc_error: true`` header: a failure ends the stream with its status."""
    metadata = context.invocation_metadata() or ()
    return any(k == "triton_grpc_error" and v == "true" for k, v in metadata)


async def ordered_responses(
    requests: AsyncIterator[Request],
    infer: Callable[[Request], Awaitable[bytes | memoryview]],
    closing: asyncio.Event,
    context: Context,
    budget: StreamBudget | None = None,
) -> AsyncIterator[Response]:
    """Requests run concurrently; responses come back in request order. ``budget``: what
    this stream's connection may run at once across its streams (None: no bound).

    A failed request is answered in-band (``error_message``) and the stream goes
    on, as Triton does; a client that sent the ``triton_grpc_error: true`` header
    instead gets the failure as the stream's status. Once ``closing`` is set
    (shutdown) the stream ends when every request read so far is answered.
    """
    strict = strict_errors(context)
    pending: asyncio.Queue[asyncio.Task[bytes | memoryview] | None] = asyncio.Queue()
    window = _Window(budget)

    async def read() -> None:
        try:
            while True:
                await window.room()
                try:
                    request = await requests.__anext__()
                except StopAsyncIteration:
                    break
                task = asyncio.ensure_future(infer(request))
                # NOTE: a stream torn down (reset, connection lost) drops the tasks it has
                #   not answered, some of them failed already: _forget reads each failure,
                #   or asyncio would log it as "never retrieved". Answering still sees it.
                task.add_done_callback(_forget)
                window.started(task)
                pending.put_nowait(task)
                # NOTE: held here until the next request came, it would keep its message's
                #   memory viewed after its response went (and unmapping it in a thread).
                del request
        finally:
            pending.put_nowait(None)

    reader = asyncio.ensure_future(read())
    closed = asyncio.ensure_future(closing.wait())
    getter: asyncio.Future[Any] | None = None
    try:
        while True:
            if closing.is_set() and pending.empty():
                break  # shutting down, and every request so far is answered
            getter = asyncio.ensure_future(pending.get())
            if not closing.is_set():
                await asyncio.wait((getter, closed), return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
            task = await getter
            if task is None:
                await reader  # surfaces a broken request stream
                break
            window.awaiting(task)
            try:
                response = await task
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                window.sent(task)
                request_id = ""
                if isinstance(exc, StreamRequestFailed):
                    request_id, exc = exc.request_id, exc.cause
                code, message = status_of(exc)
                log_failure("ModelStreamInfer", code, message, exc)
                if strict:
                    await context.abort(code, message)
                yield [error_response(message, request_id)]
                continue
            window.sent(task)
            yield infer_response(response)
    finally:
        window.close()
        reader.cancel()
        reader.add_done_callback(_forget)
        closed.cancel()
        if getter is not None:
            getter.cancel()  # if still waiting for the next request
        while not pending.empty():
            task = pending.get_nowait()
            if task is not None:
                task.cancel()


class _Window:
    """How much of a stream may be read and not yet answered: requests running, and answers
    waiting for an earlier request's. Reading waits while either is full, or while the
    connection's ``budget`` is.

    Answers waiting used to count as running (64 in all): a request that waits long (a
    sequence's START waiting for a slot) with 64 answered behind it stopped the reading,
    and the request that would free the slot (another sequence's END, later on the same
    stream) was never read until that sequence expired (found by fuzzing).

    What the stream holds is charged to its connection's budget (``_charge``): its running
    requests, and its answers waiting, as the client's while the stream sends (its window
    may be closed: the client holds them back), as the server's while it waits for a request
    still running (the budget's ``behind``). One stream's answers waiting behind a START
    held the budget that another stream's END, which would free the slot, needed to be
    read (found by fuzzing).
    """

    def __init__(self, budget: StreamBudget | None) -> None:
        self.running = 0
        self.held = 0
        self.held_bytes = 0
        #: The oldest request, whose answer goes next, is still running.
        self.head_running = False
        self._budget = budget
        #: What is charged to ``budget`` now: requests, answers behind a running head,
        #: bytes of the answers waiting.
        self._charged = (0, 0, 0)
        self._room = asyncio.Event()
        self._room.set()

    def started(self, task: asyncio.Task[bytes | memoryview]) -> None:
        self.running += 1
        task.add_done_callback(self._finished)
        self._update()

    def _finished(self, task: asyncio.Task[bytes | memoryview]) -> None:
        self.running -= 1
        self.held += 1
        self.held_bytes += _answer_bytes(task)
        self._update()

    def awaiting(self, task: asyncio.Task[bytes | memoryview]) -> None:
        """The answer to send next is ``task``'s."""
        self.head_running = not task.done()
        self._update()

    def sent(self, task: asyncio.Task[bytes | memoryview]) -> None:
        """``task``'s answer has left (the counts may pass below 0 for a moment: a task's
        done callbacks may run after its awaiter resumed)."""
        self.held -= 1
        self.held_bytes -= _answer_bytes(task)
        self.head_running = False
        self._update()

    def close(self) -> None:
        """The stream is over: what it still holds leaves the connection's budget."""
        self.running = self.held = self.held_bytes = 0
        self._charge()
        self._budget = None

    def _update(self) -> None:
        self._charge()
        if self.running < _RUNNING and self.held < _HELD and self.held_bytes < _HELD_BYTES:
            self._room.set()
        else:
            self._room.clear()

    def _charge(self) -> None:
        budget = self._budget
        if budget is None:
            return
        held = max(self.held, 0)
        if self.head_running:
            charge = (self.running, held, 0)
        else:
            charge = (self.running + held, 0, max(self.held_bytes, 0))
        if charge != self._charged:
            budget.change(
                charge[0] - self._charged[0],
                charge[1] - self._charged[1],
                charge[2] - self._charged[2],
            )
            self._charged = charge

    async def room(self) -> None:
        """Return once this stream and its connection have room for one more request."""
        while True:
            await self._room.wait()
            if self._budget is None:
                return
            await self._budget.room()
            if self._room.is_set():
                return


def _answer_bytes(task: asyncio.Task[bytes | memoryview]) -> int:
    if task.cancelled() or task.exception() is not None:
        return 0
    return memoryview(task.result()).nbytes


def _forget(task: asyncio.Future[Any]) -> None:
    """Mark a task's failure, if any, as read (it may be dropped unanswered)."""
    if not task.cancelled():
        task.exception()
