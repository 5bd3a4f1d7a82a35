"""A Falcon resource put behind its API group's header (``--http-restricted-api``).

The check is decided when a route is added, not when a request arrives: a route
whose group is restricted gets a stand-in resource whose responders check the
header first; every other route keeps its own resource, so unrestricted APIs
pay nothing per request. The check runs before the responder reads any body
byte, so a refused upload is never placed in shared memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import falcon.asgi

from oipserve.config.access import Restriction, allows, denial
from oipserve.errors import Forbidden

Responder = Callable[..., Awaitable[None]]


class _Guarded:
    """Stand-in for a resource: the same ``on_*`` responders, each checking the header first."""

    def __init__(self, resource: object) -> None:
        self.resource = resource

    def __repr__(self) -> str:
        return f"<restricted {self.resource!r}>"


def guarded(resource: object, api: str, restriction: Restriction) -> object:
    """``resource`` with every responder refusing (403) a request without the header."""
    stand_in = _Guarded(resource)
    message = denial(api, restriction, grpc=False)
    for name in dir(resource):
        responder = getattr(resource, name)
        if name.startswith("on_") and callable(responder):
            setattr(stand_in, name, _checked(responder, restriction, message))
    return stand_in


def _checked(responder: Responder, restriction: Restriction, message: str) -> Responder:
    header = restriction.header

    async def responder_with_check(
        req: falcon.asgi.Request, resp: falcon.asgi.Response, **params: Any
    ) -> None:
        if not allows(restriction, req.get_header(header)):
            raise Forbidden(message)
        await responder(req, resp, **params)

    return responder_with_check
