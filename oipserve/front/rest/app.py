"""The REST ASGI app: Falcon's, with the size limit checked before any body is read.

``create_app`` builds it with the OIP routes and error handlers; the
management routes are added by ``oipserve.front.rest.admin``. Every route added
belongs to an API group (``oipserve.config.access.HTTP_ROUTES``); a restricted group's
routes are put behind their header as they are added (``rest/restricted.py``).

``_App`` relies on two things Falcon does not document as API (pinned in
pyproject.toml, checked by ``tests/unit/test_framework_internals.py``): that
``falcon.asgi.App.__call__`` awaits exactly one ``receive()`` event before it
routes the request, and that a first event with an empty body and
``more_body: True`` leaves the whole body to the request stream's later reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import falcon.asgi

from oipserve.config.access import HTTP_ROUTES, Restriction, by_api
from oipserve.config.settings import Settings
from oipserve.dataplane.plane import DataPlane
from oipserve.errors import ServerError
from oipserve.front.http.extensions import RECEIVE_INTO
from oipserve.front.rest.body import DIRECT_BODY_MIN
from oipserve.front.rest.encode import ENCODER
from oipserve.front.rest.error_handlers import (
    handle_server_error,
    handle_unexpected,
    serialize_http_error,
)
from oipserve.front.rest.media import JSON
from oipserve.front.rest.resources import ModelResource, ServerResource, StatisticsResource
from oipserve.front.rest.restricted import guarded
from oipserve.front.rest.shared_memory import add_shared_memory_routes

#: ASGI's receive and send, as Falcon types them.
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def create_app(settings: Settings, dataplane: DataPlane) -> falcon.asgi.App:
    """The app serving the OIP's server, health, model and infer routes."""
    restrictions = by_api(settings.http_restricted_api)
    app = _App(settings.max_request_bytes, restrictions, media_type=JSON)
    app.req_options.strip_url_path_trailing_slash = True
    app.resp_options.default_media_type = JSON
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(ServerError, handle_server_error)
    app.set_error_serializer(serialize_http_error)

    server = ServerResource(dataplane)
    app.add_route("/v2", server)
    app.add_route("/v2/health/live", server, suffix="live")
    app.add_route("/v2/health/ready", server, suffix="ready")

    statistics = StatisticsResource(dataplane)
    app.add_route("/v2/models/stats", statistics)
    app.add_route("/v2/models/{model}/stats", statistics)
    app.add_route("/v2/models/{model}/versions/{version}/stats", statistics)

    models = ModelResource(dataplane, settings)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.add_route(base, models)
        app.add_route(base + "/ready", models, suffix="ready")
        app.add_route(base + "/config", models, suffix="config")
        app.add_route(base + "/infer", models, suffix="infer")
    add_shared_memory_routes(app, dataplane.regions)
    return app


class _App(falcon.asgi.App):
    """Falcon's app, with the size limit checked first and binary bodies left unread.

    Falcon awaits the first body event before it routes a request, so a
    responder could answer 413 only once the client has sent body bytes (a
    client that waits for ``100 Continue`` would stall): the limit is checked
    here, from Content-Length. For binary and large requests the first body
    event is also where the server would copy the body's first chunk out of its
    buffer; Falcon is given an empty first event instead, so that ``read_body``
    can receive the whole body straight into shared memory (``RECEIVE_INTO``).
    Readers of ``req.stream`` (other routes, compressed bodies) are unaffected:
    the rest of the body simply comes with the next event.
    """

    def __init__(
        self,
        limit: int,
        restrictions: Mapping[str, Restriction] | None = None,
        *,
        media_type: str,
    ) -> None:
        super().__init__(media_type=media_type)
        self._limit = limit
        #: The body limit (``--max-request-bytes``), for routes that read bodies themselves.
        self.max_request_bytes = limit
        #: API group -> its restriction; None (tests of Falcon itself) accepts any route.
        self._restrictions = restrictions

    def add_route(self, uri_template: str, resource: object, **kwargs: Any) -> None:
        """Falcon's ``add_route``, with the route's API group looked up once, here.

        A template missing from ``HTTP_ROUTES`` is refused: a new route must be
        given a group, or ``--http-restricted-api`` would silently leave it open.
        """
        if self._restrictions is not None:
            api = HTTP_ROUTES.get(uri_template)
            if api is None:
                raise ValueError(
                    f"route {uri_template} has no API group in oipserve.config.access.HTTP_ROUTES"
                )
            restriction = self._restrictions.get(api)
            if restriction is not None:
                resource = guarded(resource, api, restriction)
        super().add_route(uri_template, resource, **kwargs)

    # falcon.asgi.App's __call__ is async where its base's (falcon.App, WSGI) is not:
    #   Falcon's own definition carries this ignore too.
    async def __call__(  # type: ignore[override]
        self, scope: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        if scope["type"] == "http":
            size = -1
            binary = False  # the binary-data extension: a JSON header, then raw bytes
            expecting = False  # Expect: 100-continue (the body comes after a 100, if at all)
            for key, value in scope["headers"]:
                if key == b"content-length":
                    if value.isdigit():
                        size = int(value)
                elif key == b"inference-header-content-length":
                    binary = True
                elif key == b"expect":
                    expecting = value.lower() == b"100-continue"
            if size > self._limit:
                await _refuse_too_large(
                    send, size, self._limit, json_body=not binary, close=expecting
                )
                return
            direct = binary or size >= DIRECT_BODY_MIN
            if direct and RECEIVE_INTO in scope.get("extensions", ()):
                receive = _without_first_body(receive)
        await super().__call__(scope, receive, send)


_NO_BODY_YET = {"type": "http.request", "body": b"", "more_body": True}


def _without_first_body(receive: Receive) -> Receive:
    """``receive`` whose first event is empty, leaving the body in the server's hands."""
    first = True

    async def deferred() -> Mapping[str, Any]:
        nonlocal first
        if first:
            first = False
            return dict(_NO_BODY_YET)
        return await receive()

    return deferred


async def _refuse_too_large(
    send: Send, length: int, limit: int, *, json_body: bool, close: bool
) -> None:
    detail = f"the request body has {length} bytes, more than the limit of {limit} bytes"
    if json_body:
        # Triton's phrase first for a body that is all JSON (its clients and QA tests,
        # L0_http test_loading_large_invalid_model, match it); the status stays 413.
        detail = (
            f"request JSON size of {length} bytes exceeds the maximum allowed input size of "
            f"{limit} bytes: {detail} (--max-request-bytes)"
        )
    body = ENCODER.encode({"error": detail})
    headers = [(b"content-type", JSON.encode()), (b"content-length", b"%d" % len(body))]
    # NOTE: the body is left unread; uvicorn discards it as it arrives, so the
    #   connection stays usable and a client that sends it all still reads the 413. A
    #   client that asked ``Expect: 100-continue`` sends none (it got no 100): the next
    #   request on the connection was read as the refused body, and never answered
    #   (found by fuzzing). The connection closes after the 413 then (RFC 9110, 10.1.1).
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
