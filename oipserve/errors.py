"""Errors that carry their own HTTP status and gRPC code.

The domain raises these; exactly one place per protocol (``rest.py`` for HTTP,
the gRPC service later) turns them into a response. Nothing here imports a web
framework.
"""

from __future__ import annotations


class ServerError(Exception):
    """Base of every error a client may see; the message is sent verbatim."""

    status: int = 500
    grpc_code: str = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ServerError):
    """The request is malformed or does not fit the model (client's mistake)."""

    status = 400
    grpc_code = "INVALID_ARGUMENT"


class NotFound(ServerError):
    """Unknown model, version, route or worker endpoint."""

    status = 404
    grpc_code = "NOT_FOUND"


class PayloadTooLarge(ServerError):
    status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class Unsupported(ServerError):
    """A feature the protocol allows but this server does not implement."""

    status = 501
    grpc_code = "UNIMPLEMENTED"


class Unavailable(ServerError):
    """Retryable server-side condition: not ready, overloaded, worker died."""

    status = 503
    grpc_code = "UNAVAILABLE"

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InferenceFailed(ServerError):
    """ONNX Runtime raised while running a model; the worker keeps serving."""

    status = 500
    grpc_code = "INTERNAL"
