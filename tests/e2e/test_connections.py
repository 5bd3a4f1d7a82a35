"""Connections cost bounded time: a request head that does not arrive in time is cut.

Real sockets against a real server subprocess (issue #18).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.e2e.test_decompression import read_response
from tests.server import ServerProcess

HEADER_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(args=["--header-timeout", str(HEADER_TIMEOUT)]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (EOF or reset)."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_request_heads_are_closed_after_the_header_timeout(server: ServerProcess) -> None:
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
    dribbling = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
    for sock in dribbling:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    start = time.monotonic()
    for _ in range(3):  # keep dribbling header lines, never ending the head
        time.sleep(HEADER_TIMEOUT / 3)
        for sock in dribbling:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                pass
    try:
        for sock in silent + dribbling:
            assert closed_by_server(sock, 3 * HEADER_TIMEOUT)
        assert time.monotonic() - start < 4 * HEADER_TIMEOUT
    finally:
        for sock in silent + dribbling:
            sock.close()


def test_keep_alive_connection_gets_a_fresh_head_timer(server: ServerProcess) -> None:
    """A connection used for longer than the timeout is fine; only a slow head is cut."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for _ in range(3):
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock)[0] == 200
            time.sleep(HEADER_TIMEOUT * 0.6)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # then nothing more
        assert closed_by_server(sock, 3 * HEADER_TIMEOUT)
