"""uvicorn's log lines that any client (or a shutdown) can cause, made quiet.

uvicorn logs ``Invalid HTTP request received.`` at WARNING for every request whose head
httptools cannot parse (an unknown method, a raw byte out of place, a head this front
refused as too large), then answers it (``CorkedHttpToolsProtocol.send_400_response``: a
400, 431 or 505 with ``{"error": ...}``, and the connection closed). Any client may send
such requests as often as it likes, each on a new connection, and each was a warning in
the operator's log. ``quiet_bad_heads`` puts a filter on uvicorn's logger that turns that
one warning into a debug line of ``oipserve.http``, as an upgrade request is
(``_unsupported_upgrade_warning``).

At ``--shutdown-timeout`` uvicorn cancels the requests still running, and logs each as
``Exception in ASGI application`` with the CancelledError's traceback: the front has
answered them 503 just before (``UvicornServer``), so each is one info line instead, and
uvicorn's own line saying it cancels them is a warning, not an error.
Everything else uvicorn logs passes unchanged.
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ["UNPARSABLE", "quiet_bad_heads"]

#: uvicorn's line as ``--shutdown-timeout`` cancels the requests still running.
SHUTDOWN_CANCEL = "Cancel %s running task(s), timeout graceful shutdown exceeded"

#: uvicorn's words for what escaped an ASGI app (``RequestResponseCycle.run_asgi``; the
#: lane's ``_run_lane`` says the same).
ESCAPED = "Exception in ASGI application"

#: uvicorn's words for a head httptools could not parse (``HttpToolsProtocol.data_received``).
UNPARSABLE = "Invalid HTTP request received."

log = logging.getLogger("oipserve.http")


class _BadHeadsQuiet(logging.Filter):
    """Drops uvicorn's ``UNPARSABLE`` warning, logging it at debug instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == UNPARSABLE and record.levelno == logging.WARNING:
            log.debug("a request head not parsed (answered and closed): %s", UNPARSABLE)
            return False
        if record.msg == SHUTDOWN_CANCEL and record.levelno == logging.ERROR:
            # (the requests it cancels were answered 503 just before: a warning)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        exc_info = record.exc_info
        escaped = isinstance(record.msg, str) and record.msg.startswith(ESCAPED)
        if escaped and exc_info and isinstance(exc_info[1], asyncio.CancelledError):
            log.info("a request still running at --shutdown-timeout was answered 503 and ended")
            return False
        return True


_FILTER = _BadHeadsQuiet()


def quiet_bad_heads() -> None:
    """Filter uvicorn's logger (once, however often called: one filter object)."""
    logging.getLogger("uvicorn.error").addFilter(_FILTER)
