"""Every REST error as ``{"error": message}`` with its status, in one place per error family.

``ServerError``s carry their status (``oipserve.errors``); anything else is
mapped by ``http_status``; Falcon's own ``HTTPError``s (404 route, 405 method)
keep Falcon's status and get our body shape from the serializer.
"""

from __future__ import annotations

import logging

import falcon
import falcon.asgi

from oipserve.errors import ServerError, Unavailable, Unsupported, foreseen, http_status
from oipserve.front.rest.encode import ENCODER
from oipserve.front.rest.media import JSON

log = logging.getLogger("oipserve.rest")


async def handle_server_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: ServerError, params: dict[str, object]
) -> None:
    """A ``ServerError``: its status, its message, and the headers its kind calls for."""
    if ex.status >= 500:
        log.warning("%s %s -> %d: %s", req.method, req.path, ex.status, ex.message)
    else:
        log.debug("%s %s -> %d: %s", req.method, req.path, ex.status, ex.message)
    resp.status = ex.status
    resp.content_type = JSON
    resp.data = ENCODER.encode({"error": ex.message})
    if isinstance(ex, Unavailable) and ex.retry_after is not None:
        resp.set_header("Retry-After", str(ex.retry_after))
    if isinstance(ex, Unsupported) and "Content-Encoding" in ex.message:
        resp.set_header("Accept-Encoding", "gzip, deflate")
    resp.stream = None


async def handle_unexpected(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: Exception, params: dict[str, object]
) -> None:
    """Any other exception: logged with its traceback, answered by ``http_status``."""
    if isinstance(ex, falcon.HTTPError):
        raise ex
    resp.status, message = http_status(ex)
    if foreseen(ex):  # (an OS error with a kind: no room in /dev/shm, no descriptor)
        log.warning("%s %s -> %d: %s (%s)", req.method, req.path, resp.status, message, ex)
    else:
        log.exception("unexpected error on %s %s", req.method, req.path)
    resp.content_type = JSON
    resp.data = ENCODER.encode({"error": message})


def serialize_http_error(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    """Falcon's own errors in our body shape."""
    message = exc.title if not exc.description else f"{exc.title}: {exc.description}"
    resp.content_type = JSON
    resp.data = ENCODER.encode({"error": message})
