"""HTTP at the byte level for tests that need what a library client hides or refuses to send."""

from __future__ import annotations

import http.client
import socket
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from tests.support.server import ServerProcess


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body) of one response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    length = int(fields.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), fields, rest


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` pipelined responses (each with a Content-Length), in order.

    One buffered reader for all of them: ``read_response`` drops whatever arrived after
    its response, which for pipelined requests is often the next response.
    """
    reader = sock.makefile("rb")
    answers = []
    for _ in range(count):
        status_line = reader.readline()
        if not status_line:
            raise ConnectionError(f"connection closed after {len(answers)} responses")
        fields: dict[str, str] = {}
        while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            fields[name.strip().lower()] = value.strip()
        body = reader.read(int(fields.get("content-length", "0")))
        answers.append((int(status_line.split()[1]), fields, body))
    return answers


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (EOF or reset)."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def json_infer(model: str, body: bytes) -> bytes:
    """A whole ``POST /v2/models/{model}/infer`` with a JSON ``body``, as sent on the wire."""
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: t\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def post_json(
    server: ServerProcess, model: str, body: bytes, timeout: float = 120
) -> tuple[int, dict[str, object]]:
    """POST a JSON inference body as it is; the status and the decoded answer (orjson:
    json took ~0.7 s for an answer of 2 M floats)."""
    connection = http.client.HTTPConnection(server.host_port, timeout=timeout)
    try:
        connection.request(
            "POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        connection.close()
