"""Exceptions as gRPC statuses: the one mapping place, and how failures are logged.

The status itself comes from ``oipserve.errors.grpc_status`` (shared with
REST's ``http_status``), so both surfaces answer a failure with the same
message.
"""

from __future__ import annotations

import logging

import grpc

from oipserve.errors import foreseen, grpc_status
from oipserve.front.grpc.handler_context import Aborted

log = logging.getLogger("oipserve.grpc")


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for any exception a handler lets out: the one mapping place. An
    ``Aborted`` (a handler's ``abort``, or the status another front answered) keeps its own."""
    if isinstance(exc, Aborted):
        return exc.code, exc.message
    code, message = grpc_status(exc)
    return grpc.StatusCode[code], message


def log_failure(method: str, code: grpc.StatusCode, message: str, exc: BaseException) -> None:
    """Server-side failures as warnings (errors with a traceback if unexpected), the rest debug;
    an ``Aborted`` not at all (its status was chosen, here or by the front that logged it)."""
    if isinstance(exc, Aborted):
        return
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN):
        if foreseen(exc):
            log.warning("%s -> %s: %s", method, code.name, message)
        else:
            log.error("unexpected error in %s", method, exc_info=exc)
    else:
        log.debug("%s -> %s: %s", method, code.name, message)
