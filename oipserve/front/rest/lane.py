"""The inference route served below the ASGI app: the REST side (issue #40).

``front.http.lane`` says why and which requests; this is what answers them: the same
``ModelResource.on_post_infer`` the app routes to, and the same error handlers the app
registers (``error_handlers``), called as Falcon calls them. A front answers a route
here only where its app would answer it itself (``answers``: another front's app
forwards a model it does not hold), and none where inference is a restricted API (the
guard is Falcon's: those requests go the ASGI way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol, cast

import falcon.asgi

from oipserve.config.access import by_api
from oipserve.config.settings import Settings
from oipserve.dataplane.plane import DataPlane
from oipserve.errors import ServerError
from oipserve.front.http.lane import LaneRequest, LaneResponse
from oipserve.front.rest.error_handlers import handle_server_error, handle_unexpected
from oipserve.front.rest.resources import ModelResource

__all__ = ["RestInferLane", "infer_lane", "infer_route"]

_PREFIX: Final = "/v2/models/"
_SUFFIX: Final = "/infer"
_VERSIONS: Final = "/versions/"


def infer_route(path: str) -> tuple[str, str | None] | None:
    """The model and version that ``path`` names when it is an infer route
    (``/v2/models/{model}[/versions/{version}]/infer``); None for any other path.

    PERF: found by position, not by splitting the path (a list and a string per segment,
    about six objects a request).
    """
    if not path.startswith(_PREFIX) or not path.endswith(_SUFFIX):
        return None
    start = len(_PREFIX)
    end = len(path) - len(_SUFFIX)
    if end <= start:
        return None  # no model (or the prefix and the suffix overlap)
    slash = path.find("/", start, end)
    if slash < 0:
        return path[start:end], None
    version = slash + len(_VERSIONS)
    if (
        slash == start
        or version >= end
        or not path.startswith(_VERSIONS, slash)
        or path.find("/", version, end) >= 0
    ):
        return None
    return path[start:slash], path[version:end]


class InferResponder(Protocol):
    """What answers an infer request: ``ModelResource``, as the app routes to it. (A
    protocol, not the class: a test answers with its own.)"""

    async def on_post_infer(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        model: str,
        version: str | None = None,
    ) -> None: ...


class RestInferLane:
    """``POST /v2/models/{model}[/versions/{version}]/infer``, answered by the infer responder."""

    def __init__(
        self,
        resource: InferResponder,
        limit: int,
        answers: Callable[[str, str | None], bool] | None = None,
    ) -> None:
        #: Its ``on_post_infer``, bound once (PERF: a bound method a request).
        self._infer = resource.on_post_infer
        self.limit = limit
        self._answers = answers

    def target(self, path: str) -> tuple[str, str | None] | None:
        """The model and version of ``path`` when it is an infer route answered here."""
        route = infer_route(path)
        if route is None or (self._answers is not None and not self._answers(*route)):
            return None
        return route

    async def serve(
        self, request: LaneRequest, response: LaneResponse, model: str, version: str | None
    ) -> None:
        # NOTE: the lane's request and response carry the names the responder and the
        #   handlers use of Falcon's (tests/e2e/test_infer_lane.py answers each way alike).
        req = cast(falcon.asgi.Request, request)
        resp = cast(falcon.asgi.Response, response)
        try:
            await self._infer(req, resp, model, version)
        except ServerError as exc:
            await handle_server_error(req, resp, exc, {})
        except Exception as exc:  # Falcon's handler for Exception is ours too
            await handle_unexpected(req, resp, exc, {})


def infer_lane(
    settings: Settings,
    dataplane: DataPlane,
    answers: Callable[[str, str | None], bool] | None = None,
) -> RestInferLane | None:
    """The lane of a front's REST app; None where inference is a restricted API."""
    if "inference" in by_api(settings.http_restricted_api):
        return None
    return RestInferLane(ModelResource(dataplane, settings), settings.max_request_bytes, answers)
