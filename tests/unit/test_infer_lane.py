"""Which requests the HTTP/1.1 protocol hands to the infer lane, and what the lane answers.

Driven in memory (``tests.support.transport``): the protocol with the REST side of the lane
(``front.rest.lane.RestInferLane``) over a stand-in for the infer responder, and an ASGI
app that answers every request it is given with 299. A request the lane takes is
answered by the responder (200, or its error through the app's error handlers); any other
goes to the app. The real responder on both ways, byte for byte, is
``tests/e2e/test_infer_lane.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from oipserve.errors import InvalidInput
from oipserve.front.http.lane import LaneRequest, LaneResponse, lane_headers, lane_request
from oipserve.front.http.lane_cycle import LaneCycle
from oipserve.front.http.limits import ConnectionLimits
from oipserve.front.http.protocol import CorkedHttpToolsProtocol
from oipserve.front.rest.lane import RestInferLane, infer_route
from oipserve.runtime.http_io import CorkedTransport
from tests.support.transport import MemoryTransport, connected

LIMIT = 1000


class _Responder:
    """Stands in for ``ModelResource.on_post_infer``: answers what it read of the request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, bytes, str | None]] = []

    async def on_post_infer(
        self, req: LaneRequest, resp: LaneResponse, model: str, version: str | None = None
    ) -> None:
        body = b"".join([chunk async for chunk in req.stream])
        self.seen.append((model, version, body, req.get_header("X-Many")))
        if model == "bad":
            raise InvalidInput("a bad request")
        if model == "broken":
            raise RuntimeError("a bug")
        resp.content_type = "application/json"
        resp.data = b'{"model":"%s"}' % model.encode()


async def _app(scope: dict, receive: Callable, send: Callable) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


def _serve(request: bytes, answers: Callable[[str, str | None], bool] | None = None) -> Any:
    """Feed ``request`` to a fresh connection; (what was written, the responder's calls)."""
    responder = _Responder()
    lane = RestInferLane(responder, LIMIT, answers)  # type: ignore[arg-type]

    async def main() -> tuple[bytes, list[Any], MemoryTransport]:
        protocol_class = CorkedHttpToolsProtocol.configured(ConnectionLimits(), LIMIT, None, lane)
        protocol, _, transport = connected(protocol_class, _app)
        protocol.data_received(request)
        for _ in range(200):
            if b"\r\n\r\n" in b"".join(transport.written):
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)
        return b"".join(transport.written), responder.seen, transport

    return asyncio.run(main())


def _post(target: str, *fields: str, body: bytes = b"{}", version: str = "1.1") -> bytes:
    head = [f"POST {target} HTTP/{version}", "host: t", *fields, f"content-length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@pytest.mark.parametrize(
    ("target", "model", "version"),
    [
        ("/v2/models/m/infer", "m", None),
        ("/v2/models/m/versions/2/infer", "m", "2"),
        ("/v2/models/infer/infer", "infer", None),
    ],
)
def test_a_plain_infer_request_takes_the_lane(target: str, model: str, version: str | None) -> None:
    written, seen, _ = _serve(_post(target, body=b'{"inputs":[]}'))
    assert seen == [(model, version, b'{"inputs":[]}', None)]
    assert written.startswith(b"HTTP/1.1 200 OK\r\n")
    answer = b'{"model":"%s"}' % model.encode()
    assert written.endswith(
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)
    )


@pytest.mark.parametrize(
    "request_bytes",
    [
        _post("/v2/models/m/infer?x=1"),
        _post("/v2/models/m%20n/infer"),
        _post("/v2/models/m/infer/"),
        _post("/v2/models/m/versions//infer"),
        _post("/v2/models//infer"),
        _post("/v2/models/m/ready"),
        _post("http://t/v2/models/m/infer"),
        _post("/v2/models/m/infer", "content-encoding: gzip"),
        _post("/v2/models/m/infer", "expect: 100-continue"),
        _post("/v2/models/m/infer", "host: u"),  # two Host fields: the header rules' 400
        _post("/v2/models/m/infer", version="1.0"),
        _post("/v2/models/m/infer", body=b"x" * (LIMIT + 1)),
        b"GET /v2/models/m/infer HTTP/1.1\r\nhost: t\r\n\r\n",
        b"POST /v2/models/m/infer HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
    ],
    ids=lambda r: r.split(b"\r\n")[0].decode() + (" " + r.split(b"\r\n")[2].decode()),
)
def test_anything_else_goes_the_asgi_way(request_bytes: bytes) -> None:
    written, seen, _ = _serve(request_bytes)
    assert seen == []
    assert not written.startswith(b"HTTP/1.1 200"), written


def test_a_model_another_front_answers_goes_the_asgi_way() -> None:
    here = {"m"}
    written, seen, _ = _serve(_post("/v2/models/x/infer"), lambda m, v: m in here)
    assert seen == [] and written.startswith(b"HTTP/1.1 299")
    _, seen, _ = _serve(_post("/v2/models/m/infer"), lambda m, v: m in here)
    assert [s[0] for s in seen] == ["m"]


def test_errors_are_answered_by_the_apps_error_handlers() -> None:
    written, _, _ = _serve(_post("/v2/models/bad/infer"))
    assert written.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert written.endswith(b'{"error":"a bad request"}')
    written, _, _ = _serve(_post("/v2/models/broken/infer"))
    assert written.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b'"error"' in written


def test_repeated_headers_read_as_falcons_request_reads_them() -> None:
    _, seen, _ = _serve(_post("/v2/models/m/infer", "x-many: a", "x-many: b"))
    assert seen[0][3] == "a,b"
    fields = [(b"x-many", b"a"), (b"user-agent", b"1"), (b"x-many", b"b"), (b"user-agent", b"2")]
    assert lane_headers(fields) == {b"x-many": b"a,b", b"user-agent": b"2"}
    assert lane_headers([(b"host", b"a"), (b"host", b"a")]) is None  # the rules' 400
    assert lane_headers([(b"x-many", b"a ")]) is None  # the rules strip it
    assert lane_headers([(b"expect", b"100-continue")]) is None


def test_connection_close_is_kept() -> None:
    written, seen, transport = _serve(_post("/v2/models/m/infer", "connection: close"))
    assert len(seen) == 1
    assert b"connection: close\r\n" in written
    assert transport.closing


def test_a_body_in_several_reads_and_a_keep_alive_request_after_it() -> None:
    first = _post("/v2/models/m/infer", body=b'{"a":1}')
    second = _post("/v2/models/n/versions/3/infer", body=b"{}")

    async def main() -> tuple[bytes, list[Any]]:
        responder = _Responder()
        lane = RestInferLane(responder, LIMIT)  # type: ignore[arg-type]
        protocol_class = CorkedHttpToolsProtocol.configured(ConnectionLimits(), LIMIT, None, lane)
        protocol, _, transport = connected(protocol_class, _app)
        protocol.data_received(first[:-4])
        await asyncio.sleep(0.01)
        protocol.data_received(first[-4:])
        for _ in range(100):
            if responder.seen:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)
        protocol.data_received(second)
        for _ in range(100):
            if len(responder.seen) == 2:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)
        return b"".join(transport.written), responder.seen

    written, seen = asyncio.run(main())
    assert [(m, v, b) for m, v, b, _ in seen] == [("m", None, b'{"a":1}'), ("n", "3", b"{}")]
    assert written.count(b"HTTP/1.1 200 OK") == 2


async def test_a_front_has_a_lane_unless_inference_is_restricted() -> None:
    from oipserve.config.settings import load_settings
    from oipserve.dataplane.plane import DataPlane
    from oipserve.front.http.server import http_server
    from oipserve.front.rest.lane import infer_lane
    from oipserve.models.registry import ModelRegistry

    plane = DataPlane(ModelRegistry(), SimpleNamespace(prefix="oipserve-lane-"), 1)  # type: ignore[arg-type]
    _, settings = load_settings(["serve", "--model-repository", "."], {})
    lane = infer_lane(settings, plane)
    assert isinstance(lane, RestInferLane) and lane.limit == settings.max_request_bytes
    server = http_server(settings, _app, lambda *_: None, lane)
    # NOTE: uvicorn's protocol class is our protocol with its settings (a partial).
    assert server.config.http.keywords["lane"] is lane  # type: ignore[union-attr]
    _, restricted = load_settings(
        ["serve", "--model-repository", ".", "--http-restricted-api", "inference:x-key=v"], {}
    )
    assert infer_lane(restricted, plane) is None


def test_an_answer_waits_while_the_client_reads_nothing() -> None:
    """As uvicorn's ``send``: past the transport's high-water mark nothing more is written
    (and no next request read) until the client takes what it was sent."""

    async def main() -> tuple[bytes, bytes]:
        lane = RestInferLane(_Responder(), LIMIT)  # type: ignore[arg-type]
        protocol_class = CorkedHttpToolsProtocol.configured(ConnectionLimits(), LIMIT, None, lane)
        protocol, _, transport = connected(protocol_class, _app)
        protocol.flow.pause_writing()
        protocol.data_received(_post("/v2/models/m/infer"))
        await asyncio.sleep(0.05)
        held = b"".join(transport.written)
        protocol.flow.resume_writing()
        await asyncio.sleep(0.05)
        return held, b"".join(transport.written)

    held, written = asyncio.run(main())
    assert held == b""
    assert written.startswith(b"HTTP/1.1 200 OK")


def test_the_head_the_lane_takes() -> None:
    """``lane_request`` alone: the decision the protocol asks of it at a complete head."""
    lane = RestInferLane(_Responder(), LIMIT)  # type: ignore[arg-type]
    fields = [(b"host", b"t"), (b"content-length", b"10")]
    taken = lane_request(lane, b"POST", "1.1", b"/v2/models/m/versions/3/infer", fields)
    assert taken == ("/v2/models/m/versions/3/infer", dict(fields), "m", "3")
    url = b"/v2/models/m/infer"
    assert lane_request(lane, b"PUT", "1.1", url, fields) is None
    assert lane_request(lane, b"POST", "1.0", url, fields) is None
    assert lane_request(lane, b"POST", "1.1", url + b"?a", fields) is None
    assert lane_request(lane, b"POST", "1.1", b"/v2/models/m%2Fx/infer", fields) is None
    assert lane_request(lane, b"POST", "1.1", url, [(b"content-length", b"1x")]) is None
    assert (
        lane_request(lane, b"POST", "1.1", url, [(b"content-length", b"%d" % (LIMIT + 1))]) is None
    )
    assert lane_request(lane, b"POST", "1.1", url, []) == ("/v2/models/m/infer", {}, "m", None)


class _StubLane:
    """An ``InferLane`` that takes every infer route and answers with ``answer``."""

    limit = LIMIT

    def __init__(self, answer: Callable[[LaneResponse], Any]) -> None:
        self._answer = answer

    def target(self, path: str) -> tuple[str, str | None] | None:
        return "m", None

    async def serve(
        self, request: LaneRequest, response: LaneResponse, model: str, version: str | None
    ) -> None:
        await self._answer(response)


def _written(lane: _StubLane | None, app: Callable, request: bytes) -> tuple[bytes, bool]:
    """What a connection with ``lane`` (None: none) writes for ``request``, and whether it
    was closed; the ``date`` field left out."""

    async def main() -> tuple[bytes, bool]:
        protocol_class = CorkedHttpToolsProtocol.configured(ConnectionLimits(), LIMIT, None, lane)
        protocol, state, transport = connected(protocol_class, app)
        protocol.data_received(request)
        while state.tasks:
            await asyncio.gather(*state.tasks, return_exceptions=True)
        written = b"".join(transport.written)
        lines = [line for line in written.split(b"\r\n") if not line.startswith(b"date: ")]
        return b"\r\n".join(lines), transport.closing

    return asyncio.run(main())


def test_what_escapes_the_lane_is_answered_as_uvicorn_answers_an_app_that_fails() -> None:
    async def escapes(response: LaneResponse) -> None:
        raise RuntimeError("an error handler failed")

    async def failing_app(scope: dict, receive: Callable, send: Callable) -> None:
        raise RuntimeError("an app failed")

    lane = _written(_StubLane(escapes), _app, _post("/v2/models/m/infer"))
    asgi = _written(None, failing_app, _post("/v2/models/m/infer"))
    assert lane == asgi
    assert lane[0].startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and lane[1]
    assert lane[0].endswith(b"connection: close\r\n\r\nInternal Server Error")


class _Parts:
    """An async iterator over ``parts`` (what render.py sets as a response's stream)."""

    def __init__(self, parts: list[bytes]) -> None:
        self._parts = iter(parts)

    def __aiter__(self) -> _Parts:
        return self

    async def __anext__(self) -> bytes:
        for part in self._parts:
            return part
        raise StopAsyncIteration


@pytest.mark.parametrize("length", [None, 7, 6, 8])
def test_a_streamed_answer_is_framed_as_uvicorn_frames_it(length: int | None) -> None:
    """By its content-length (the parts must add up to it, else the connection closes
    after what was sent), chunked without one; as uvicorn's ``send`` for the ASGI way."""
    fields = [] if length is None else [(b"content-length", b"%d" % length)]

    async def streams(response: LaneResponse) -> None:
        response.stream = _Parts([b"abc", b"", b"defg"])
        if length is not None:
            response.content_length = length

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": fields})
        for part in (b"abc", b"", b"defg"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    lane = _written(_StubLane(streams), _app, _post("/v2/models/m/infer"))
    asgi = _written(None, app, _post("/v2/models/m/infer"))
    if length in (None, 7):
        assert lane == asgi and not lane[1]
        framed = b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n" if length is None else b"abcdefg"
        assert lane[0].endswith(b"\r\n\r\n" + framed)
    else:  # (uvicorn's cycle raises on a wrong length: its app's task fails and closes)
        assert lane[1] and asgi[1]


def _split_route(path: str) -> tuple[str, str | None] | None:
    """The route read as the path's segments (as the lane read it before it found it by
    position): the reference ``infer_route`` must agree with."""
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    parts = path.split("/")
    if len(parts) == 5 and parts[3]:
        return parts[3], None
    if len(parts) == 7 and parts[4] == "versions" and parts[3] and parts[5]:
        return parts[3], parts[5]
    return None


def test_infer_route_reads_every_path_as_its_segments_read() -> None:
    pieces = ["/", "m", "versions", "/versions/", "infer", "/infer", ""]
    middles = [""] + pieces
    middles += [a + b for a in pieces for b in pieces]
    middles += [a + b + c for a in pieces for b in pieces for c in pieces]
    paths = [
        prefix + middle + suffix
        for prefix in ("/v2/models/", "/v2/models", "/v2/model/")
        for middle in middles
        for suffix in ("/infer", "infer", "")
    ]
    wrong = [path for path in paths if infer_route(path) != _split_route(path)]
    assert not wrong, wrong[:5]
    assert infer_route("/v2/models/m/versions/3/infer") == ("m", "3")
    assert infer_route("/v2/models/m/infer") == ("m", None)


def test_a_lane_response_carries_the_servers_current_default_headers() -> None:
    """The default headers' lines are kept for the list uvicorn made (a new one each
    second, with the new date): a response after a new list carries the new date."""

    async def heads() -> list[bytes]:
        loop = asyncio.get_running_loop()
        raw = MemoryTransport()
        written = []
        for date in (b"one", b"two", b"two"):
            defaults = [(b"date", date), (b"server", b"oipserve")]
            corked = CorkedTransport(raw, loop)
            cycle = LaneCycle({}, corked, FlowControl(raw), defaults, True, _no, loop)
            await cycle.send_whole(200, [b"content-length: 1\r\n"], b"x")
            written.append(b"".join(raw.written))
            raw.written.clear()
        return written

    one, two, again = asyncio.run(heads())
    assert one == b"HTTP/1.1 200 OK\r\ndate: one\r\nserver: oipserve\r\ncontent-length: 1\r\n\r\nx"
    assert two == again == one.replace(b"date: one", b"date: two")


def _no() -> None:
    pass
