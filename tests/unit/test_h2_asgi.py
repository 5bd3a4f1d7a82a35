"""REST over HTTP/2 streams (``oipserve.front.http.h2_asgi``), driven in memory: the
listener's real ``Http2Connection`` and ``Call`` (which hands a stream that is not gRPC
to the REST app), a client of raw frames (``tests.support.h2_rest.RestPeer``) and small
ASGI apps standing in for Falcon's. The whole server is in tests/e2e/test_rest_over_h2.py.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import pytest

from oipserve.config.settings import Settings
from oipserve.front.grpc.h2.frames import (
    END_STREAM,
    ErrorCode,
    Frame,
    Setting,
    frame,
    rst_stream,
    window_update,
)
from oipserve.front.http.extensions import BODY_REFUSED, ON_DISCONNECT, RECEIVE_INTO
from oipserve.runtime.abandoned_work import LIMIT
from tests.support.grpc_peer import until
from tests.support.h2_rest import RestPeer

Message = dict[str, Any]


class EchoApp:
    """Reads the whole body by ``receive`` and answers what it saw as JSON (413 when the
    server refused the body, as ``front.rest.body`` does); ``reply`` bytes of body if set."""

    def __init__(self, reply: int = 0) -> None:
        self.scopes: list[Message] = []
        self.reply = reply
        self.cancelled = 0
        self.disconnected = 0

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        scope["extensions"][ON_DISCONNECT](self._gone)
        body = b""
        try:
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        status, answer = 200, json.dumps({"size": len(body), "method": scope["method"]}).encode()
        if scope.get(BODY_REFUSED):
            status, answer = 413, json.dumps({"error": scope[BODY_REFUSED]}).encode()
        elif self.reply:
            answer = b"x" * self.reply
        await send({"type": "http.response.start", "status": status, "headers": _json()})
        await send({"type": "http.response.body", "body": answer})

    def _gone(self) -> None:
        self.disconnected += 1


def _json() -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"connection", b"keep-alive")]


def _kinds(frames: list[tuple[int, int, int, bytes]], stream: int) -> list[int]:
    return [kind for kind, _, sid, _ in frames if sid == stream]


def _reset_code(frames: list[tuple[int, int, int, bytes]], stream: int) -> int | None:
    for kind, _, sid, payload in frames:
        if kind == Frame.RST_STREAM and sid == stream:
            return int(struct.unpack(">I", payload)[0])
    return None


async def _answer(peer: RestPeer, stream: int) -> tuple[dict[str, str], bytes, list[Any]]:
    """The response on ``stream`` once it ended: headers, body, and all frames seen."""
    seen: list[tuple[int, int, int, bytes]] = []

    def ended() -> bool:
        seen.extend(peer.transport.frames())
        return any(sid == stream and flags & END_STREAM for kind, flags, sid, _ in seen)

    assert await until(ended), seen
    headers: dict[str, str] = {}
    body = b""
    for kind, _, sid, payload in seen:
        if sid == stream and kind == Frame.HEADERS:
            headers = peer.headers_of(payload)
        elif sid == stream and kind == Frame.DATA:
            body += payload
    return headers, body, seen


async def test_a_get_is_served_by_the_app_with_an_http2_scope() -> None:
    app = EchoApp()
    peer = RestPeer(app)
    peer.request(1, "GET", "/v2/health%20x?q=1", (":authority", "h:1"), ("x-a", "b"))
    headers, body, frames = await _answer(peer, 1)
    assert headers[":status"] == "200" and "connection" not in headers  # RFC 9113, 8.2.2
    assert json.loads(body) == {"size": 0, "method": "GET"}
    (scope,) = app.scopes
    assert (scope["http_version"], scope["method"], scope["scheme"]) == ("2", "GET", "http")
    assert (scope["path"], scope["raw_path"], scope["query_string"]) == (
        "/v2/health x",
        b"/v2/health%20x",
        b"q=1",
    )
    assert scope["headers"] == [(b"host", b"h:1"), (b"x-a", b"b")]
    assert _kinds(frames, 1) == [Frame.HEADERS, Frame.DATA]
    assert not peer.service.calls  # no gRPC call was made of it


async def test_a_post_body_is_received_and_its_window_given_back() -> None:
    app = EchoApp()
    peer = RestPeer(app)
    peer.request(1, "POST", "/v2/models/m/infer", ("content-type", "application/json"), end=False)
    for _ in range(3):
        peer.data(1, b"a" * 10_000)
        await asyncio.sleep(0.01)  # the app takes it: the window comes back at once
    peer.data(1, b"", end=True)
    headers, body, frames = await _answer(peer, 1)
    assert headers[":status"] == "200" and json.loads(body)["size"] == 30_000
    given = sum(
        struct.unpack(">I", payload)[0]
        for kind, _, sid, payload in frames
        if kind == Frame.WINDOW_UPDATE and sid == 1
    )
    assert given == 30_000
    assert _reset_code(frames, 1) is None  # the client had ended: no RST_STREAM


@pytest.mark.parametrize(
    "fields",
    [
        [("connection", "close")],
        [("te", "gzip")],
        [("bad name", "x")],
        [("x-a", "a\x00b")],
        [("x-a", "b"), (":authority", "late")],
    ],
    ids=["connection", "te", "name", "value", "pseudo-late"],
)
async def test_malformed_requests_are_stream_errors(fields: list[tuple[str, str]]) -> None:
    """RFC 9113, 8.1.1: RST_STREAM PROTOCOL_ERROR, no app, the connection serves on."""
    app = EchoApp()
    peer = RestPeer(app)
    peer.request(1, "GET", "/v2", *fields)
    frames = await peer.written()
    assert _reset_code(frames, 1) == ErrorCode.PROTOCOL_ERROR
    assert not app.scopes
    peer.request(3, "GET", "/v2")
    headers, _, _ = await _answer(peer, 3)
    assert headers[":status"] == "200"


async def test_a_grpc_typed_get_is_still_refused_as_grpc_refuses_it() -> None:
    app = EchoApp()
    peer = RestPeer(app)
    peer.request(
        1, "GET", "/inference.GRPCInferenceService/ServerLive", ("content-type", "application/grpc")
    )
    assert _reset_code(await peer.written(), 1) == ErrorCode.PROTOCOL_ERROR
    assert not app.scopes


async def test_refused_heads_are_answered_with_json_errors() -> None:
    app = EchoApp()
    peer = RestPeer(app, Settings(model_repository=".", max_header_fields=8))
    peer.request(1, "GET", "/v2", ("x-a", "a\x01b"))
    headers, body, _ = await _answer(peer, 1)
    assert headers[":status"] == "400" and "control character" in json.loads(body)["error"]
    peer.request(3, "GET", "/v2", *[(f"x-{i}", "v") for i in range(9)])
    headers, body, _ = await _answer(peer, 3)
    assert headers[":status"] == "431" and "8 header fields" in json.loads(body)["error"]
    peer.request(5, "GET", "relative")
    headers, body, _ = await _answer(peer, 5)
    assert headers[":status"] == "400" and json.loads(body)["error"]
    # A padded value is malformed (RFC 9113, 8.2.1), but told, not reset (PaddedValue).
    peer.request(7, "GET", "/v2", ("x-a", " padded"))
    headers, body, _ = await _answer(peer, 7)
    assert headers[":status"] == "400" and "'x-a' starts or ends with" in json.loads(body)["error"]
    # A method HTTP/1.1's parser refuses: its answer, as the fronts forwarding it over
    # HTTP/1.1 give it (the primary's app answered in other words).
    peer.request(9, "BREW", "/v2")
    headers, body, _ = await _answer(peer, 9)
    assert headers[":status"] == "400"
    assert json.loads(body) == {"error": "Invalid HTTP request received."}
    assert not app.scopes
    peer.request(11, "PURGE", "/v2")  # one it takes goes to the app, as over HTTP/1.1
    headers, _, _ = await _answer(peer, 11)
    assert [scope["method"] for scope in app.scopes] == ["PURGE"]


async def test_a_body_of_no_declared_length_is_refused_past_the_limit() -> None:
    app = EchoApp()
    peer = RestPeer(app, Settings(model_repository=".", max_request_bytes=4096))
    peer.request(1, "POST", "/v2/models/m/infer", end=False)
    peer.data(1, b"a" * 3000)
    peer.data(1, b"a" * 3000)  # past 4096: the app's reading ends, with BODY_REFUSED
    headers, body, frames = await _answer(peer, 1)
    assert headers[":status"] == "413" and "4096" in json.loads(body)["error"]
    assert _reset_code(frames, 1) == ErrorCode.NO_ERROR  # stop sending (RFC 9113, 8.1)


async def test_a_client_reset_cancels_the_app_and_runs_on_disconnect() -> None:
    app = EchoApp()
    peer = RestPeer(app)
    peer.request(1, "POST", "/v2/models/m/infer", end=False)
    assert await until(lambda: app.scopes)
    peer.send(rst_stream(1, ErrorCode.CANCEL))
    assert await until(lambda: app.cancelled == 1 and app.disconnected == 1)
    assert not peer.connection.streams


async def test_a_body_that_stops_coming_is_dropped_after_the_body_timeout() -> None:
    app = EchoApp()
    settings = Settings(model_repository=".", body_timeout=0.2)
    peer = RestPeer(app, settings)
    peer.request(1, "POST", "/v2/models/m/infer", end=False)
    peer.data(1, b"a" * 100)
    assert await until(lambda: app.cancelled == 1, timeout=5)
    assert _reset_code(peer.transport.frames(), 1) == ErrorCode.CANCEL
    assert app.disconnected == 1 and not peer.connection.streams


async def test_a_body_is_not_timed_while_its_connection_is_held() -> None:
    """Not read while its abandoned requests run (``runtime.abandoned_work``): the
    body's wait is not the client's until the connection is read again."""
    app = EchoApp()
    settings = Settings(model_repository=".", body_timeout=0.1)
    peer = RestPeer(app, settings)
    peer.request(1, "POST", "/v2/models/m/infer", end=False)
    peer.data(1, b"a" * 100)
    abandoned = peer.connection.abandoned
    done = [abandoned.abandoned() for _ in range(LIMIT)]
    await asyncio.sleep(0.5)  # five body timeouts
    assert app.cancelled == 0
    for answered in done:
        answered()
    assert await until(lambda: app.cancelled == 1, timeout=5)


async def test_a_response_follows_the_client_windows() -> None:
    app = EchoApp(reply=5000)
    peer = RestPeer(app, peer_settings={Setting.INITIAL_WINDOW_SIZE: 1000})
    peer.request(1, "GET", "/big")
    await asyncio.sleep(0.05)
    frames = peer.transport.frames()
    sent = sum(len(p) for kind, _, sid, p in frames if kind == Frame.DATA and sid == 1)
    assert sent == 1000 and not any(flags & END_STREAM for _, flags, sid, _ in frames if sid == 1)
    peer.send(window_update(1, 4000))
    headers, body, _ = await _answer(peer, 1)
    assert len(body) == 4000  # the rest, then END_STREAM


async def test_a_response_the_client_does_not_take_is_dropped_after_the_send_timeout() -> None:
    app = EchoApp(reply=100_000)
    settings = Settings(model_repository=".", send_timeout=0.2)
    peer = RestPeer(app, settings, peer_settings={Setting.INITIAL_WINDOW_SIZE: 0})
    peer.request(1, "GET", "/big")
    assert await until(
        lambda: _reset_code(peer.transport.frames(), 1) == ErrorCode.CANCEL, timeout=5
    )
    assert not peer.connection.streams


async def test_receive_into_takes_a_declared_body_into_the_buffer() -> None:
    target = bytearray(20_000)
    got: list[int] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        got.append(await scope["extensions"][RECEIVE_INTO](memoryview(target)))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    peer = RestPeer(app)
    peer.request(1, "POST", "/x", ("content-length", "20000"), end=False)
    peer.data(1, b"a" * 5000)
    await asyncio.sleep(0)
    peer.data(1, b"b" * 15_000, end=True)
    headers, body, _ = await _answer(peer, 1)
    assert headers[":status"] == "204" and not body
    assert got == [20_000] and target == b"a" * 5000 + b"b" * 15_000


async def test_an_app_that_fails_answers_500_json() -> None:
    async def app(scope: Message, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    peer = RestPeer(app)
    peer.request(1, "GET", "/x")
    headers, body, _ = await _answer(peer, 1)
    assert headers[":status"] == "500" and json.loads(body)["error"]


async def test_grpc_calls_beside_rest_streams_are_untouched() -> None:
    app = EchoApp()
    peer = RestPeer(app)
    block = peer.encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/inference.GRPCInferenceService/ServerLive"),
            ("content-type", "application/grpc"),
        ]
    )
    peer.send(frame(Frame.HEADERS, 0x4, 1, block))
    peer.request(3, "GET", "/v2")
    peer.send(frame(Frame.DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x00"))
    _, body, _ = await _answer(peer, 3)
    assert json.loads(body)["method"] == "GET"
    assert await until(lambda: peer.service.calls == [("ServerLive", b"")])


async def test_the_shutdowns_503_without_a_window_for_its_body_is_a_reset() -> None:
    """``--shutdown-timeout`` ran out while a body was uploading and the client's window
    for answers was spent: a clean RST_STREAM CANCEL, not the 503's head without its body
    (it was that head, content-length 97 and no END_STREAM; found by fuzzing)."""
    peer = RestPeer(EchoApp(), peer_settings={Setting.INITIAL_WINDOW_SIZE: 0})
    peer.request(1, "POST", "/upload", ("content-length", "100"), end=False)
    peer.data(1, b"x" * 10)
    stream = peer.connection.streams[1]
    stream.give_up("the server is shutting down")
    frames = await peer.written()
    assert not [f for f in frames if f[0] == Frame.HEADERS and f[2] == 1]
    assert _reset_code(frames, 1) == ErrorCode.CANCEL
