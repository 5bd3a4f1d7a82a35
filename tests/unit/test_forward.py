"""Forwarder: a secondary front's requests reach the primary unchanged, its answers come back.

The primary is a real uvicorn server on a Unix socket (a file path, or a Linux abstract name)
serving a small app that reports what it received. The forwarder is driven two ways: called
as an ASGI app (exact control over the body messages and over a client leaving), and behind
a real front (uvicorn on 127.0.0.1, with ``http.client`` or a raw socket in a thread). The
servers are started and stopped without uvicorn's main loop, whose 0.1 s ticks would make
these tests slow; the time limits are generous, for a shared, noisy machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import itertools
import json
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import h11
import pytest
import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from oipserve.scaleout import forward
from oipserve.scaleout.forward import Forwarder

MiB = 1 << 20
#: Seconds: far above what any step here takes, so only a hang fails on it.
WAIT = 10.0
_names = itertools.count()


def abstract_name() -> str:
    return f"\0oipserve-test-forward-{os.getpid()}-{next(_names)}"


def unix_listener(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(address)
    return sock


def big_body(size: int) -> bytes:
    """``size`` bytes in 64 KiB pieces, each its own byte value (a piece lost or reordered
    shows)."""
    piece = 64 * 1024
    return b"".join(
        bytes([i % 251]) * min(piece, size - start) for i, start in enumerate(range(0, size, piece))
    )


# ---- the primary: a real uvicorn server on a Unix socket -------------------------------


class Primary:
    """A small ASGI app standing in for the primary front, with what it saw.

    ``/info`` answers JSON describing the request; ``/echo`` the body (with a header named
    by ``Connection``, which must not come through); ``/big?size=N`` N bytes, streamed;
    ``/missing`` a 404; ``/early`` a 413 without reading the body; ``/close`` closes the
    connection after its answer; ``/together?n=N`` answers once N requests are in; ``/hang`` starts
    an answer and waits for the connection to go.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.connections = 0
        self.requests: list[dict[str, Any]] = []
        #: A request's connection went away (its receive() said http.disconnect).
        self.gone = asyncio.Event()
        self._together = 0
        self._all_together = asyncio.Event()
        self.server: uvicorn.Server | None = None

    def protocol(self) -> type[HttpToolsProtocol]:
        """uvicorn's own protocol, counting the connections it is given."""
        primary = self

        class Counting(HttpToolsProtocol):
            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                primary.connections += 1
                super().connection_made(transport)

        return Counting

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        assert scope["type"] == "http"
        path = scope["path"]
        if path == "/hang":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.gone.set()
            return
        if path == "/early":  # answered before the body is read
            await answer_json(send, 413, {"error": "too large"})
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        query = scope["query_string"]
        seen = {
            "method": scope["method"],
            "target": (scope["raw_path"] + (b"?" + query if query else b"")).decode(),
            "headers": [[name.decode(), value.decode()] for name, value in scope["headers"]],
            "body_size": len(body),
        }
        self.requests.append(seen)
        if path == "/echo":
            headers = [
                (b"content-type", b"application/octet-stream"),
                (b"content-length", b"%d" % len(body)),
                (b"x-hop", b"for this connection only"),
                (b"connection", b"x-hop"),
                (b"x-end", b"kept"),
            ]
            await answer(send, 200, headers, bytes(body))
        elif path == "/big":
            size = int(query.decode().removeprefix("size="))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            data = big_body(size)
            for start in range(0, size, 64 * 1024):
                piece = data[start : start + 64 * 1024]
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif path == "/close":
            await answer(send, 200, [(b"connection", b"close"), (b"content-length", b"3")], b"bye")
        elif path == "/missing":
            await answer_json(send, 404, {"error": "model 'nope' is not known"})
        elif path == "/together":
            self._together += 1
            if self._together >= int(query.decode().removeprefix("n=")):
                self._all_together.set()
            await asyncio.wait_for(self._all_together.wait(), WAIT)
            await answer_json(send, 200, seen)
        else:
            await answer_json(send, 200, seen)


async def answer(send: Callable, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def answer_json(send: Callable, status: int, document: Any) -> None:
    body = json.dumps(document).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await answer(send, status, headers, body)


@contextlib.asynccontextmanager
async def serving(app: Any, sock: socket.socket, **options: Any) -> AsyncIterator[uvicorn.Server]:
    """A real uvicorn server on ``sock``: its startup, and a quick close of its own."""
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, **options)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    try:
        yield server
    finally:
        for listener in server.servers:
            listener.close()
        for connection in list(server.server_state.connections):
            connection.transport.close()
        tasks = list(server.server_state.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=WAIT)
        for task in tasks:
            task.cancel()
        sock.close()


@contextlib.asynccontextmanager
async def primary_at(address: str, **options: Any) -> AsyncIterator[Primary]:
    primary = Primary(address)
    async with serving(primary, unix_listener(address), http=primary.protocol(), **options) as s:
        primary.server = s
        yield primary


@pytest.fixture(params=["path", "abstract"])
def address(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "abstract":
        return abstract_name()
    path = str(tmp_path / "p.sock")
    assert len(path) < 100, path  # sun_path holds 108 bytes
    return path


@pytest.fixture
async def primary(address: str) -> AsyncIterator[Primary]:
    async with primary_at(address) as primary:
        yield primary


@pytest.fixture
def forwarder(primary: Primary) -> Iterator[Forwarder]:
    # Idle connections kept a minute: reuse does not depend on how fast the machine is.
    forwarder = Forwarder(primary.address, idle_seconds=60)
    yield forwarder
    forwarder.close()


@pytest.fixture
async def front(forwarder: Forwarder) -> AsyncIterator[int]:
    """A real front (uvicorn on 127.0.0.1) whose app is the forwarder: its port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    async with serving(forwarder, sock):
        yield port


# ---- the forwarder called as an ASGI app ----------------------------------------------


class Client:
    """The front's side of one ASGI request, faked: the body messages it hands over (the
    last with ``more_body`` false, unless ``cut``: then the client leaves after them)."""

    def __init__(self, parts: Iterable[bytes] = (b"",), cut: bool = False) -> None:
        self.parts = list(parts)
        self.cut = cut
        self.leave = asyncio.Event()
        if cut:
            self.leave.set()
        self.sent: list[dict[str, Any]] = []
        self.got_body = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.parts:
            body = self.parts.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.parts) or self.cut}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body":
            self.got_body.set()


class Answer:
    """What the forwarder sent, checked to be one well-formed ASGI answer."""

    def __init__(self, sent: list[dict[str, Any]]) -> None:
        start, *bodies = sent
        assert start["type"] == "http.response.start"
        assert bodies and all(message["type"] == "http.response.body" for message in bodies)
        more = [message.get("more_body", False) for message in bodies]
        assert more == [True] * (len(bodies) - 1) + [False]
        self.status: int = start["status"]
        self.headers: list[tuple[bytes, bytes]] = list(start["headers"])
        self.body = b"".join(message["body"] for message in bodies)
        self.messages = len(bodies)

    def header(self, name: str) -> list[str]:
        return [value.decode() for key, value in self.headers if key == name.encode()]

    def json(self) -> Any:
        return json.loads(self.body)


def http_scope(method: str, target: str, headers: Iterable[tuple[bytes, bytes]]) -> dict:
    path, _, query = target.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": list(headers),
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }


async def call(
    forwarder: Forwarder,
    method: str = "GET",
    target: str = "/info",
    headers: Iterable[tuple[bytes, bytes]] = ((b"host", b"front.test"),),
    parts: Iterable[bytes] = (b"",),
) -> Answer:
    client = Client(parts)
    scope = http_scope(method, target, headers)
    await asyncio.wait_for(forwarder(scope, client.receive, client.send), WAIT)
    return Answer(client.sent)


def seen_headers(seen: dict) -> list[tuple[str, str]]:
    return [(name, value) for name, value in seen["headers"]]


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0.01)


# ---- a real client, in a thread ---------------------------------------------------------


def fetch(
    port: int,
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes | Iterable[bytes] | None = None,
    connection: http.client.HTTPConnection | None = None,
) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request through the front with ``http.client`` (chunked if ``body`` is not bytes)."""
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        chunked = body is not None and not isinstance(body, bytes)
        if isinstance(body, bytes):
            conn.putheader("Content-Length", str(len(body)))
        elif chunked:
            conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders(body, encode_chunked=chunked)
        response = conn.getresponse()
        data = response.read()
        return response.status, [(k.lower(), v) for k, v in response.getheaders()], data
    finally:
        if connection is None:
            conn.close()


def values(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [value for key, value in headers if key == name]


# ---- requests and answers go through unchanged ----------------------------------------


async def test_get_with_query_and_repeated_headers(front: int, primary: Primary) -> None:
    target = "/info/a%2Fb?a=1&b=x%20y&a=2"
    headers = [("X-Rep", "one"), ("X-Other", "o"), ("X-Rep", "two")]
    status, _, body = await asyncio.to_thread(fetch, front, "GET", target, headers)
    assert status == 200
    seen = json.loads(body)
    assert seen["method"] == "GET"
    assert seen["target"] == target  # the raw path: %2F stays encoded
    got = seen_headers(seen)
    assert [pair for pair in got if pair[0].startswith("x-")] == [
        ("x-rep", "one"),
        ("x-other", "o"),
        ("x-rep", "two"),
    ]
    assert ("host", f"127.0.0.1:{front}") in got
    names = {name for name, _ in got}
    assert not names & {"content-length", "transfer-encoding", "connection"}
    assert seen["body_size"] == 0


async def test_post_body_echoed_with_its_length(front: int, primary: Primary) -> None:
    body = os.urandom(MiB)
    status, headers, echoed = await asyncio.to_thread(fetch, front, "POST", "/echo", (), body)
    assert status == 200
    assert echoed == body
    # The client sees the primary's framing, and no header of the primary's connection.
    assert values(headers, "content-length") == [str(MiB)]
    assert not values(headers, "transfer-encoding")
    assert not values(headers, "x-hop")
    assert values(headers, "x-end") == ["kept"]
    got = seen_headers(primary.requests[-1])
    assert ("content-length", str(MiB)) in got
    assert "transfer-encoding" not in {name for name, _ in got}


async def test_chunked_request_echoed(front: int, primary: Primary) -> None:
    parts = [bytes([i]) * 100_000 for i in range(5)]
    status, _, echoed = await asyncio.to_thread(fetch, front, "POST", "/echo", (), iter(parts))
    assert status == 200
    assert echoed == b"".join(parts)
    names = [name for name, _ in seen_headers(primary.requests[-1])]
    # Chunked, or a length when the front had the whole body in its first message.
    assert names.count("transfer-encoding") + names.count("content-length") == 1


async def test_request_body_framing(forwarder: Forwarder, primary: Primary) -> None:
    host = (b"host", b"front.test")
    # No length, a body in several messages: chunked, streamed.
    parts = [b"a" * 70_000, b"b" * 70_000, b"c" * 10]
    answer = await call(forwarder, "POST", "/echo", [host], parts)
    assert answer.body == b"".join(parts)
    got = seen_headers(primary.requests[-1])
    assert ("transfer-encoding", "chunked") in got
    assert "content-length" not in {name for name, _ in got}
    # No length, the whole body in the first message: its length.
    answer = await call(forwarder, "POST", "/echo", [host], [b"whole"])
    assert answer.body == b"whole"
    got = seen_headers(primary.requests[-1])
    assert ("content-length", "5") in got
    assert "transfer-encoding" not in {name for name, _ in got}
    # The client's length, with the body in several messages: kept.
    answer = await call(forwarder, "PUT", "/echo", [host, (b"content-length", b"6")], [b"abc"] * 2)
    assert answer.body == b"abcabc"
    assert seen_headers(primary.requests[-1]) == [("host", "front.test"), ("content-length", "6")]
    # No body: neither.
    answer = await call(forwarder, "GET", "/info", [host])
    assert seen_headers(answer.json()) == [("host", "front.test")]
    assert primary.connections == 1


async def test_hop_by_hop_headers_stop_here(forwarder: Forwarder, primary: Primary) -> None:
    """The hop-by-hop headers stop at the front; those ``Connection`` names go on: the
    server (every front) is their recipient, and the primary sees them from a client too."""
    headers = [
        (b"connection", b"keep-alive, X-Mine"),
        (b"x-mine", b"for the server"),
        (b"keep-alive", b"timeout=5"),
        (b"te", b"trailers"),
        (b"upgrade", b"h2c"),
        (b"proxy-connection", b"keep-alive"),
        (b"expect", b"100-continue"),
        (b"x-keep", b"1"),
        (b"trailer", b"x-t"),
    ]
    answer = await call(forwarder, "GET", "/info?q", headers)
    assert answer.status == 200
    # No Host from the client (HTTP/1.0): the front's address.
    assert seen_headers(answer.json()) == [
        ("host", "127.0.0.1:8000"),
        ("x-mine", "for the server"),
        ("x-keep", "1"),
    ]
    assert answer.json()["target"] == "/info?q"


async def test_the_body_delivered_is_the_body_framed(
    forwarder: Forwarder, primary: Primary
) -> None:
    """A body that arrived whole is framed by its length, not the client's Content-Length:
    llhttp delivers none for a request it takes as an upgrade, whatever the header says
    (the forward's Content-Length then promised bytes never sent: 503)."""
    host = (b"host", b"front.test")
    answer = await call(forwarder, "POST", "/echo", [host, (b"content-length", b"2")], [b""])
    assert answer.status == 200 and answer.body == b""
    assert seen_headers(primary.requests[-1]) == [("host", "front.test"), ("content-length", "0")]
    answer = await call(forwarder, "POST", "/echo", [host, (b"Content-Length", b"9")], [b"abc"])
    assert answer.status == 200 and answer.body == b"abc"
    assert seen_headers(primary.requests[-1]) == [("host", "front.test"), ("content-length", "3")]


async def test_large_answer_streamed(front: int, forwarder: Forwarder) -> None:
    size = 8 * MiB + 12345
    status, headers, body = await asyncio.to_thread(fetch, front, "GET", f"/big?size={size}")
    assert status == 200
    assert len(body) == size
    assert body == big_body(size)
    assert values(headers, "transfer-encoding") == ["chunked"]  # the front's own framing
    answer = await call(forwarder, "GET", f"/big?size={size}")
    assert answer.body == big_body(size)
    assert answer.messages > 1  # streamed, not gathered (Answer checked more_body)
    assert not answer.header("transfer-encoding")


async def test_error_answer_passed_through(front: int, forwarder: Forwarder) -> None:
    status, headers, body = await asyncio.to_thread(fetch, front, "GET", "/missing")
    assert status == 404
    assert values(headers, "content-type") == ["application/json"]
    assert json.loads(body) == {"error": "model 'nope' is not known"}
    assert values(headers, "content-length") == [str(len(body))]
    answer = await call(forwarder, "GET", "/missing")
    assert (answer.status, answer.messages) == (404, 1)  # one read, one message
    assert answer.json() == {"error": "model 'nope' is not known"}


async def test_head(front: int, forwarder: Forwarder, primary: Primary) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", front, timeout=WAIT)
    try:
        status, headers, body = await asyncio.to_thread(
            fetch, front, "HEAD", "/info", connection=conn
        )
        assert (status, body) == (200, b"")
        assert int(values(headers, "content-length")[0]) > 0
        # The connection's framing is intact: the next request on it is answered.
        status, _, body = await asyncio.to_thread(fetch, front, "GET", "/info", connection=conn)
        assert status == 200
        assert json.loads(body)["method"] == "GET"
    finally:
        conn.close()
    answer = await call(forwarder, "HEAD", "/info")
    assert (answer.status, answer.body) == (200, b"")
    assert answer.header("content-length")
    assert [seen["method"] for seen in primary.requests] == ["HEAD", "GET", "HEAD"]


# ---- the connection pool --------------------------------------------------------------


async def test_connection_reused(front: int, forwarder: Forwarder, primary: Primary) -> None:
    for i in range(4):
        answer = await call(forwarder, "POST", "/echo", parts=[b"x" * i * 1000, b"y"])
        assert answer.body == b"x" * i * 1000 + b"y"
        assert (await call(forwarder, "GET", "/missing")).status == 404
    conn = http.client.HTTPConnection("127.0.0.1", front, timeout=WAIT)
    try:
        for _ in range(3):
            status, _, _ = await asyncio.to_thread(fetch, front, "GET", "/info", connection=conn)
            assert status == 200
    finally:
        conn.close()
    assert len(primary.requests) == 11
    assert primary.connections == 1


async def test_connection_closed_after_answer_not_pooled(
    forwarder: Forwarder, primary: Primary
) -> None:
    answer = await call(forwarder, "GET", "/close")
    assert (answer.status, answer.body) == (200, b"bye")
    assert not answer.header("connection")
    assert not forwarder._idle
    assert (await call(forwarder)).status == 200
    assert primary.connections == 2


async def test_answer_before_the_body(forwarder: Forwarder, primary: Primary) -> None:
    """The primary may answer before reading the body; the answer still comes through."""
    parts = [bytes([i]) * 64 * 1024 for i in range(16)]
    headers = [(b"host", b"t"), (b"content-length", b"%d" % MiB)]
    answer = await call(forwarder, "POST", "/early", headers, parts)
    assert answer.status == 413
    assert answer.json() == {"error": "too large"}
    assert (await call(forwarder)).status == 200
    assert primary.connections <= 2  # reused only if the body had been sent whole


async def test_idle_limit(primary: Primary) -> None:
    forwarder = Forwarder(primary.address, idle_limit=2, idle_seconds=60)
    try:
        answers = await asyncio.gather(*(call(forwarder, "GET", "/together?n=3") for _ in "abc"))
        assert [answer.status for answer in answers] == [200] * 3
        assert primary.connections == 3
        assert len(forwarder._idle) == 2
        for _ in range(3):
            assert (await call(forwarder)).status == 200
        assert primary.connections == 3
    finally:
        forwarder.close()


async def test_old_idle_connection_not_reused(primary: Primary) -> None:
    forwarder = Forwarder(primary.address, idle_seconds=0.05)
    try:
        assert (await call(forwarder)).status == 200
        await asyncio.sleep(0.2)  # only ever longer than idle_seconds: not timing-fragile
        assert (await call(forwarder)).status == 200
        assert primary.connections == 2
    finally:
        forwarder.close()


async def test_connection_closed_by_primary_not_reused(address: str) -> None:
    # The primary closes idle connections after 0.1 s; the forwarder would keep them 60 s.
    async with primary_at(address, timeout_keep_alive=0.1) as primary:
        forwarder = Forwarder(address, idle_seconds=60)
        try:
            assert (await call(forwarder)).status == 200
            assert primary.server is not None
            await until(lambda: not primary.server.server_state.connections)
            await asyncio.sleep(0.01)  # the forwarder's side sees the close
            assert (await call(forwarder)).status == 200
            assert primary.connections == 2
        finally:
            forwarder.close()


async def test_stale_connection_retried(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: the primary closed the pooled connection as the request left."""
    async with primary_at(address, timeout_keep_alive=0.1) as primary:
        forwarder = Forwarder(address, idle_seconds=60)
        try:
            assert (await call(forwarder)).status == 200
            assert primary.server is not None
            await until(lambda: not primary.server.server_state.connections)
            # The forwarder takes the closed connection as if it had not seen the close yet.
            monkeypatch.setattr(forward._Upstream, "fit", lambda self, now, idle_seconds: True)
            answer = await call(forwarder, "GET", "/info?again")
            assert answer.status == 200
            assert answer.json()["target"] == "/info?again"
            assert primary.connections == 2
        finally:
            forwarder.close()


class Scripted:
    """A bare HTTP/1.1 server (h11) that answers ``answers`` requests on each connection and
    closes the connection when the next request's head arrives, without answering: what a
    keep-alive close crossing a request looks like from the forwarder."""

    def __init__(self, address: str, answers: int, sock: socket.socket | None = None) -> None:
        self.address = address
        self.answers = answers
        self.sock = sock
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Scripted:
        sock = self.sock or unix_listener(self.address)
        self.server = await asyncio.start_unix_server(self._serve, sock=sock)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        conn = h11.Connection(h11.SERVER)

        async def next_event() -> Any:
            while (event := conn.next_event()) is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            return event

        try:
            for _ in range(self.answers):
                request = await next_event()
                if not isinstance(request, h11.Request):
                    return
                size = 0
                while not isinstance(event := await next_event(), h11.EndOfMessage):
                    size += len(event.data)
                body = b"%s %d" % (request.method, size)
                head = h11.Response(
                    status_code=200, headers=[(b"content-length", b"%d" % len(body))]
                )
                writer.write(conn.send(head) + conn.send(h11.Data(data=body)))
                writer.write(conn.send(h11.EndOfMessage()))
                conn.start_next_cycle()
            await next_event()  # the next request's head
        except (h11.RemoteProtocolError, OSError):
            pass
        finally:
            writer.close()


async def test_retry_after_crossing_close(address: str) -> None:
    async with Scripted(address, answers=1) as primary:
        forwarder = Forwarder(address, idle_seconds=60)
        try:
            assert (await call(forwarder)).body == b"GET 0"
            # Pooled, then closed on the next request: sent again on a fresh connection.
            assert (await call(forwarder)).body == b"GET 0"
            assert primary.connections == 2
            # A body still whole in the first message can be sent again too.
            assert (await call(forwarder, "POST", "/echo", parts=[b"abc"])).body == b"POST 3"
            assert primary.connections == 3
            # Not one read from the client in parts: it cannot be, so 503.
            answer = await call(forwarder, "POST", "/echo", parts=[b"abc", b"def"])
            assert answer.status == 503
            assert answer.json()["error"].startswith(  # maybe then "(Connection reset by peer)"
                "the primary front is not reachable: it closed the connection before answering"
            )
            assert primary.connections == 3
        finally:
            forwarder.close()


async def test_fresh_connection_closed_unanswered(address: str) -> None:
    async with Scripted(address, answers=0) as primary:
        forwarder = Forwarder(address)
        try:
            answer = await call(forwarder)
            assert answer.status == 503
            assert answer.header("retry-after") == ["1"]
            assert "closed the connection before answering" in answer.json()["error"]
            assert primary.connections == 1  # a fresh connection is not tried again
        finally:
            forwarder.close()


# ---- failures -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def raw_primary(address: str, reply: bytes) -> AsyncIterator[None]:
    """A primary that reads a request's head, writes ``reply`` and closes the connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve, sock=unix_listener(address))
    try:
        yield
    finally:
        server.close()


async def test_interim_answers_skipped(address: str) -> None:
    reply = (
        b"HTTP/1.1 103 Early Hints\r\nlink: </a.js>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    forwarder = Forwarder(address)
    async with raw_primary(address, reply):
        answer = await call(forwarder)
    forwarder.close()
    assert (answer.status, answer.body, answer.headers) == (200, b"ok", [(b"content-length", b"2")])


async def test_answer_not_http(address: str) -> None:
    async with raw_primary(address, b"SSH-2.0-OpenSSH_9.6\r\n\r\n"):
        answer = await call(Forwarder(address))
    assert answer.status == 503
    assert answer.json()["error"].startswith(
        "the primary front is not reachable: its answer is not valid HTTP/1.1 ("
    )


async def test_answer_broken_off(address: str) -> None:
    """Once the answer has started, a failure cuts the client's connection: no 503."""
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10
    async with raw_primary(address, reply):
        forwarder = Forwarder(address)
        client = Client()
        with pytest.raises(ConnectionError, match="the primary front's answer broke off"):
            await asyncio.wait_for(
                forwarder(http_scope("GET", "/", [(b"host", b"t")]), client.receive, client.send),
                WAIT,
            )
        assert client.sent[0]["status"] == 200
        assert all(message.get("more_body") for message in client.sent[1:])
        assert not forwarder._idle
        # Through a real front: the client sees its connection end before the body does.
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        async with serving(forwarder, sock):
            with pytest.raises(http.client.IncompleteRead):
                await asyncio.to_thread(fetch, port, "GET", "/")


async def test_expect_100_continue(front: int, primary: Primary) -> None:
    """The front answers Expect: 100-continue itself; the primary is not asked to."""

    def post_after_continue() -> bytes:
        with socket.create_connection(("127.0.0.1", front), timeout=WAIT) as sock:
            head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
            sock.sendall(head + b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
            received = sock.recv(1024)
            assert received.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), received
            sock.sendall(b"hello")
            while data := sock.recv(65536):
                received += data
            return received

    received = await asyncio.to_thread(post_after_continue)
    assert received.split(b"\r\n", 3)[2] == b"HTTP/1.1 200 OK"
    assert received.endswith(b"\r\n\r\nhello")
    assert "expect" not in {name for name, _ in seen_headers(primary.requests[-1])}


@pytest.mark.parametrize("kind", ["path", "abstract"])
async def test_primary_down(kind: str, tmp_path: Path) -> None:
    address = str(tmp_path / "none.sock") if kind == "path" else abstract_name()
    forwarder = Forwarder(address)
    answer = await call(forwarder, "POST", "/echo", parts=[b"body"])
    assert answer.status == 503
    assert answer.header("content-type") == ["application/json"]
    assert answer.header("retry-after") == ["1"]
    error = answer.json()["error"]
    shown = address if kind == "path" else "@" + address[1:]
    reason = "No such file or directory" if kind == "path" else "Connection refused"
    assert error == f"the primary front is not reachable: cannot connect to {shown}: {reason}"
    # Through a real front too.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    async with serving(forwarder, sock):
        status, headers, body = await asyncio.to_thread(fetch, port, "GET", "/info")
    assert status == 503
    assert values(headers, "retry-after") == ["1"]
    assert json.loads(body) == {"error": error}


def fill_backlog(address: str) -> list[socket.socket]:
    """Connections that fill the backlog of the listener at ``address`` (not accepting)."""
    fillers: list[socket.socket] = []
    while len(fillers) < 64:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(address)
        except BlockingIOError:
            sock.close()
            return fillers
        fillers.append(sock)
    raise AssertionError("the backlog never filled")


async def test_connect_waits_while_the_backlog_is_full(address: str) -> None:
    listener = unix_listener(address)
    listener.listen(0)
    fillers = fill_backlog(address)
    forwarder = Forwarder(address)
    try:
        task = asyncio.create_task(call(forwarder, "POST", "/echo", parts=[b"abc"]))
        await asyncio.sleep(0.05)
        assert not task.done()  # not a 503 at once: a full backlog is waited out
        async with Scripted(address, answers=1, sock=listener):
            answer = await task
        assert (answer.status, answer.body) == (200, b"POST 3")
    finally:
        for sock in fillers:
            sock.close()
        forwarder.close()


async def test_connect_timeout(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward, "CONNECT_TIMEOUT", 0.1)
    listener = unix_listener(address)
    listener.listen(0)
    fillers = fill_backlog(address)
    try:
        answer = await call(Forwarder(address))
        assert answer.status == 503
        assert answer.json()["error"].endswith(": no connection within 0.1 s")
    finally:
        for sock in [*fillers, listener]:
            sock.close()


async def test_client_leaving_mid_body(front: int, forwarder: Forwarder, primary: Primary) -> None:
    client = Client([b"x" * 1000], cut=True)
    scope = http_scope("POST", "/echo", [(b"host", b"t"), (b"content-length", b"100000")])
    await asyncio.wait_for(forwarder(scope, client.receive, client.send), WAIT)
    assert client.sent == []  # no one to answer
    await asyncio.wait_for(primary.gone.wait(), WAIT)  # the primary saw the request end
    assert not forwarder._idle  # its connection was not pooled
    assert (await call(forwarder)).status == 200
    assert primary.connections == 2
    # A real client leaving mid-body.
    primary.gone.clear()

    def leave_mid_body() -> None:
        with socket.create_connection(("127.0.0.1", front), timeout=WAIT) as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
            sock.sendall(b"x" * 1000)

    await asyncio.to_thread(leave_mid_body)
    await asyncio.wait_for(primary.gone.wait(), WAIT)
    status, _, _ = await asyncio.to_thread(fetch, front, "GET", "/info")
    assert status == 200
    # The pooled connection carried the cut request and was closed: the GET had a fresh one.
    assert primary.connections == 3


async def test_client_leaving_mid_answer(forwarder: Forwarder, primary: Primary) -> None:
    client = Client()
    scope = http_scope("GET", "/hang", [(b"host", b"t")])
    task = asyncio.create_task(forwarder(scope, client.receive, client.send))
    await asyncio.wait_for(client.got_body.wait(), WAIT)
    client.leave.set()
    await asyncio.wait_for(task, WAIT)  # ends quietly
    assert [message.get("more_body") for message in client.sent] == [None, True]
    await asyncio.wait_for(primary.gone.wait(), WAIT)  # its connection to the primary is closed
    assert not forwarder._idle
    assert (await call(forwarder)).status == 200


# ---- uvloop, the production event loop --------------------------------------------------


def test_on_uvloop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths where uvloop differs from asyncio: abstract names, writes to a closed
    transport (uvloop raises), a full backlog."""

    async def scenario() -> None:
        for address in (str(tmp_path / "u.sock"), abstract_name()):
            async with primary_at(address) as primary:
                forwarder = Forwarder(address, idle_seconds=60)
                try:
                    parts = [b"a" * 100_000, b"b" * 100_000]
                    answer = await call(forwarder, "POST", "/echo", parts=parts)
                    assert answer.body == b"".join(parts)
                    answer = await call(forwarder, "GET", f"/big?size={MiB}")
                    assert answer.body == big_body(MiB)
                    assert (await call(forwarder, "HEAD", "/info")).body == b""
                    assert primary.connections == 1
                finally:
                    forwarder.close()
        answer = await call(Forwarder(abstract_name()))
        assert answer.status == 503
        await test_retry_after_crossing_close(abstract_name())
        await test_connect_waits_while_the_backlog_is_full(abstract_name())
        await test_stale_connection_retried(abstract_name(), monkeypatch)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
