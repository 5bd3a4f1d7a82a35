"""The gRPC port's connection limits on the real server (issue 37, row 5).

3,200 silent gRPC connections under a limit of 3,000 descriptors left none to accept
REST connections: ``--grpc-max-connections`` refuses connections past it (GOAWAY
``ENHANCE_YOUR_CALM``, closed) and keeps the open ones, and REST and a new gRPC call
after they close still work. ``--grpc-max-connection-idle`` closes a connection that
makes no call (GOAWAY ``NO_ERROR``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from oipserve.front.grpc.h2.frames import (
    ErrorCode,
)
from tests.support.grpc_peer import FakeTransport
from tests.support.h2_raw import frames_until_closed, goaway_codes, open_h2c
from tests.support.http import get
from tests.support.server import ServerProcess

MAX_CONNECTIONS = 4
IDLE_MS = 1500


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--grpc-max-connections", str(MAX_CONNECTIONS), "--devices", "cpu"]
    args += ["--grpc-max-connection-idle", str(IDLE_MS)]
    proc = ServerProcess(args=args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def test_connections_past_the_cap_are_refused_and_rest_still_served(
    server: ServerProcess,
) -> None:
    held = [open_h2c(server.grpc_port, stream_open=True) for _ in range(MAX_CONNECTIONS)]
    try:
        for _ in range(3):
            with open_h2c(server.grpc_port, stream_open=False) as extra:
                assert frames_until_closed(extra, 10) == []  # before the server's preface
        # A gRPC client's call fails at once (no retrying until its deadline).
        started = time.monotonic()
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
                client.get_server_metadata(client_timeout=20)
        assert time.monotonic() - started < 10
        assert get(server, "/v2/health/live")[0] == 200  # REST still accepted
        for sock in held:  # the open ones were kept
            sock.settimeout(0.2)
            with pytest.raises(TimeoutError):
                while sock.recv(65536):  # the server's SETTINGS; then nothing, no EOF
                    pass
    finally:
        for sock in held:
            sock.close()
    assert "--grpc-max-connections" in server.log
    # Once they close, a new client is served (the front saw them go after a moment).
    deadline = time.monotonic() + 10
    while True:
        try:
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                assert client.is_server_live()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_connection_without_calls_is_closed_after_the_idle_time(
    server: ServerProcess,
) -> None:
    started = time.monotonic()
    with open_h2c(server.grpc_port, stream_open=False) as idle:
        frames = frames_until_closed(idle, 15)
    assert time.monotonic() - started >= IDLE_MS / 1000 * 0.9
    assert set(goaway_codes(frames)) == {ErrorCode.NO_ERROR}


def test_with_http_workers_each_front_holds_its_own_cap() -> None:
    """``--http-workers 2``: the kernel spreads connections over the fronts, each front
    caps its own, so at most twice the cap stay open, and the rest are refused."""
    proc = ServerProcess(args=["--http-workers", "2", "--grpc-max-connections", "2"])
    proc.wait_ready()
    socks = [open_h2c(proc.grpc_port, stream_open=True) for _ in range(8)]
    try:
        refused = 0
        # NOTE: one window for all eight (a refused connection is closed at its accept):
        #   a second each, one after another, waited out 4 s on the connections kept.
        window = time.monotonic() + 2.0
        for sock in socks:
            sock.settimeout(max(0.1, window - time.monotonic()))
            got = FakeTransport()
            try:
                while chunk := sock.recv(65536):
                    got.written += chunk
                refused += 1  # closed by the server
            except (TimeoutError, ConnectionResetError) as exc:
                refused += isinstance(exc, ConnectionResetError)
        assert refused >= 8 - 2 * 2
        for sock in socks:
            sock.close()
        # ServerMetadata: answered by the primary, forwarded from the other front over
        # the private socket (not counted against the cap).
        deadline = time.monotonic() + 10
        while True:
            try:
                with grpcclient.InferenceServerClient(proc.grpc_url) as client:
                    assert client.get_server_metadata(client_timeout=5).name
                break
            except InferenceServerException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        for sock in socks:
            sock.close()
        assert proc.stop() == 0, proc.log
