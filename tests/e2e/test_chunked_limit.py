"""A chunked body is refused at the chunk-size line that declares it past the limit (issue #18).

Raw sockets against a real server: before, a declared ``FFFFFFFFFFFFFFFF`` was refused only
once ``--max-request-bytes`` of data had actually arrived.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from functools import partial

import pytest

from tests.support.raw_http import closed_by_server, read_response, read_responses
from tests.support.server import ServerProcess, shm_entries, wait_for
from tests.support.sockets import read_by_peer

LIMIT = 4096
TOO_LARGE = {"error": f"the request body is larger than the limit of {LIMIT} bytes"}
HEAD = (
    b"POST /v2/models/simple/infer HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
BODY = (
    b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":'
    b"[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},"
    b'{"name":"INPUT1","shape":[1,16],"datatype":"INT32","data":'
    b"[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}"
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--max-request-bytes", str(LIMIT), "--log-level", "debug"]
    proc = ServerProcess(args=args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def chunked(body: bytes, pieces: int) -> bytes:
    """``body`` as ``pieces`` chunks (with an extension on the first), the last chunk, a trailer."""
    step = -(-len(body) // pieces)
    parts = [body[i : i + step] for i in range(0, len(body), step)]
    out = b"%x;piece=first\r\n%s\r\n" % (len(parts[0]), parts[0])
    out += b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts[1:])
    return out + b"0\r\nx-check: 1\r\n\r\n"


def nothing_to_read(sock: socket.socket, within: float) -> bool:
    return not select.select([sock], [], [], within)[0]


def assert_refused(sock: socket.socket, limit: int = LIMIT) -> None:
    status, fields, body = read_response(sock)
    assert status == 413, body
    assert json.loads(body) == {
        "error": f"the request body is larger than the limit of {limit} bytes"
    }
    assert fields["content-type"] == "application/json"
    assert fields["connection"] == "close"
    assert closed_by_server(sock, within=1.0)


def assert_infers(sock: socket.socket) -> None:
    status, _, body = read_response(sock)
    assert_inferred(status, body)


def assert_inferred(status: int, body: bytes) -> None:
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert outputs["OUTPUT0"] == list(range(2, 18))
    assert outputs["OUTPUT1"] == list(range(0, 16))


def test_a_huge_declared_chunk_is_refused_at_once_with_the_default_limit() -> None:
    proc = ServerProcess().wait_ready()
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as sock:
            start = time.monotonic()
            sock.sendall(HEAD + b"FFFFFFFFFFFFFFFF\r\n")
            assert_refused(sock, limit=256 * 1024 * 1024)
            assert time.monotonic() - start < 0.5
    finally:
        assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def test_a_chunk_just_over_the_limit_is_refused_before_its_data(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(HEAD)
        # The head alone first: the size line comes in a read of its own.
        assert wait_for(lambda: read_by_peer(sock), 10)
        sock.sendall(b"%x\r\n" % (LIMIT + 1))
        assert_refused(sock)


def test_a_size_line_split_over_reads_is_read_whole(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(HEAD + b"1")
        sent = b""
        for digit in b"0000\r\n":
            assert wait_for(lambda: read_by_peer(sock), 10)  # one digit a read
            try:
                sock.sendall(bytes([digit]))
            except OSError:  # refused already: 0x10... passes the limit whatever follows
                break
            sent += bytes([digit])
        assert sent.startswith(b"0000"), sent
        assert_refused(sock)  # 0x10000, although no read held more than one digit of it


def test_the_chunk_whose_size_takes_the_sum_past_the_limit_is_refused(
    server: ServerProcess,
) -> None:
    chunk = b"%x\r\n%s\r\n" % (1000, b" " * 1000)  # whitespace: still valid JSON if it came
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(HEAD + b"1\r\n{\r\n")
        for _ in range(4):  # 4001 bytes declared: under the limit
            sock.sendall(chunk)
            assert nothing_to_read(sock, 0.1), "refused before the sum passed the limit"
        sock.sendall(b"%x\r\n" % 100)  # 4101 > 4096, before its data
        assert_refused(sock)


def test_a_handler_waiting_for_the_body_ends_cleanly(server: ServerProcess) -> None:
    """The body's first chunk reached the handler, which waits for more; then the refusal.

    The handler raises the same 413 (logged at debug level, its answer dropped): it does
    not go on with the part of the body that came, nor fail with a 500.
    """
    handled = "oipserve.rest: POST /v2/models/simple/infer -> 413: " + TOO_LARGE["error"]
    before = server.log.count(handled)
    bad_requests = server.log.count("-> 400")
    segments = shm_entries(server.process.pid)
    binary = HEAD.replace(b"\r\n\r\n", b"\r\ninference-header-content-length: 10\r\n\r\n")
    for head in (HEAD, binary):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head + b"a\r\n" + BODY[:10] + b"\r\n")
            assert wait_for(partial(read_by_peer, sock), 10)  # the first chunk was read
            sock.sendall(b"FFFFFFFF\r\n")
            assert_refused(sock)
    assert wait_for(lambda: server.log.count(handled) >= before + 2, 5), server.log[-3000:]
    assert server.log.count("-> 400") == bad_requests, server.log[-3000:]
    assert shm_entries(server.process.pid) == segments  # no lease was taken for the body
    assert "Traceback" not in server.log, server.log
    assert " 500" not in server.log and "Exception in ASGI" not in server.log, server.log


def test_chunked_inference_still_works_on_a_keep_alive_connection(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(HEAD + chunked(BODY, 4))
        assert_infers(sock)
        # the next request on the connection is a request, not followed as chunk framing
        sock.sendall(HEAD + chunked(BODY, 1))
        assert_infers(sock)
        # both requests in one write, the second one's size lines split from its head
        both = HEAD + chunked(BODY, 3) + HEAD + chunked(BODY, 5)
        sock.sendall(both[: len(both) - 150])
        assert wait_for(lambda: read_by_peer(sock), 10)  # the rest in a read of its own
        sock.sendall(both[len(both) - 150 :])
        # (read together: the two answers may come in one read, which read_response drops)
        for status, _, body in read_responses(sock, 2):
            assert_inferred(status, body)
        length = b"content-length: %d\r\n\r\n" % len(BODY)
        sock.sendall(HEAD.replace(b"transfer-encoding: chunked\r\n\r\n", length) + BODY)
        assert_infers(sock)
        # and a later chunked request on the connection is followed afresh
        sock.sendall(HEAD + b"%x\r\n" % (LIMIT + 1))
        assert_refused(sock)


def test_a_body_under_the_limit_sent_byte_by_byte_is_served(server: ServerProcess) -> None:
    data = HEAD + chunked(BODY, 6)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(data[: len(HEAD) - 20])
        for i in range(len(HEAD) - 20, len(data), 7):
            sock.sendall(data[i : i + 7])
            time.sleep(0.002)  # the slow client's own pace
        assert_infers(sock)
        sock.sendall(HEAD + b"%x\r\n%s\r\n%x\r\n" % (2000, b" " * 2000, 2097))
        assert_refused(sock)  # 2000 + 2097 > 4096, counted from this request's first chunk


def test_the_server_serves_on_after_refusals_with_the_same_workers(server: ServerProcess) -> None:
    workers = server.worker_pids()
    assert workers
    for size in (b"FFFFFFFFFFFFFFFF", b"%x" % (LIMIT + 1)):
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(HEAD + size + b"\r\n")
                assert_refused(sock)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(HEAD + chunked(BODY, 2))
        assert_infers(sock)
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nhost: t\r\n\r\n")
        assert read_response(sock)[0] == 200
    assert server.worker_pids() == workers
    assert "Traceback" not in server.log, server.log


@pytest.mark.parametrize(
    ("extra", "words"),
    [(b"", "malformed JSON"), (b"inference-header-content-length: 0\r\n", "exactly one input")],
)
def test_an_empty_chunked_body_is_a_400(server: ServerProcess, extra: bytes, words: str) -> None:
    """A body of no chunks at all (only the last chunk): nothing to join, a clear 400."""
    head = HEAD.replace(b"transfer-encoding", extra + b"transfer-encoding")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + b"0\r\n\r\n")
        status, _, body = read_response(sock)
    assert status == 400, body
    assert words in json.loads(body)["error"]
    assert "Traceback" not in server.log


@pytest.mark.parametrize("declared", [3, len(BODY), LIMIT * 10], ids=["short", "equal", "huge"])
def test_content_length_beside_chunked_is_ignored_and_the_connection_closed(
    server: ServerProcess, declared: int
) -> None:
    """RFC 9112 6.1: the body is read by its Transfer-Encoding alone, whatever the
    Content-Length says (a short one, the body's, one past the limit: not a 413), and the
    connection is closed after the answer, so that a request smuggled past a proxy that
    read the Content-Length never runs (Triton's test_content_encoding_chunked_manually
    sends both; before 2026-11-28 this was a 400)."""
    head = HEAD.replace(b"\r\n\r\n", b"\r\ncontent-length: %d\r\n\r\n" % declared)
    smuggled = b"GET /v2/health/live HTTP/1.1\r\nhost: t\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + chunked(BODY, 3) + smuggled)
        status, fields, body = read_response(sock)
        assert status == 200, body
        assert fields["connection"] == "close"
        assert closed_by_server(sock, within=5.0)  # the GET after it was never answered
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + chunked(BODY, 1))
        assert_infers(sock)
