"""A restricted API's key counts only in the request head, on every front (issue #35, row 1).

httptools reports a chunked body's trailer fields through the same callback as header
fields, and uvicorn added them to the request's headers: a key sent as a trailer, after
an empty head, opened every restricted group (and the extra fronts of ``--http-workers``
forwarded it to the primary as a header). Trailers are now dropped unread.

One server, two HTTP fronts, every REST group behind a header of its own. Each group is
asked on each front with its key in the trailer only (403), in the head (allowed), and
in both a trailer and a pipelined request after it (the next request has no key).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.support.raw_http import read_responses
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, front_pid, socket_to_front

#: REST API group -> (method, path, body) of one request in it.
CALLS: dict[str, tuple[str, str, bytes]] = {
    "health": ("GET", "/v2/health/ready", b""),
    "metadata": ("GET", "/v2/models/simple", b""),
    "inference": (
        "POST",
        "/v2/models/simple/infer",
        json.dumps(
            {
                "inputs": [
                    {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                    for n in ("INPUT0", "INPUT1")
                ]
            }
        ).encode(),
    ),
    "model-config": ("GET", "/v2/models/simple/config", b""),
    "statistics": ("GET", "/v2/models/simple/stats", b""),
    "model-repository": ("POST", "/v2/repository/index", b"{}"),
    "shared-memory": ("GET", "/v2/systemsharedmemory/status", b""),
    "hardware": ("GET", "/v2/hardware", b""),
    "workers": ("GET", "/v2/workers/nothing-here", b""),
}


def _header(api: str) -> str:
    return f"X-{api.title()}-Key"


def _value(api: str) -> str:
    return f"{api}:s3cr3t=="


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--devices", "cpu", "--http-workers", "2"]
    args += ["--model-control-mode", "explicit", "--load-model", "simple"]
    for api in CALLS:
        args += ["--http-restricted-api", f"{api}:{_header(api)}={_value(api)}"]
    proc = ServerProcess(SAMPLE_REPOSITORY, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


@pytest.fixture(scope="module", params=["primary", "extra front"])
def front(request: pytest.FixtureRequest, server: ServerProcess) -> int:
    return front_pid(server, request.param)


def chunked(api: str, head: dict[str, str], trailer: dict[str, str]) -> bytes:
    """``api``'s request with a chunked body (its data in one chunk) and a trailer."""
    method, path, body = CALLS[api]
    fields = {"Host": "x", "Transfer-Encoding": "chunked", **head}
    if body:
        fields["Content-Type"] = "application/json"
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
    data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
    tail = "".join(f"{k}: {v}\r\n" for k, v in trailer.items()).encode()
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data + b"0\r\n" + tail + b"\r\n"


def exchange(sock: socket.socket, *requests: bytes) -> list[int]:
    """Send ``requests`` in one write (as an attacker would); the statuses in order."""
    sock.sendall(b"".join(requests))
    return [status for status, _, _ in read_responses(sock, len(requests))]


@pytest.mark.parametrize("api", list(CALLS))
def test_a_key_sent_as_a_trailer_opens_nothing(server: ServerProcess, front: int, api: str) -> None:
    key = {_header(api): _value(api)}
    with socket_to_front(server, front) as sock:
        (status,) = exchange(sock, chunked(api, {}, key))
        assert status == 403, f"{api}: the trailer's key was honoured ({status})"
        # Announced with ``Trailer:`` and in another case, it counts no more.
        lower = {_header(api).lower(): _value(api)}
        (status,) = exchange(sock, chunked(api, {"Trailer": _header(api)}, lower))
        assert status == 403
        # The same request with the key in its head is allowed: the refusal was the rule's.
        (status,) = exchange(sock, chunked(api, key, {}))
        assert status != 403, f"{api}: refused with its key in the head"


def test_a_trailer_does_not_reach_the_next_request(server: ServerProcess, front: int) -> None:
    api = "model-repository"
    key = {_header(api): _value(api)}
    with socket_to_front(server, front) as sock:
        statuses = exchange(sock, chunked(api, key, key), chunked(api, {}, {}))
        assert statuses == [200, 403], statuses
    assert "Traceback" not in server.log
