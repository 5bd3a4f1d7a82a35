"""REST and gRPC on one port (issue #39, item 3): the HTTP port also serves gRPC to clients
that open with HTTP/2's preface (h2c with prior knowledge), as Knative's single port needs.

Every limit, restriction and drain of the gRPC port holds there too: the calls go through
the gRPC port's own listener (``H2Server.adopt``), so they share its connection cap, its
idle and preface timers, its call table (``--grpc-restricted-protocol``,
``--grpc-max-message-bytes``) and its shutdown. HTTP/1.1 on the port is as before.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from oipserve.front.grpc.h2.frames import (
    END_STREAM,
    PREFACE,
    ErrorCode,
    Frame,
    frame,
    settings_frame,
)
from tests.support.grpc_peer import FakeTransport
from tests.support.h2_raw import (
    H2Client,
    frames_until_closed,
    goaway_codes,
    grpc_headers,
    open_h2c,
)
from tests.support.http import get
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, tcp_links, wait_for
from tests.support.tensors import simple_inputs

MAX_CONNECTIONS = 4
IDLE_MS = 1500
#: --header-timeout: the time for a request head, and for a gRPC client's preface.
HEADER_TIMEOUT = 3.0
MAX_MESSAGE = 64 * 1024
ADMIN = "s3cr3t"
REST_ADMIN = "r3st"
GRPC_KEY = "triton-grpc-protocol-admin-key"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--devices", "cpu", "--grpc-max-connections", str(MAX_CONNECTIONS)]
    args += ["--grpc-max-connection-idle", str(IDLE_MS), "--header-timeout", str(HEADER_TIMEOUT)]
    args += ["--grpc-max-message-bytes", str(MAX_MESSAGE)]
    args += ["--grpc-restricted-protocol", f"model-repository:admin-key={ADMIN}"]
    args += ["--http-restricted-api", f"model-repository:X-Admin-Key={REST_ADMIN}"]
    proc = ServerProcess(args=args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def _ints(seed: int) -> np.ndarray:
    return (np.arange(16, dtype=np.int32) + seed).reshape(1, 16)


def _grpc_infer(client: grpcclient.InferenceServerClient, seed: int) -> None:
    a = _ints(seed)
    result = client.infer("simple", simple_inputs(a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def _http_infer(client: httpclient.InferenceServerClient, seed: int) -> None:
    a = _ints(seed)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)


def _stream(client: grpcclient.InferenceServerClient, count: int) -> list[object]:
    answers: list[object] = []
    client.start_stream(callback=lambda result, error: answers.append(error or result))
    for seed in range(count):
        client.async_stream_infer("simple", simple_inputs(_ints(seed), _ints(seed)))
    client.stop_stream()
    return answers


def _status(call: Callable[[], object]) -> str:
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status())
    return "OK"


# ---- both protocols on the HTTP port ----------------------------------------------------


def test_tritonclient_grpc_and_http_share_the_http_port(server: ServerProcess) -> None:
    errors: list[BaseException] = []

    def rest_meanwhile() -> None:
        try:
            with httpclient.InferenceServerClient(server.host_port) as rest:
                for seed in range(40):
                    _http_infer(rest, seed)
                    assert rest.is_server_live()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    rest = threading.Thread(target=rest_meanwhile)
    rest.start()
    with grpcclient.InferenceServerClient(server.host_port) as client:
        assert client.is_server_live(client_timeout=10) and client.is_server_ready()
        assert client.get_server_metadata().name
        metadata = client.get_model_metadata("simple")
        assert metadata.name == "simple"
        assert [i.name for i in metadata.inputs] == ["INPUT0", "INPUT1"]
        assert client.get_model_config("simple").config.name == "simple"
        for seed in range(40):
            _grpc_infer(client, seed)
        answers = _stream(client, 5)
        assert len(answers) == 5, answers
        for seed, result in enumerate(answers):
            got = result.as_numpy("OUTPUT0")  # type: ignore[attr-defined]
            np.testing.assert_array_equal(got, _ints(seed) + _ints(seed))
    rest.join(60)
    assert not rest.is_alive() and not errors, errors
    # The same answers as the gRPC port's.
    with grpcclient.InferenceServerClient(server.grpc_url) as own:
        assert own.get_model_metadata("simple") == metadata


def test_a_preface_in_pieces_is_still_http2_and_post_still_http1(server: ServerProcess) -> None:
    """Only the first bytes decide: a preface split over reads is HTTP/2; a POST (whose
    first byte is the preface's) is HTTP/1.1 as ever."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in (PREFACE[:1], PREFACE[1:3], PREFACE[3:20], PREFACE[20:]):
            sock.sendall(piece)
            time.sleep(0.05)  # separate reads (what is tested is that they may be)
        sock.sendall(settings_frame({}))
        got = FakeTransport()
        got.written += sock.recv(65536)
        assert got.frames()[0][0] == Frame.SETTINGS  # the server's preface: HTTP/2
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        body = b'{"inputs": []}'
        sock.sendall(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (len(body), body)
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 "), answer


# ---- the gRPC port's rules hold on the HTTP port ----------------------------------------


def test_grpc_restrictions_hold_on_the_http_port(server: ServerProcess) -> None:
    """gRPC calls on the HTTP port are gRPC calls: --grpc-restricted-protocol decides;
    --http-restricted-api's header opens nothing there."""
    with grpcclient.InferenceServerClient(server.host_port) as client:
        index = client.get_model_repository_index
        assert _status(index) == "StatusCode.PERMISSION_DENIED"
        assert _status(lambda: index(headers={"x-admin-key": REST_ADMIN})) == (
            "StatusCode.PERMISSION_DENIED"
        )
        assert _status(lambda: index(headers={GRPC_KEY: ADMIN})) == "OK"
        _grpc_infer(client, 3)  # inference is not restricted
    # REST on the same port keeps its own rule.
    with httpclient.InferenceServerClient(server.host_port) as rest:
        with pytest.raises(InferenceServerException):
            rest.get_model_repository_index()
        assert rest.get_model_repository_index(headers={"X-Admin-Key": REST_ADMIN})


def test_grpc_max_message_bytes_holds_on_the_http_port(server: ServerProcess) -> None:
    data = np.zeros((1, MAX_MESSAGE), dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(server.host_port) as client:
        outcome = _status(lambda: client.infer("identity_fp32", [tensor]))
        assert outcome == "StatusCode.RESOURCE_EXHAUSTED"
        _grpc_infer(client, 1)


def test_the_connection_cap_counts_both_ports(server: ServerProcess) -> None:
    """One front's gRPC connections, on either port, count against one
    --grpc-max-connections; past it an h2c connection is closed before any frame, and
    HTTP/1.1 on the port is not counted."""
    half = MAX_CONNECTIONS // 2

    def links_closed() -> bool:  # earlier tests' connections, gone from the server's side
        ports = (server.port, server.grpc_port)
        return not [near for near, _ in tcp_links(server.process.pid) if near in ports]

    assert wait_for(links_closed, timeout=15)
    held = [open_h2c(server.grpc_port, stream_open=True) for _ in range(half)]
    held += [open_h2c(server.port, stream_open=True) for _ in range(MAX_CONNECTIONS - half)]
    try:
        for sock in held:  # each got the server's SETTINGS: adopted, not refused
            sock.settimeout(10)
            assert sock.recv(65536)
        for _ in range(3):
            with open_h2c(server.port) as extra:
                assert frames_until_closed(extra, 10) == []
        started = time.monotonic()
        with grpcclient.InferenceServerClient(server.host_port) as client:
            assert _status(lambda: client.get_server_metadata(client_timeout=20)) == (
                "StatusCode.UNAVAILABLE"
            )
        assert time.monotonic() - started < 10
        assert get(server, "/v2/health/live")[0] == 200  # HTTP/1.1 still accepted
    finally:
        for sock in held:
            sock.close()

    def served() -> bool:
        with grpcclient.InferenceServerClient(server.host_port) as client:
            return _status(lambda: client.is_server_live(client_timeout=5)) == "OK"

    assert wait_for(served, timeout=15)


def test_an_idle_h2c_connection_gets_goaway(server: ServerProcess) -> None:
    started = time.monotonic()
    with open_h2c(server.port) as idle:
        frames = frames_until_closed(idle, 15)
    assert time.monotonic() - started >= IDLE_MS / 1000 * 0.9
    assert set(goaway_codes(frames)) == {ErrorCode.NO_ERROR}


def test_the_preface_time_counts_from_the_connect(server: ServerProcess) -> None:
    """--header-timeout is the time from connect to the client's SETTINGS, on the HTTP
    port as on the gRPC port: a preface sent late leaves only what is left of it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        started = time.monotonic()
        time.sleep(HEADER_TIMEOUT - 0.5)
        sock.sendall(PREFACE)  # and no SETTINGS
        frames = frames_until_closed(sock, 15)
    elapsed = time.monotonic() - started
    assert HEADER_TIMEOUT * 0.9 <= elapsed < HEADER_TIMEOUT + 1.5, elapsed
    assert goaway_codes(frames) == [ErrorCode.PROTOCOL_ERROR]
    # Half a preface is a request head that never completes: closed as one.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(PREFACE[:10])
        assert frames_until_closed(sock, 15) == []
    assert time.monotonic() - started < HEADER_TIMEOUT + 1.5


# ---- shutdown, scale-out, gRPC off ------------------------------------------------------


def test_sigterm_drains_a_call_in_flight_on_the_http_port(tmp_path: Path) -> None:
    """A ModelInfer call half uploaded over h2c on the HTTP port when SIGTERM comes: the
    shutdown's GOAWAY reaches its connection, the rest of the message is still taken, the
    call is answered in full, and the server exits 0."""
    root = tmp_path / "repo"
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "identity_fp32")
    proc = ServerProcess(root).wait_ready()
    try:
        values = np.arange(8192, dtype=np.float32)  # an answer within the default windows
        request = service_pb2.ModelInferRequest(model_name="identity_fp32")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, values.size])
        request.raw_input_contents.append(values.tobytes())
        message = request.SerializeToString()
        framed = b"\x00" + struct.pack(">I", len(message)) + message
        half = len(framed) // 2
        with H2Client(proc.port, timeout=30) as client:
            client.handshake()
            block = client.block(grpc_headers(client.authority, MODEL_INFER))
            client.send(client.headers_frame(1, block) + client.data_frame(1, framed[:half]))
            # The PING's ACK comes after the server took the frames before it: the call is open.
            client.send(frame(Frame.PING, 0, 0, b"inflight"))
            client.expect_ping_ack(b"inflight")
            proc.process.send_signal(signal.SIGTERM)
            goaway = client.expect(Frame.GOAWAY)
            assert goaway.code == ErrorCode.NO_ERROR
            client.send(client.data_frame(1, framed[half:], end_stream=True))
            body = b""
            trailers: dict[str, str] = {}
            for got in client.frames():
                assert got is not None, "the connection closed before the answer"
                if got.stream == 1 and got.kind == Frame.DATA:
                    body += got.payload
                if got.stream == 1 and got.kind == Frame.HEADERS and got.flags & END_STREAM:
                    trailers = {str(k): str(v) for k, v in hpack.Decoder().decode(got.payload)}
                    break
        assert trailers.get("grpc-status") == "0", trailers
        answer = service_pb2.ModelInferResponse.FromString(body[5:])
        np.testing.assert_array_equal(
            np.frombuffer(answer.raw_output_contents[0], np.float32), values
        )
        assert proc.process.wait(60) == 0, proc.log
    finally:
        proc.kill()


def _clients_on_every_front(
    proc: ServerProcess, fronts: list[int], tries: int = 24
) -> dict[int, grpcclient.InferenceServerClient]:
    """A gRPC client on the HTTP port held by each front (connections opened one at a
    time, the holder found in /proc; the kernel spreads them)."""

    def links() -> set[tuple[int, int]]:
        return {(pid, far) for pid in fronts for near, far in tcp_links(pid) if near == proc.port}

    clients: dict[int, grpcclient.InferenceServerClient] = {}
    spare: list[grpcclient.InferenceServerClient] = []
    seen = links()
    for _ in range(tries):
        # NOTE: a local subchannel pool, or grpc shares one connection among clients.
        client = grpcclient.InferenceServerClient(
            proc.host_port, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
        assert client.is_server_live(client_timeout=10)
        assert wait_for(lambda seen=seen: links() - seen, timeout=10)
        now = links()
        (new,) = now - seen
        seen = now
        if new[0] in clients:
            spare.append(client)
        else:
            clients[new[0]] = client
        if len(clients) == len(fronts):
            break
    for client in spare:
        client.close()
    return clients


def test_every_front_serves_grpc_on_the_http_port() -> None:
    """--http-workers 2: each front adopts its own h2c connections; a replica answers
    inference itself (the primary stopped) and forwards the rest to the primary."""
    proc = ServerProcess(args=["--http-workers", "2", "--devices", "cpu"]).wait_ready()
    try:
        primary = proc.process.pid
        fronts = [primary, *proc.http_front_pids()]
        assert len(fronts) == 2
        clients = _clients_on_every_front(proc, fronts)
        try:
            assert set(clients) == set(fronts), proc.log
            for seed, client in enumerate(clients.values()):
                _grpc_infer(client, seed)
                assert client.get_model_metadata("simple").name == "simple"
                assert len(_stream(client, 2)) == 2
            (replica,) = set(fronts) - {primary}
            os.kill(primary, signal.SIGSTOP)
            try:
                _grpc_infer(clients[replica], 7)
            finally:
                os.kill(primary, signal.SIGCONT)
        finally:
            for client in clients.values():
                client.close()
        with httpclient.InferenceServerClient(proc.host_port) as rest:
            _http_infer(rest, 2)
        assert proc.stop() == 0, proc.log
    finally:
        proc.kill()
    assert "Traceback" not in proc.log, proc.log


def test_without_grpc_h2c_is_refused_and_rest_served() -> None:
    proc = ServerProcess(args=["--allow-grpc", "false", "--devices", "cpu"]).wait_ready()
    try:
        with open_h2c(proc.port) as sock:
            assert frames_until_closed(sock, 10) == []  # closed before any frame
        started = time.monotonic()
        with grpcclient.InferenceServerClient(proc.host_port) as client:
            outcome = _status(lambda: client.is_server_live(client_timeout=20))
        assert outcome == "StatusCode.UNAVAILABLE"
        assert time.monotonic() - started < 10
        with httpclient.InferenceServerClient(proc.host_port) as rest:
            _http_infer(rest, 1)
        assert proc.stop() == 0, proc.log
    finally:
        proc.kill()
