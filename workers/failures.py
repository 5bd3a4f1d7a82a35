"""What a model run's exception tells the front: its kind and its message.

One table for every way a worker runs a model (a request, a batch, an ensemble chain's
step), so that a client gets the same answer for the same failure however it ran.
"""

from __future__ import annotations

import logging

from oipserve.wire.images import ImageError
from oipserve.wire.messages import ErrorKind
from workers import runtime
from workers.regions import RegionError, RegionRefusal

__all__ = ["SEE_LOG", "run_failure"]

log = logging.getLogger("oipserve.worker")

#: Added to the message of an internal error: the client gets no details.
SEE_LOG = " (an internal error; the server log has the details)"


def run_failure(exc: Exception, key: str) -> tuple[ErrorKind, str]:
    """The kind and message of ``exc``, raised while model ``key`` took its inputs or ran:
    the request's fault (a bad input, image or region; an input ONNX Runtime refuses) or
    the server's (logged with its traceback here, a generic message to the client)."""
    if isinstance(exc, RegionRefusal):  # Triton's words: the front puts the id first
        return ErrorKind.REFUSED, str(exc)
    if isinstance(exc, (runtime.RequestError, ImageError, RegionError)):
        return ErrorKind.INVALID_INPUT, str(exc)
    if runtime.rejects_input(exc):
        return ErrorKind.INVALID_INPUT, f"onnxruntime: {exc}"
    log.exception("model '%s' failed while running", key)
    return ErrorKind.INTERNAL, f"model '{key}' failed{SEE_LOG}"
