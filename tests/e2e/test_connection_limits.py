"""What one HTTP connection may take of the server (issue #35, rows 5, 6 and 7).

- Row 6: a request head past ``--max-header-fields`` or ``--max-header-bytes`` is
  answered 431 and closed (40 MB of ``a:b`` lines held ~900 MB of the front until the
  head timeout); the metrics port has the same limits and the head timeout.
- Row 5: a body that trickles in (a declared 64 MiB, then a byte at a time) is dropped
  after ``--body-timeout`` plus a second per ``--min-transfer-rate`` bytes, and the
  shared memory reserved for it is used again; a slow body above the rate is not.
- Row 7: a response its client never reads is dropped after ``--send-timeout`` (plus a
  second per ``--min-transfer-rate`` bytes read), and the worker's segment it held is
  used again.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.raw_http import read_response
from tests.support.server import ServerProcess, shm_entries, wait_for

MiB = 1024 * 1024
#: The flags' defaults (docs/limits.md).
MAX_HEADER_FIELDS = 256
MAX_HEADER_BYTES = 64 * 1024
#: Short timeouts, so the test waits about a second each time (what is tested is that they
#: hold, not their size; the assertions leave 10 s or more of margin).
BODY_TIMEOUT = 1.0
SEND_TIMEOUT = 1.0
HEADER_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--body-timeout", str(BODY_TIMEOUT), "--send-timeout", str(SEND_TIMEOUT)]
    args += ["--header-timeout", str(HEADER_TIMEOUT), "--devices", "cpu"]
    proc = ServerProcess(args=args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def _port(server: ServerProcess, which: str) -> int:
    return server.port if which == "http" else int(server.metrics_url.rsplit(":", 1)[1])


def _closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Reads (and drops) until the server closes the connection, or ``timeout``."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass  # reset: closed too
    return True


def _send_head(port: int, head: bytes) -> tuple[int, bytes]:
    """Send ``head`` (what is refused before its end may not all be taken); the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(head)
        except OSError:
            pass  # the server answered and closed while we were still sending
        status, fields, body = read_response(sock)
        assert fields.get("connection") == "close"
        assert _closed_by_server(sock, 10)
        return status, body


@pytest.mark.parametrize("which", ["http", "metrics"])
def test_too_many_header_fields_is_431(server: ServerProcess, which: str) -> None:
    fields = "".join(f"x-{i}: v\r\n" for i in range(MAX_HEADER_FIELDS + 1))
    head = f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode()
    status, body = _send_head(_port(server, which), head)
    assert status == 431 and b"header fields" in body, body


@pytest.mark.parametrize("which", ["http", "metrics"])
def test_a_head_past_its_byte_limit_is_431(server: ServerProcess, which: str) -> None:
    one_long_field = b"x-long: " + b"a" * MAX_HEADER_BYTES + b"\r\n"
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + one_long_field + b"\r\n"
    status, body = _send_head(_port(server, which), head)
    assert status == 431 and b"request head is larger" in body, body


def test_a_flood_of_header_lines_costs_the_front_nothing(server: ServerProcess) -> None:
    """The attack of the issue: 40 MB of ``a:b`` lines. Refused at the limit, the rest
    never parsed: the front's peak RSS barely moves (it grew ~900 MB before)."""
    pid = server.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := the RSS now
    before = _status_bytes(pid, "VmHWM")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n")
        sent = 0
        try:
            while sent < 40 * MiB:
                sock.sendall(b"a:b\r\n" * 13107)
                sent += 65535
        except OSError:
            pass  # refused and closed
        assert read_response(sock)[0] == 431
    growth = _status_bytes(pid, "VmHWM") - before
    assert growth < 32 * MiB, f"the front's peak RSS grew {growth / MiB:.0f} MiB"


def test_a_large_head_within_the_limits_is_served(server: ServerProcess) -> None:
    fields = "".join(f"x-{i}: {'v' * 200}\r\n" for i in range(MAX_HEADER_FIELDS - 8))
    head = f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode()
    assert len(head) < MAX_HEADER_BYTES
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head)
        assert read_response(sock)[0] == 200


def test_the_metrics_port_closes_a_head_that_never_ends(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", _port(server, "metrics")), timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nx-slow: ")
        start = time.monotonic()
        assert _closed_by_server(sock, HEADER_TIMEOUT + 10), "the metrics port kept a slow head"
        assert time.monotonic() - start < HEADER_TIMEOUT + 5


# ---- row 5: bodies that trickle ------------------------------------------------------


def _binary_request(model: str, array: np.ndarray, binary_output: bool = True) -> bytes:
    """A binary-extension inference request (head and body) for ``model``'s INPUT0."""
    tensor = httpclient.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=True)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [tensor], outputs=[output]
    )
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {json_size}\r\n\r\n"
    )
    return head.encode() + body


def _shm_bytes(pid: int) -> int:
    total = 0
    for name in shm_entries(pid):
        try:
            total += os.stat(f"/dev/shm/{name}").st_size
        except OSError:
            continue
    return total


def _trickle(port: int, request: bytes, dropped: list[float]) -> None:
    """Sends the head and 1 KiB of the body, then a byte every 0.2 s until dropped."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head_end = request.index(b"\r\n\r\n") + 4 + 1024
        sock.sendall(request[:head_end])
        start = time.monotonic()
        for offset in range(head_end, len(request)):
            try:
                sock.sendall(request[offset : offset + 1])
            except OSError:
                break
            if time.monotonic() - start > BODY_TIMEOUT + 20:
                return  # never dropped: the test fails on ``dropped``
            if _closed_by_server(sock, 0.2):
                break
        dropped.append(time.monotonic() - start)


def test_a_trickling_body_is_dropped_and_its_memory_used_again(server: ServerProcess) -> None:
    pid = server.process.pid
    request = _binary_request("identity_fp32", np.zeros((1, 16 * MiB), np.float32))
    rounds = []
    for _ in range(2):
        dropped: list[float] = []
        threads = [
            threading.Thread(target=_trickle, args=(server.port, request, dropped))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(dropped) == 2, "a trickling body was never dropped"
        assert max(dropped) < BODY_TIMEOUT + 10, dropped
        rounds.append(_shm_bytes(pid))
    # The second pair of 64 MiB bodies reused the segments the first pair gave back.
    assert rounds[1] <= rounds[0] + MiB, [r / MiB for r in rounds]
    assert "its request body was not complete" in server.log


def test_a_slow_body_above_the_rate_arrives_whole(server: ServerProcess) -> None:
    array = np.arange(1 << 20, dtype=np.float32).reshape(1, -1)  # 4 MiB of body
    request = _binary_request("identity_fp32", array)
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        start = time.monotonic()
        # Slower than the body timeout alone allows, faster than the minimum rate.
        # 512 KiB a step, 2.5 MiB/s: each step buys 8 s at the minimum rate (64 KiB/s).
        for offset in range(0, len(request), 512 * 1024):
            sock.sendall(request[offset : offset + 512 * 1024])
            time.sleep(0.2)  # pacing the client's own upload, not waiting on the server
        status, _, _ = read_response(sock)
    assert status == 200
    assert time.monotonic() - start > BODY_TIMEOUT


# ---- row 7: responses nobody reads ---------------------------------------------------


def _unread(port: int, request: bytes) -> float:
    """Sends ``request`` from a socket with a tiny receive buffer and reads nothing; the
    seconds until the server drops the connection."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        start = time.monotonic()
        # NOTE: reading only to learn of the close would drain the response: poll the
        #   connection's state instead.
        closed = wait_for(lambda: _peer_closed(sock), timeout=SEND_TIMEOUT + 30, interval=0.1)
        assert closed, "an unread response was never dropped"
        return time.monotonic() - start


def _peer_closed(sock: socket.socket) -> bool:
    """The server closed or reset its end (TCP_INFO's state is no longer ESTABLISHED)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return info[0] != 1  # TCP_ESTABLISHED


def test_a_response_nobody_reads_is_dropped_and_its_memory_used_again(
    server: ServerProcess,
) -> None:
    pid = server.process.pid
    request = _binary_request("identity_fp32", np.ones((1, 8 * MiB), np.float32))
    sizes = []
    for _ in range(3):
        waited = _unread(server.port, request)
        assert waited < SEND_TIMEOUT + 15
        sizes.append(_shm_bytes(pid))
    # Each dropped response gave its 32 MiB output segment back to the worker's pool.
    assert sizes[2] <= sizes[0] + MiB, [s / MiB for s in sizes]
    assert "of its response unread" in server.log


def test_an_unread_response_outlasting_the_keep_alive_timeout_is_dropped() -> None:
    """A send timeout longer than the keep-alive timeout (uvicorn's 5 s): the response
    unread when the connection would be idle is still dropped at the send timeout. The
    keep-alive close waited for it to drain, and no timer looked again: the connection
    and its 32 MiB answer were held for good (found by fuzzing)."""
    send_timeout = 6.0
    proc = ServerProcess(args=["--send-timeout", str(send_timeout), "--devices", "cpu"])
    proc.wait_ready()
    try:
        request = _binary_request("identity_fp32", np.ones((1, 8 * MiB), np.float32))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", proc.port))
            sock.sendall(request)
            start = time.monotonic()
            closed = wait_for(lambda: _peer_closed(sock), timeout=60, interval=0.1)
            assert closed, "an unread response was never dropped"
            assert time.monotonic() - start >= send_timeout - 1
        assert wait_for(lambda: "of its response unread" in proc.log, 10), proc.log
    finally:
        assert proc.stop() == 0, proc.log


def _status_bytes(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(name)
