"""``--http-workers 2``: a request gets the same answer whichever front holds its connection.

Issue #35, row 11: the other front answered differently from the primary. Its forwards go
through clients (h11, grpc.aio) that check what they send more strictly than the fronts'
parsers check what they receive: forwarded gRPC metadata with an upper-case key or a control
byte failed INTERNAL with a traceback, ``grpc-timeout: 99999999H`` failed DEADLINE_EXCEEDED
at once, ``Connection: x-admin-key`` lost the admin header (403), two Host headers and
whitespace at the end of a value were refused by h11 (400), where the primary answered
OK / OK / 200 / 200 / 403. Every front now applies one table of rules
(``oipserve/front/header_rules.py``) before it routes, checks or forwards. Since issue #37,
row 8, a malformed HTTP/2 request (an upper-case or otherwise bad field name, NUL in a value,
a connection-specific field) is a stream error on every front (RST_STREAM PROTOCOL_ERROR,
RFC 9113, 8.1.1) where it used to be answered with those fields dropped.

Each case is sent, on a fresh connection, to each front (``socket_to_front`` opens
connections until one lands on the front wanted) and the answers are compared: the same
HTTP status or gRPC code on both, the one expected, never INTERNAL (but for a malformed
``grpc-timeout``, which is INTERNAL on both, as grpc-go answers it), and no traceback in
the server's log. The REST cases use a restricted route (``POST /v2/repository/index``),
which the other front forwards, so the header that opens it must come through.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import grpc
import hpack
import pytest

from tests.support.server import ServerProcess, socket_to_front

KEY = "S3cret=="
#: What the server's log must never say, whatever it was sent.
FAILURES = ("Traceback", "unexpected error", "Task exception was never retrieved")

OK = grpc.StatusCode.OK.value[0]
DENIED = grpc.StatusCode.PERMISSION_DENIED.value[0]
INTERNAL = grpc.StatusCode.INTERNAL.value[0]
#: HTTP/2's PROTOCOL_ERROR (RFC 9113, 7).
PROTOCOL_ERROR = 1


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """Two fronts; the repository API behind a header on REST and a key on gRPC."""
    args = ["--http-workers", "2", "--model-control-mode", "explicit", "--load-model", "simple"]
    args += ["--http-restricted-api", f"model-repository:x-admin-key={KEY}"]
    args += ["--grpc-restricted-protocol", f"model-repository:admin-key={KEY}"]
    proc = ServerProcess(args=args).wait_ready()
    assert len(proc.http_front_pids()) == 1, proc.log
    yield proc
    assert proc.stop() == 0, proc.log


def fronts(server: ServerProcess) -> list[int]:
    (other,) = server.http_front_pids()
    return [server.process.pid, other]


@pytest.fixture
def quiet(server: ServerProcess) -> Iterator[None]:
    """The server logs no failure of its own during the test (its lines from then on)."""
    start = len(server.lines)
    yield
    logged = "".join(server.lines[start:])
    assert not any(failure in logged for failure in FAILURES), logged[-6000:]


# ---- REST ----------------------------------------------------------------------------

ADMIN = f"X-Admin-Key: {KEY}"
#: (case, header lines between Host and the body's Content-Length, the status expected;
#: None: only that both fronts agree).
HTTP_CASES: list[tuple[str, list[str], int | None]] = [
    ("the key", [ADMIN], 200),
    ("no key", [], 403),
    ("the key's name in capitals", [f"X-ADMIN-KEY: {KEY}"], 200),
    ("Connection names the key", ["Connection: x-admin-key", ADMIN], 200),
    ("Connection names it in capitals", ["Connection: keep-alive, X-ADMIN-KEY", ADMIN], 200),
    ("Connection names Host and Content-Length", ["Connection: host, content-length", ADMIN], 200),
    ("Connection names a header not sent", ["Connection: x-absent", ADMIN], 200),
    ("two Host headers", ["Host: elsewhere.test", ADMIN], 400),
    ("two Host headers, the same in capitals", ["HOST: fronts.test", ADMIN], 400),
    ("a space at the end of the value", [ADMIN + " "], 200),
    ("a tab at the end of the value", [ADMIN + "\t"], 200),
    ("spaces and tabs on both sides", [f"X-Admin-Key: \t {KEY} \t"], 200),
    ("a tab inside another value", [ADMIN, "X-Other: a\tb"], 200),
    ("an 8-bit byte in another value", [ADMIN, "X-Other: caf\xe9"], 200),
    ("a space before the colon", [f"X-Admin-Key : {KEY}"], 400),
    ("a tab before the colon", [f"X-Admin-Key\t: {KEY}"], 400),
    ("a control byte in a value", [ADMIN, "X-Other: a\x01b"], 400),
    ("DEL in a value", [ADMIN, "X-Other: a\x7fb"], 400),
    ("obs-fold", [ADMIN, "X-Other: a", " folded"], 400),
    ("Content-Length twice, equal", [ADMIN, "Content-Length: 2"], 400),
    ("Content-Length twice, different", [ADMIN, "Content-Length: 3"], 400),
    # (the body "{}" read as chunked is not a chunk: the parser's 400; served when
    #   well-formed: test_request_edges.py)
    ("Transfer-Encoding beside Content-Length", [ADMIN, "Transfer-Encoding: chunked"], 400),
    ("the key twice", [ADMIN, ADMIN], 403),
    ("hop-by-hop headers", [ADMIN, "Keep-Alive: timeout=5", "TE: trailers"], 200),
    ("Expect: 100-continue", [ADMIN, "Expect: 100-continue"], 200),
    ("an upgrade to h2c, with a body", [ADMIN, "Upgrade: h2c", "Connection: Upgrade"], None),
]


def rest_status(server: ServerProcess, pid: int, lines: list[str]) -> int:
    """The final status of ``POST /v2/repository/index`` with ``lines`` in its head, on a
    connection the front ``pid`` holds."""
    head = ["POST /v2/repository/index HTTP/1.1", "Host: fronts.test", *lines]
    head += ["Content-Type: application/json", "Content-Length: 2"]
    request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + b"{}"
    with socket_to_front(server, pid) as sock:
        sock.sendall(request)
        return final_status(sock)


def final_status(sock: socket.socket) -> int:
    """The status of the first final (not 1xx) answer on ``sock``."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed without an answer after {data!r}")
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status >= 200:
            return status


@pytest.mark.parametrize(
    ("lines", "expected"), [c[1:] for c in HTTP_CASES], ids=[c[0] for c in HTTP_CASES]
)
def test_rest_heads_answered_alike(
    server: ServerProcess, quiet: None, lines: list[str], expected: int | None
) -> None:
    statuses = [rest_status(server, pid, lines) for pid in fronts(server)]
    assert statuses[0] == statuses[1], f"primary {statuses[0]}, other front {statuses[1]}"
    if expected is not None:
        assert statuses[0] == expected, statuses
    assert statuses[0] != 500


# ---- gRPC ----------------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SERVICE = "/inference.GRPCInferenceService/"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 3, 4, 6, 7
END_STREAM, ACK, END_HEADERS = 1, 1, 4
ADMIN_KEY = ("triton-grpc-protocol-admin-key", KEY)


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def grpc_code(
    server: ServerProcess, pid: int, method: str, metadata: list[tuple[str, str]]
) -> object:
    """The grpc-status of a unary call (an empty request message) with ``metadata`` exactly
    as given (no gRPC client sends upper-case keys or control bytes: HPACK by hand), on a
    connection the front ``pid`` holds; or what ended the call instead (a reset, GOAWAY)."""
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", SERVICE + method),
        (":authority", "fronts.test"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *metadata,
    ]
    block = hpack.Encoder().encode(headers)
    with socket_to_front(server, pid, port=server.grpc_port) as sock:
        sock.sendall(
            PREFACE
            + frame(SETTINGS, 0, 0, b"")
            + frame(HEADERS, END_HEADERS, 1, block)
            + frame(DATA, END_STREAM, 1, b"\0\0\0\0\0")
        )
        return _status(sock)


def _status(sock: socket.socket) -> object:
    decoder = hpack.Decoder()
    data = b""
    while True:
        while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
            length, kind, flags = int.from_bytes(data[:3], "big"), data[3], data[4]
            stream = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
            payload, data = data[9 : 9 + length], data[9 + length :]
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(frame(SETTINGS, ACK, 0, b""))
            elif kind == HEADERS:
                fields = dict(decoder.decode(payload))
                if stream == 1 and "grpc-status" in fields:
                    return int(fields["grpc-status"])
            elif kind == RST_STREAM and stream == 1:
                return f"RST_STREAM {int.from_bytes(payload, 'big')}"
            elif kind == GOAWAY:
                return f"GOAWAY {payload[4:8].hex()} {payload[8:]!r}"
        chunk = sock.recv(65536)
        if not chunk:
            return "closed"
        data += chunk


#: A malformed HTTP/2 request (RFC 9113, 8.1.1: an upper-case or otherwise bad field name,
#: NUL in a value, a connection-specific field): a stream error on every front, no call.
MALFORMED = f"RST_STREAM {PROTOCOL_ERROR}"

#: (case, method, metadata, the code expected). RepositoryIndex is restricted and
#: ServerReady is not; the other front forwards both to the primary.
GRPC_CASES: list[tuple[str, str, list[tuple[str, str]], object]] = [
    ("the key", "RepositoryIndex", [ADMIN_KEY], OK),
    ("no key", "RepositoryIndex", [], DENIED),
    ("an upper-case key", "RepositoryIndex", [ADMIN_KEY, ("X-Upper", "a")], MALFORMED),
    (
        "the restriction's key in capitals",
        "RepositoryIndex",
        [(ADMIN_KEY[0].upper(), KEY)],
        MALFORMED,
    ),
    ("a control byte", "RepositoryIndex", [ADMIN_KEY, ("x-odd", "a\x01b")], OK),
    ("NUL", "ServerReady", [("x-odd", "a\x00b")], MALFORMED),
    ("DEL", "RepositoryIndex", [ADMIN_KEY, ("x-odd", "a\x7f")], OK),
    ("a tab", "RepositoryIndex", [ADMIN_KEY, ("x-odd", "a\tb")], OK),
    ("non-ASCII", "RepositoryIndex", [ADMIN_KEY, ("x-odd", "café")], OK),
    (
        "a control byte in the key's value",
        "RepositoryIndex",
        [(ADMIN_KEY[0], KEY + "\x01")],
        DENIED,
    ),
    ("a space at the end of a key", "RepositoryIndex", [(ADMIN_KEY[0] + " ", KEY)], MALFORMED),
    ("a colon in a key", "ServerReady", [("x:odd", "a")], MALFORMED),
    ("an empty key", "ServerReady", [("", "a")], MALFORMED),
    ("binary metadata", "RepositoryIndex", [ADMIN_KEY, ("x-data-bin", "AAEC")], OK),
    ("a grpc- key", "ServerReady", [("grpc-odd", "a")], OK),
    (
        "connection-specific fields",
        "ServerReady",
        [("connection", "close"), ("host", "h")],
        MALFORMED,
    ),
    ("grpc-timeout 99999999H", "RepositoryIndex", [ADMIN_KEY, ("grpc-timeout", "99999999H")], OK),
    ("grpc-timeout 99999999M", "ServerReady", [("grpc-timeout", "99999999M")], OK),
    ("grpc-timeout 99999999S", "ServerReady", [("grpc-timeout", "99999999S")], OK),
    ("grpc-timeout 30S", "ServerReady", [("grpc-timeout", "30S")], OK),
]


@pytest.mark.parametrize(
    ("method", "metadata", "expected"),
    [c[1:] for c in GRPC_CASES],
    ids=[c[0] for c in GRPC_CASES],
)
def test_grpc_metadata_answered_alike(
    server: ServerProcess,
    quiet: None,
    method: str,
    metadata: list[tuple[str, str]],
    expected: object,
) -> None:
    codes = [grpc_code(server, pid, method, metadata) for pid in fronts(server)]
    assert codes[0] == codes[1], f"primary {codes[0]}, other front {codes[1]}"
    assert codes[0] == expected, codes


@pytest.mark.parametrize("value", ["1x", "123456789S", "1", "-1S", "1.5S"])
def test_a_malformed_grpc_timeout_is_refused_alike(
    server: ServerProcess, quiet: None, value: str
) -> None:
    """Not a timeout: INTERNAL on both fronts, as grpc-go answers it, and nothing logged
    as a failure of the server's."""
    metadata = [("grpc-timeout", value)]
    codes = [grpc_code(server, pid, "ServerReady", metadata) for pid in fronts(server)]
    assert codes == [INTERNAL, INTERNAL], codes
