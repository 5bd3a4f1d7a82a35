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
from oipserve.front.grpc.stream_window import StreamWindow
from oipserve.front.grpc.varint import varint_bytes
from oipserve.grpc_generated import grpc_service_pb2 as pb

Request = TypeVar("Request")

#: ModelStreamInferResponse.infer_response (field 2), length-delimited.
_INFER_RESPONSE_TAG = bytes([(2 << 3) | 2])
#: The parameter Triton puts in every response of a stream: ``triton_final_response``,
#: true when it is its request's last (always, a response a request here). Clients read
#: it to know a request is done (tritonclient's streaming users, LLM and TTS clients; on
#: a protobuf map a missing key reads false, and they waited for ever: an outside check
#: found it). Serialized once: a map entry of ModelInferResponse.parameters, appended to
#: each response as it came (a message's fields may come in any order).
FINAL_RESPONSE = "triton_final_response"
_FINAL = pb.ModelInferResponse(
    parameters={FINAL_RESPONSE: pb.InferParameter(bool_param=True)}
).SerializeToString()


#: One response of the stream: its wire bytes, in parts to be sent one after another.
Response = list[bytes | memoryview]


def infer_response(serialized: bytes | memoryview) -> Response:
    """A ModelStreamInferResponse carrying a serialized ModelInferResponse, neither parsed
    nor copied: the field's tag and length, then the message itself, then the
    ``triton_final_response`` parameter."""
    size = memoryview(serialized).nbytes + len(_FINAL)
    return [_INFER_RESPONSE_TAG + varint_bytes(size), serialized, _FINAL]


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
    ``infer_response`` holding only the request's ``id`` and ``triton_final_response``."""
    response = pb.ModelStreamInferResponse(error_message=message)
    response.infer_response.id = request_id
    response.infer_response.parameters[FINAL_RESPONSE].bool_param = True
    return response.SerializeToString()


def strict_errors(context: Context) -> bool:
    """Triton's ``triton_grpc_error: true`` header: a failure ends the stream with its status."""
    metadata = context.invocation_metadata() or ()
    return any(k == "triton_grpc_error" and v == "true" for k, v in metadata)


async def ordered_responses(
    requests: AsyncIterator[Request],
    infer: Callable[[Request], Awaitable[bytes | memoryview]],
    context: Context,
    given: StreamWindow | None = None,
) -> AsyncIterator[Response]:
    """Requests run concurrently; responses come back in request order; how many is the
    ``StreamWindow``'s to say: ``given`` (by default one without a connection's budget).

    A failed request is answered in-band (``error_message``) and the stream goes
    on, as Triton does; a client that sent the ``triton_grpc_error: true`` header
    instead gets the failure as the stream's status. The stream ends once ``requests``
    does (the client is done, or the server stops: ``call_receive.shutting_down``) and
    every request read is answered.
    """
    strict = strict_errors(context)
    pending: asyncio.Queue[asyncio.Task[bytes | memoryview] | None] = asyncio.Queue()
    window = given if given is not None else StreamWindow(None)

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
    try:
        while True:
            task = await pending.get()
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
        while not pending.empty():
            task = pending.get_nowait()
            if task is not None:
                task.cancel()


def _forget(task: asyncio.Future[Any]) -> None:
    """Mark a task's failure, if any, as read (it may be dropped unanswered)."""
    if not task.cancelled():
        task.exception()
