"""Management routes over HTTP: /v2/hardware, /v2/workers, /v2/repository, model load aliases.

Thin Falcon resources: parse the small JSON bodies, call ``Management``,
render. Errors are ``ServerError``s, rendered by the app's one handler.
"""

from __future__ import annotations

import falcon
import falcon.asgi
import msgspec

from oipserve.errors import InvalidInput
from oipserve.front.rest.body import read_all
from oipserve.management import Management

#: Management bodies are small JSON objects.
BODY_LIMIT = 1024 * 1024


class _IndexRequest(msgspec.Struct):
    """The repository index request's body (other keys are ignored, as Triton does)."""

    ready: bool = False


_INDEX_DECODER = msgspec.json.Decoder(_IndexRequest)


async def _read_json(req: falcon.asgi.Request, what: str, limit: int = BODY_LIMIT) -> dict | None:
    """The body as a JSON object; None when empty; 400 when it is anything else."""
    data = await read_all(req, limit)
    if not data.strip():
        return None
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"the {what} body is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput(f"the {what} body is not JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"the {what} body must be a JSON object")
    return value


def _parameters(body: dict | None, what: str) -> dict[str, object]:
    params = (body or {}).get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInput(f"'parameters' of the {what} request must be a JSON object")
    return params


class HardwareResource:
    def __init__(self, management: Management) -> None:
        self.management = management

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data = msgspec.json.encode(self.management.hardware())

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await _read_json(req, "hasHardware")
        if body is None:
            raise InvalidInput("No JSON body in hasHardware request")
        name = body.get("name", "")
        num = body.get("num", 1)
        if not isinstance(name, str):
            raise InvalidInput("'name' must be a string")
        if isinstance(num, bool) or not isinstance(num, int):
            raise InvalidInput("'num' must be an integer")
        resp.status = 200 if self.management.has_hardware(name, num) else 404
        resp.content_type = falcon.MEDIA_TEXT
        resp.data = b""


class WorkerResource:
    def __init__(self, management: Management) -> None:
        self.management = management

    async def on_get(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, worker: str
    ) -> None:
        """Debug view of one endpoint: parameters, device, each instance's providers."""
        resp.data = msgspec.json.encode(self.management.endpoint_info(worker))

    async def on_post_load(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, worker: str
    ) -> None:
        params = await _read_json(req, "workerLoad") or {}
        name = await self.management.worker_load(worker, params)
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = name

    async def on_post_unload(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, worker: str
    ) -> None:
        await self.management.worker_unload(worker)
        resp.content_type = falcon.MEDIA_TEXT
        resp.data = b""


class RepositoryResource:
    def __init__(self, management: Management, load_limit: int) -> None:
        self.management = management
        #: A load may carry model files (base64): its body is bounded like an inference's.
        self.load_limit = load_limit

    async def on_post_index(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        data = await read_all(req, BODY_LIMIT)
        ready = False
        if data.strip():
            # NOTE: decoded against its type, so a 'ready' that is not a boolean is refused
            #   where it starts: a value nested 250,000 deep is never descended into
            #   (Triton's test_repository_index_deeply_nested_json), in Triton's words.
            try:
                ready = _INDEX_DECODER.decode(data).ready
            except msgspec.ValidationError as exc:
                if "$.ready" in str(exc):
                    raise InvalidInput("Invalid value for 'ready': expected a boolean") from None
                raise InvalidInput(f"the repository index body is not valid: {exc}") from None
            except msgspec.DecodeError as exc:
                raise InvalidInput(f"the repository index body is not JSON: {exc}") from None
            except RecursionError:
                raise InvalidInput(
                    "the repository index body is not JSON: nested too deeply"
                ) from None
        resp.data = msgspec.json.encode(self.management.index(ready))

    async def on_post_load(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        model: str,
        version: str | None = None,
    ) -> None:
        body = await _read_json(req, "model load", limit=self.load_limit)
        await self.management.repository_load(model, version, _parameters(body, "load"))
        resp.data = b""

    async def on_post_unload(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        model: str,
        version: str | None = None,
    ) -> None:
        body = await _read_json(req, "model unload")
        await self.management.repository_unload(model, version, _parameters(body, "unload"))
        resp.data = b""


class NamedRepositoryResource:
    """Triton's repository routes that name a repository (``/v2/repository/{repository}/
    ...``): refused as Triton refuses them; this server has one repository. An empty name
    (``/v2/repository//index``) is not one of Triton's routes at all: a 404, as any path
    that is not a route."""

    @staticmethod
    def _refuse(repository: str) -> None:
        if not repository:
            raise falcon.HTTPNotFound()
        Management.check_repository_name(repository)

    async def on_post_index(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, repository: str
    ) -> None:
        self._refuse(repository)

    async def on_post_load(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, repository: str, model: str
    ) -> None:
        self._refuse(repository)

    on_post_unload = on_post_load


class ModelListResource:
    def __init__(self, management: Management) -> None:
        self.management = management

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data = msgspec.json.encode({"models": self.management.served()})


def add_admin_routes(app: falcon.asgi.App, management: Management) -> None:
    """Mount every management route on ``app``."""
    app.add_route("/v2/hardware", HardwareResource(management))
    workers = WorkerResource(management)
    app.add_route("/v2/workers/{worker}", workers)
    app.add_route("/v2/workers/{worker}/load", workers, suffix="load")
    app.add_route("/v2/workers/{worker}/unload", workers, suffix="unload")
    # NOTE: the app's own limit (--max-request-bytes); management bodies are small.
    repository = RepositoryResource(management, getattr(app, "max_request_bytes", BODY_LIMIT))
    app.add_route("/v2/repository/index", repository, suffix="index")
    for base in (
        "/v2/repository/models/{model}",
        "/v2/repository/models/{model}/versions/{version}",
        "/v2/models/{model}",
    ):
        app.add_route(base + "/load", repository, suffix="load")
        app.add_route(base + "/unload", repository, suffix="unload")
    named = NamedRepositoryResource()
    app.add_route("/v2/repository/{repository}/index", named, suffix="index")
    app.add_route("/v2/repository/{repository}/models/{model}/load", named, suffix="load")
    app.add_route("/v2/repository/{repository}/models/{model}/unload", named, suffix="unload")
    app.add_route("/v2/models", ModelListResource(management))
