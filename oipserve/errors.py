"""Errors a client may see, each carrying an ``ErrorKind``, and the one map to statuses.

The domain raises these; the REST and gRPC fronts turn them into a response
with ``http_status`` and ``grpc_code``, the only place where a kind becomes a
status. Errors from a worker arrive as a kind and a message
(``wire.messages.Failed``) and become the same exceptions (``from_kind``).
Anything else that escapes a handler is a bug: the client gets ``INTERNAL_MESSAGE``
and the log gets the traceback.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any

from oipserve.wire.messages import ErrorKind
from oipserve.wire.shm import NO_ROOM

#: The kind of failure -> (HTTP status, gRPC status code name). Triton's mapping
#: (oip-spec.md, "error mapping"), plus 413 for bodies over the limit and 403 /
#: PERMISSION_DENIED for a restricted API (Triton answers UNAVAILABLE there, which
#: clients retry; docs/security.md).
STATUS: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.INVALID_INPUT: (400, "INVALID_ARGUMENT"),
    ErrorKind.REFUSED: (400, "INVALID_ARGUMENT"),
    ErrorKind.NOT_FOUND: (404, "NOT_FOUND"),
    ErrorKind.ALREADY_EXISTS: (400, "ALREADY_EXISTS"),
    ErrorKind.FORBIDDEN: (403, "PERMISSION_DENIED"),
    ErrorKind.TOO_LARGE: (413, "RESOURCE_EXHAUSTED"),
    ErrorKind.UNSUPPORTED: (501, "UNIMPLEMENTED"),
    ErrorKind.UNAVAILABLE: (503, "UNAVAILABLE"),
    ErrorKind.DEADLINE_EXCEEDED: (503, "DEADLINE_EXCEEDED"),
    ErrorKind.INTERNAL: (500, "INTERNAL"),
}

#: What a client is told about a failure the server did not expect.
INTERNAL_MESSAGE = "internal server error (the server log has the details)"

#: What a client is told about a request still running when the server's stop runs out
#: of time (``--shutdown-timeout``), on every front: a 503 / UNAVAILABLE.
SHUTDOWN_UNANSWERED = (
    "the server is shutting down and this request did not finish within --shutdown-timeout"
)

#: What a ModelStreamInfer client is told when the server, stopping, ends its stream before
#: the client did: every request read was answered, what the client sends next is not.
SHUTDOWN_STREAM = (
    "the server is shutting down: this stream's requests read so far were answered, later "
    "ones are not; send them to another server"
)

#: What a client is told when the server ran out of file descriptors (EMFILE, ENFILE)
#: wherever that happened: a condition of the server that may pass, so 503, not a 500.
NO_DESCRIPTORS_MESSAGE = (
    "the server has no file descriptor left to serve this request; try again later "
    "(the server log has the details)"
)
#: A segment of shared memory for this request found no room in /dev/shm.
NO_SHARED_MEMORY_MESSAGE = (
    "the server has no shared memory left for this request (/dev/shm is full); try again later"
)


class ServerError(Exception):
    """Base of every error a client may see; the message is sent verbatim (but for lone
    surrogates, ``sendable``)."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str) -> None:
        message = sendable(message)
        super().__init__(message)
        self.message = message

    @property
    def status(self) -> int:
        return STATUS[self.kind][0]

    @property
    def grpc_code(self) -> str:
        return STATUS[self.kind][1]


def sendable(message: str) -> str:
    """``message`` with any lone UTF-16 surrogate written as its escape (``\\ud800``).

    A message may echo what a client sent, and JSON's ``"\\ud800"`` decodes to such a
    code point, which is no character: UTF-8 has no bytes for it, so the JSON encoder of
    the error's body (and gRPC's percent-encoded message) would fail on it, turning a 400
    into a 500, or a gRPC call into one never answered.
    """
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        return message.encode("utf-8", "backslashreplace").decode("utf-8")
    return message


class InvalidInput(ServerError):
    """The request is malformed or does not fit the model (client's mistake)."""

    kind = ErrorKind.INVALID_INPUT


def request_tag(request_id: str | None) -> str:
    """The head of a refusal Triton's core gives with the request's id (its
    ``InferenceRequest::LogRequest``): ``[request id: <id>] ``, ``<id_unknown>`` for a
    request without one (an empty ``id`` too)."""
    return f"[request id: {request_id or '<id_unknown>'}] "


class RequestRefusal(InvalidInput):
    """A refusal of a request that Triton's core words with the request's id first
    (``request_tag``: the checks of an input's datatype, shape, batch size, count, data
    size, ... in docs/protocol.md's table), raised where the request's id is not known:
    ``of_request`` puts it first where it is (``dataplane.intake.Intake.check``; a
    worker's, kind REFUSED: ``dataplane.plane.DataPlane.infer``)."""

    def of_request(self, request_id: str) -> InvalidInput:
        return InvalidInput(request_tag(request_id) + self.message)


class Withdrawn(InvalidInput):
    """The client went away while its request waited (a batcher's queue, a sequence's
    backlog); it never ran. Nobody reads the answer: its kind keeps it out of the warnings."""

    def __init__(self, message: str = "the client went away before its request ran") -> None:
        super().__init__(message)


def cancelled_by_client(future: asyncio.Future[Any]) -> bool:
    """Whether ``future``, just raised CancelledError into the task awaiting it, was
    cancelled for its client leaving (``Inference.watch``), not with that task (shutdown)."""
    task = asyncio.current_task()
    return future.cancelled() and (task is None or not task.cancelling())


class NotFound(ServerError):
    """Unknown model, version, route or worker endpoint."""

    kind = ErrorKind.NOT_FOUND


class AlreadyExists(ServerError):
    """A name is taken: a shared-memory region registered twice (400, as Triton)."""

    kind = ErrorKind.ALREADY_EXISTS


class Forbidden(ServerError):
    """A restricted API was asked for without the header that opens it."""

    kind = ErrorKind.FORBIDDEN


class PayloadTooLarge(ServerError):
    kind = ErrorKind.TOO_LARGE


class Unsupported(ServerError):
    """A feature the protocol allows but this server does not implement."""

    kind = ErrorKind.UNSUPPORTED


class Unavailable(ServerError):
    """Retryable server-side condition: not ready, overloaded, worker died."""

    kind = ErrorKind.UNAVAILABLE

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceeded(ServerError):
    """The request did not finish in time (``--infer-timeout``, its ``timeout``)."""

    kind = ErrorKind.DEADLINE_EXCEEDED

    def __init__(
        self,
        message: str = (
            "the request did not finish within its deadline (--infer-timeout, or the "
            "request's 'timeout' parameter)"
        ),
    ) -> None:
        super().__init__(message)


class InferenceFailed(ServerError):
    """The model failed while running; the worker keeps serving."""

    kind = ErrorKind.INTERNAL


class InternalError(RuntimeError):
    """A state the code relies on does not hold: a bug of the server, never the client's doing.

    Raised where an ``assert`` would otherwise narrow a type, so that ``python -O`` cannot
    skip the check. Not a ``ServerError`` on purpose: the client gets ``INTERNAL_MESSAGE``
    (kind INTERNAL) and the log gets the traceback with this message.
    """


class WorkerProtocolError(InternalError):
    """A worker process or another front answered with a message its protocol does not
    allow there (e.g. anything but ``Loaded`` or ``Failed`` to ``LoadModel``)."""


_BY_KIND: dict[ErrorKind, type[ServerError]] = {
    ErrorKind.INVALID_INPUT: InvalidInput,
    ErrorKind.REFUSED: RequestRefusal,
    ErrorKind.NOT_FOUND: NotFound,
    ErrorKind.ALREADY_EXISTS: AlreadyExists,
    ErrorKind.FORBIDDEN: Forbidden,
    ErrorKind.TOO_LARGE: PayloadTooLarge,
    ErrorKind.UNSUPPORTED: Unsupported,
    ErrorKind.UNAVAILABLE: Unavailable,
    ErrorKind.DEADLINE_EXCEEDED: DeadlineExceeded,
    ErrorKind.INTERNAL: InferenceFailed,
}


def from_kind(kind: ErrorKind, message: str) -> ServerError:
    """The exception for a failure a worker reported."""
    return _BY_KIND[kind](message)


def kind_of(exc: BaseException) -> tuple[ErrorKind, str]:
    """The kind and client message of any exception a handler lets out."""
    if isinstance(exc, ServerError):
        return exc.kind, exc.message
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return ErrorKind.UNAVAILABLE, NO_DESCRIPTORS_MESSAGE
    if isinstance(exc, OSError) and exc.errno in NO_ROOM:
        # NOTE: a request body, a gRPC message or a batch with no room in /dev/shm, as a
        #   worker answers for its outputs (it was a 500 with a traceback, found by fuzzing).
        return ErrorKind.UNAVAILABLE, NO_SHARED_MEMORY_MESSAGE
    return ErrorKind.INTERNAL, INTERNAL_MESSAGE


def foreseen(exc: BaseException) -> bool:
    """Whether ``exc`` has a kind of its own (a ``ServerError``, or an OS error this module
    maps: no descriptors, no shared memory): logged as a warning, not as a bug with its
    traceback."""
    return kind_of(exc)[0] is not ErrorKind.INTERNAL or isinstance(exc, ServerError)


def http_status(exc: BaseException) -> tuple[int, str]:
    """HTTP status and client message for any exception a handler lets out."""
    kind, message = kind_of(exc)
    return STATUS[kind][0], message


def grpc_status(exc: BaseException) -> tuple[str, str]:
    """gRPC status code name and client message for any exception a handler lets out."""
    kind, message = kind_of(exc)
    return STATUS[kind][1], message
