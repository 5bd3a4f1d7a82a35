"""Connections cost bounded time: a request head that does not arrive in time is cut.

Real sockets against a real server subprocess (issue #18).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.raw_http import closed_by_server, read_response
from tests.support.server import ServerProcess, wait_for

HEADER_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(args=["--header-timeout", str(HEADER_TIMEOUT)]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def test_slow_request_heads_are_closed_after_the_header_timeout(server: ServerProcess) -> None:
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
    dribbling = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
    for sock in dribbling:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    start = time.monotonic()
    for _ in range(3):  # keep dribbling header lines, never ending the head
        time.sleep(HEADER_TIMEOUT / 3)  # the slow client's own pace
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
            time.sleep(HEADER_TIMEOUT * 0.6)  # the client idles: the subject of this test
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # then nothing more
        assert closed_by_server(sock, 3 * HEADER_TIMEOUT)


# ---- shutdown ----------------------------------------------------------------------------------

_INFER_BODY = (
    b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":'
    b"[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},"
    b'{"name":"INPUT1","shape":[1,16],"datatype":"INT32","data":'
    b"[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}"
)
_INFER = (
    b"POST /v2/models/simple/infer HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(_INFER_BODY) + _INFER_BODY
)


def test_sigterm_answers_connections_already_accepted_by_the_kernel() -> None:
    """Closed-loop clients, a new connection per request, SIGTERM in the middle.

    A connection is either refused (the server no longer listens) or answered 200; none is
    reset after its request was sent. Before, closing the listening socket reset every
    connection still in the kernel's backlog (11 of 16 clients here).
    """
    proc = ServerProcess().wait_ready()
    host, port = proc.host_port.rsplit(":", 1)
    outcomes: dict[str, int] = {"answered": 0, "refused": 0, "reset": 0, "other": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                sock = socket.create_connection((host, int(port)), timeout=10)
            except ConnectionRefusedError:
                outcome = "refused"
                time.sleep(0.01)  # the client's own pace between refused connects
            else:
                try:
                    sock.sendall(_INFER)
                    head = read_response(sock)[0]
                    outcome = "answered" if head == 200 else "other"
                except ConnectionResetError:
                    outcome = "reset"
                except Exception:  # noqa: BLE001 - any other failure is counted, not raised
                    outcome = "other"
                finally:
                    sock.close()
            with lock:
                outcomes[outcome] += 1

    threads = [threading.Thread(target=client) for _ in range(16)]
    for thread in threads:
        thread.start()
    # SIGTERM in the middle of the run: once the clients are being answered.
    assert wait_for(lambda: outcomes["answered"] > 100, 30), outcomes
    proc.process.send_signal(signal.SIGTERM)
    assert proc.process.wait(30) == 0, proc.log
    stop.set()
    for thread in threads:
        thread.join(15)
    assert outcomes["answered"] > 100, outcomes
    assert outcomes["refused"] > 0, outcomes  # the run did reach past the shutdown
    assert outcomes["reset"] == 0 and outcomes["other"] == 0, (outcomes, proc.log[-3000:])


def test_idle_keep_alive_connections_do_not_hold_shutdown() -> None:
    proc = ServerProcess().wait_ready()
    host, port = proc.host_port.rsplit(":", 1)
    idle = []
    for _ in range(2):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: t\r\n\r\n")
        assert read_response(sock)[0] == 200
        idle.append(sock)
    started = time.monotonic()
    assert proc.stop() == 0, proc.log
    assert time.monotonic() - started < 5, "idle keep-alive connections held the shutdown"
    for sock in idle:
        assert closed_by_server(sock, within=1)
        sock.close()
