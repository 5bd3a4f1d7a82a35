"""The shared-memory extensions' REST routes: ``/v2/systemsharedmemory``, ``/v2/cudasharedmemory``.

System regions are registered, listed and unregistered in ``oipserve.request.client_regions``;
CUDA registration is refused with a 400 that says why; CUDA status lists nothing and
unregister succeeds (docs/shared-memory.md).
"""

from __future__ import annotations

import falcon.asgi
import msgspec

from oipserve.errors import InvalidInput
from oipserve.front.rest.body import read_all
from oipserve.front.rest.encode import ENCODER
from oipserve.request.client_regions import ClientRegions

#: Register bodies are one small JSON object.
BODY_LIMIT = 64 * 1024


class SystemSharedMemoryResource:
    """status, register and unregister of system shared-memory regions."""

    def __init__(self, regions: ClientRegions) -> None:
        self.regions = regions

    async def on_get_status(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, region: str | None = None
    ) -> None:
        resp.data = ENCODER.encode(self.regions.status(region))

    async def on_post_register(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, region: str
    ) -> None:
        data = await read_all(req, BODY_LIMIT)
        try:
            body = msgspec.json.decode(data) if data.strip() else None
        except (msgspec.DecodeError, RecursionError):
            raise InvalidInput("the shared memory register request is not JSON") from None
        if not isinstance(body, dict):
            raise InvalidInput("the shared memory register request must be a JSON object")
        for field in ("key", "byte_size"):
            if field not in body:
                raise InvalidInput(f"Shared memory register request has no '{field}' field")
        key = body["key"]
        if not isinstance(key, str):
            raise InvalidInput("'key' of the shared memory register request must be a string")
        await self.regions.register(region, key, body.get("offset", 0), body["byte_size"])
        resp.data = b""

    async def on_post_unregister(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, region: str | None = None
    ) -> None:
        await self.regions.unregister(region)
        resp.data = b""


class CudaSharedMemoryResource:
    """CUDA shared memory: register answers 400 with the reason; nothing is ever registered,
    so status lists nothing and unregister succeeds (register and unregister: 403 while
    client shared memory is off, as Triton refuses them)."""

    def __init__(self, regions: ClientRegions) -> None:
        self.regions = regions

    async def on_get_status(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, region: str | None = None
    ) -> None:
        resp.data = ENCODER.encode(self.regions.cuda_status(region))

    async def on_post_register(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, region: str
    ) -> None:
        # NOTE: the flag first, as Triton checks it (L0_shared_memory
        #   test_client_shm_disabled_by_default): a 403 says more than "no GPU".
        self.regions.check_allowed()
        raise InvalidInput(self.regions.cuda_refusal)

    async def on_post_unregister(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, region: str | None = None
    ) -> None:
        self.regions.check_allowed()
        resp.data = b""


def add_shared_memory_routes(app: falcon.asgi.App, regions: ClientRegions) -> None:
    for kind, resource in (
        ("system", SystemSharedMemoryResource(regions)),
        ("cuda", CudaSharedMemoryResource(regions)),
    ):
        base = f"/v2/{kind}sharedmemory"
        app.add_route(base + "/status", resource, suffix="status")
        app.add_route(base + "/region/{region}/status", resource, suffix="status")
        app.add_route(base + "/region/{region}/register", resource, suffix="register")
        app.add_route(base + "/unregister", resource, suffix="unregister")
        app.add_route(base + "/region/{region}/unregister", resource, suffix="unregister")
