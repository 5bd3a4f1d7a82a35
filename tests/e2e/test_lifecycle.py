"""Start-up failures, broken models, SIGTERM draining, shared-memory hygiene, worker death."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import threading
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.http as httpclient

from oipserve.front.grpc.h2.frames import Frame
from tests.support.cli import run_cli
from tests.support.h2_raw import H2Client, grpc_headers
from tests.support.http import request
from tests.support.onnx_models import write_slow_model
from tests.support.raw_http import read_response
from tests.support.server import (
    SAMPLE_REPOSITORY,
    ServerProcess,
    alive,
    shm_entries,
    wait_for,
)
from tests.support.sockets import read_by_peer


def test_bad_flag_exits_non_zero_with_message() -> None:
    result = run_cli("serve", "--model-repository", str(SAMPLE_REPOSITORY), "--http-port", "x")
    assert result.returncode == 2
    assert "--http-port" in result.stderr


def test_missing_repository_flag() -> None:
    result = run_cli("serve")
    assert result.returncode == 2 and "--model-repository is required" in result.stderr


def test_unreadable_repository(tmp_path: Path) -> None:
    # (free ports: another test's server may hold the default ones; the metrics port is
    #   free through run_cli's environment)
    free = ["--http-port", "0", "--grpc-port", "0"]
    result = run_cli("serve", "--model-repository", str(tmp_path / "nope"), *free)
    assert result.returncode != 0 and "is not a directory" in result.stderr


def test_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "serve", "--model-repository", str(SAMPLE_REPOSITORY), "--http-port", str(port),
            "--grpc-port", "0",
        )  # fmt: skip
    assert result.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_settings_from_environment_and_flags_win(tmp_path: Path) -> None:
    env = {"OIPSERVE_MAX_REQUEST_BYTES": "2048", "OIPSERVE_HTTP_PORT": "1"}
    proc = ServerProcess(env=env).wait_ready()  # --http-port 0 beats the env's 1
    try:
        body = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 1000], "datatype": "FP32", "data": [1.0] * 1000}
                ]
            }
        )
        status, _, _ = request(proc, "POST", "/v2/models/identity_fp32/infer", body)
        assert status == 413
    finally:
        assert proc.stop() == 0


def test_broken_models_are_unavailable_and_the_rest_is_served(tmp_path: Path) -> None:
    shutil.copytree(SAMPLE_REPOSITORY / "simple", tmp_path / "simple")
    (tmp_path / "garbage" / "1").mkdir(parents=True)
    (tmp_path / "garbage" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", tmp_path / "badconfig")
    (tmp_path / "badconfig" / "config.pbtxt").write_text("max_batch_size: [oops\n")
    (tmp_path / "noversion").mkdir()
    proc = ServerProcess(tmp_path).wait_ready()
    try:
        status, _, body = request(proc, "GET", "/v2/health/ready")
        assert status == 503 and json.loads(body) == {"ready": False}
        client = httpclient.InferenceServerClient(proc.host_port)
        assert client.is_model_ready("simple")
        assert not client.is_model_ready("garbage")
        a = np.ones((1, 16), dtype=np.int32)
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        assert client.infer("simple", inputs).as_numpy("OUTPUT0").tolist() == [[2] * 16]
        for model in ("garbage", "badconfig", "noversion"):
            status, _, body = request(proc, "GET", f"/v2/models/{model}")
            assert status == 503, body
            assert model in json.loads(body)["error"]
    finally:
        assert proc.stop() == 0
    log = proc.log
    assert "model 'garbage' version 1 is UNAVAILABLE" in log
    assert "model 'badconfig' is UNAVAILABLE: config.pbtxt" in log
    assert "model 'noversion' is UNAVAILABLE: no version directory" in log


def _binary_identity_request(values: np.ndarray) -> tuple[bytes, bytes]:
    """Head (HTTP headers and JSON header) and tensor bytes of an identity_fp32 request."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": list(values.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    http_head = (
        "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: test\r\n"
        f"Content-Length: {len(header) + values.nbytes}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n\r\n"
    ).encode()
    return http_head + header, values.tobytes()


def test_sigterm_drains_in_flight_requests_and_leaves_no_shared_memory() -> None:
    """Requests the server has begun to receive when SIGTERM arrives all complete.

    Each client sends its request's head and half of its tensor, then waits until the
    server has been told to stop, then sends the rest: the requests are provably in
    flight during the drain, and every one of them must be answered in full.
    """
    proc = ServerProcess().wait_ready()
    pid = proc.process.pid
    host, port = proc.host_port.rsplit(":", 1)
    clients = 4
    half_sent = threading.Barrier(clients + 1, timeout=60)
    signalled = threading.Event()
    outcomes: list[object] = []

    def client(seed: int) -> None:
        values = np.random.default_rng(seed).standard_normal((1, 1_000_000)).astype(np.float32)
        head, data = _binary_identity_request(values)
        try:
            with socket.create_connection((host, int(port)), timeout=60) as sock:
                sock.sendall(head + data[: len(data) // 2])
                half_sent.wait()
                assert signalled.wait(60)
                sock.sendall(data[len(data) // 2 :])
                reader = sock.makefile("rb")
                status = reader.readline()
                headers = {}
                while (line := reader.readline().strip()) != b"":
                    key, _, value = line.decode().partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = reader.read(int(headers["content-length"]))
            json_size = int(headers["inference-header-content-length"])
            output = np.frombuffer(body[json_size:], dtype=np.float32).reshape(values.shape)
            outcomes.append(status.split()[1] == b"200" and np.array_equal(output, values))
        except Exception as exc:  # noqa: BLE001 - any failure is what the test reports
            outcomes.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    half_sent.wait()
    assert shm_entries(pid), "the half-received bodies should be in shared memory"
    proc.process.send_signal(signal.SIGTERM)

    def refuses_new_connections() -> bool:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError:
            return True
        return False

    # The drain has begun once the listening socket is closed; only then the rest is sent.
    refused = wait_for(refuses_new_connections, 20)
    signalled.set()
    for thread in threads:
        thread.join(60)
    code = proc.process.wait(60)
    proc.stop()
    assert code == 0, proc.log
    assert outcomes == [True] * clients, outcomes  # zero client errors during the drain
    assert refused, "a new connection during the drain should be refused"
    assert shm_entries(pid) == []
    assert "Traceback" not in proc.log


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_sigint_and_sighup_also_stop_cleanly(signum: int) -> None:
    """SIGHUP (a closed terminal's) killed the front at once, its segments left behind
    (found by fuzzing); it stops as SIGTERM does now."""
    proc = ServerProcess().wait_ready()
    workers = proc.worker_pids()
    assert workers
    proc.process.send_signal(signum)
    assert proc.process.wait(60) == 0
    assert shm_entries(proc.process.pid) == []
    assert wait_for(lambda: not any(Path(f"/proc/{w}").exists() for w in workers), 10)


def test_output_segments_are_reused_not_leaked(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.host_port)
    x = np.ones((1, 100_000), dtype=np.float32)  # 400 KB: sent as views of the worker segment
    pid = server.process.pid

    def worker_segments() -> int:
        return len([n for n in shm_entries(pid) if n.startswith(f"oipserve-{pid}-w")])

    def run(times: int) -> None:
        for _ in range(times):
            inp = httpclient.InferInput("INPUT0", [1, x.shape[1]], "FP32")
            inp.set_data_from_numpy(x)
            assert client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0").shape == x.shape

    run(5)
    before = worker_segments()
    run(50)
    # Every response released its output segment, so the same one is reused each time.
    assert worker_segments() - before <= 1


def test_worker_killed_under_load_is_replaced() -> None:
    proc = ServerProcess().wait_ready()
    try:
        client = httpclient.InferenceServerClient(proc.host_port)
        (worker,) = proc.worker_pids()
        results: list[object] = []
        stop = threading.Event()

        def load() -> None:
            local = httpclient.InferenceServerClient(proc.host_port, network_timeout=30)
            a = np.ones((1, 16), dtype=np.int32)
            while not stop.is_set():
                inputs = [
                    httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                    httpclient.InferInput("INPUT1", [1, 16], "INT32"),
                ]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(a)
                try:
                    local.infer("simple", inputs)
                    results.append(200)
                except Exception as exc:
                    results.append(str(exc))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: results.count(200) > 5, 30)  # the load is under way
        os.kill(worker, signal.SIGKILL)
        assert wait_for(lambda: worker not in proc.worker_pids() and proc.worker_pids(), 30)
        assert wait_for(client.is_server_ready, 60), proc.log
        count = len(results)
        # The load goes on, answered by the new worker.
        assert wait_for(lambda: results[count:].count(200) > 5, 30), results[count:][-5:]
        stop.set()
        for thread in threads:
            thread.join(30)
        errors = [r for r in results if r != 200]
        assert all("[503]" in str(e) for e in errors), errors[:3]
        assert results[-1] == 200, results[-5:]
    finally:
        assert proc.stop() == 0, proc.log
    assert "worker 1 (pid" in proc.log and "died" in proc.log
    assert "worker 1 replaced" in proc.log


@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_worker_sigterm_drains_and_frees_its_memory(signum: int) -> None:
    proc = ServerProcess().wait_ready()
    try:
        (worker,) = proc.worker_pids()
        client = httpclient.InferenceServerClient(proc.host_port)
        x = np.ones((1, 100_000), dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [1, x.shape[1]], "FP32")
        inp.set_data_from_numpy(x)
        client.infer("identity_fp32", [inp])
        os.kill(worker, signum)
        # NOTE: ``alive`` reads the state once: a worker reaped between a look at
        #   /proc/<pid> and a read of its stat file made this check raise (CI, 2026-11-29).
        assert wait_for(lambda: not alive(worker), 20)
        assert wait_for(client.is_server_ready, 60)
        assert client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0").shape == x.shape
    finally:
        assert proc.stop() == 0, proc.log


@pytest.mark.parametrize("timeout", ["1", "0.5"])
def test_requests_still_running_at_the_shutdown_timeout_get_a_503(
    tmp_path: Path, timeout: str
) -> None:
    """Requests on a worker that does not answer (stopped) when --shutdown-timeout is up:
    a 503 with {"error": ...} each, on the lane and the ASGI way alike, and over h2c; a
    gRPC call gets UNAVAILABLE with the same words; no traceback. uvicorn answered a
    plain-text 500 and logged a traceback for each, and HTTP/2 streams were reset
    unanswered (found by fuzzing). A timeout under a second made the HTTP drain wait
    for ever (uvicorn was given ``int(timeout) or None``; fuzzing too)."""
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", tmp_path / "identity_fp32")
    args = ["--instances-per-device", "1", "--shutdown-timeout", timeout, "--http-workers", "1"]
    proc = ServerProcess(tmp_path, args).wait_ready()
    pid = proc.process.pid
    (worker,) = proc.worker_pids()
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    ).encode()
    host, port = proc.host_port.rsplit(":", 1)
    os.kill(worker, signal.SIGSTOP)
    try:
        sockets = []
        # (a query string sends a request the ASGI way, not on the lane; the last is still
        #  uploading its body: Falcon's own answer to that raised on the 503 sent, a
        #  traceback, found by fuzzing)
        paths = ["/v2/models/identity_fp32/infer", "/v2/models/identity_fp32/infer?x=1"]
        for path, length in [*((p, len(body)) for p in paths), (paths[1], 2 * len(body))]:
            sock = socket.create_connection((host, int(port)), timeout=60)
            head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n"
            sock.sendall(head.encode() + body)
            sockets.append(sock)
        assert wait_for(lambda: all(read_by_peer(sock) for sock in sockets), 10)
        h2c = H2Client(int(port), host)
        h2c.handshake()
        h2c.send(_h2c_rest_and_grpc(h2c, body))
        assert wait_for(lambda: read_by_peer(h2c.sock), 10)
        proc.process.send_signal(signal.SIGTERM)
        answers = []
        for sock in sockets:
            with sock:
                status, _, raw = read_response(sock)
            answers.append((status, json.loads(raw)))
        with h2c:
            heads, bodies = _h2_answers(h2c)
        answers.append((int(heads[1][":status"]), json.loads(bodies[1])))
        grpc_call = heads[3]
        code = proc.process.wait(60)
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGCONT)
    proc.stop()
    assert code == 0, proc.log
    message = "the server is shutting down and this request did not finish within"
    assert [(s, message in a.get("error", "")) for s, a in answers] == [(503, True)] * 4, answers
    assert grpc_call["grpc-status"] == "14", grpc_call  # UNAVAILABLE, Trailers-Only
    assert message in grpc_call["grpc-message"], grpc_call
    assert "Traceback" not in proc.log, proc.log
    assert shm_entries(pid) == []


def _identity_call() -> object:
    """A ModelInferRequest of identity_fp32 (one [1, 2] FP32 input)."""
    from oipserve.grpc_generated import grpc_service_pb2 as pb

    call = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = call.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    return call


def _h2c_rest_and_grpc(h2c: H2Client, body: bytes) -> bytes:
    """Stream 1: identity_fp32's REST infer with ``body``; stream 3: its gRPC ModelInfer."""
    rest = [(":method", "POST"), (":scheme", "http"), (":authority", h2c.authority)]
    rest += [(":path", "/v2/models/identity_fp32/infer"), ("content-length", str(len(body)))]
    message = _identity_call().SerializeToString()  # type: ignore[attr-defined]
    framed = struct.pack(">BI", 0, len(message)) + message
    infer = grpc_headers(h2c.authority, "/inference.GRPCInferenceService/ModelInfer")
    return b"".join(
        [
            h2c.headers_frame(1, h2c.block(rest)),
            h2c.data_frame(1, body, end_stream=True),
            h2c.headers_frame(3, h2c.block(infer)),
            h2c.data_frame(3, framed, end_stream=True),
        ]
    )


def _h2_answers(h2c: H2Client) -> tuple[dict[int, dict[str, str]], dict[int, bytes]]:
    """Each stream's last header block, decoded, and its DATA, until the server closes
    (its GOAWAYs and PING passed over)."""
    heads: dict[int, dict[str, str]] = {}
    bodies: dict[int, bytes] = {}
    for got in h2c.frames():
        if got is None:
            break
        if got.kind == Frame.HEADERS:
            heads[got.stream] = {str(k): str(v) for k, v in hpack.Decoder().decode(got.payload)}
        elif got.kind == Frame.DATA:
            bodies[got.stream] = bodies.get(got.stream, b"") + got.payload
    return heads, bodies


def test_signals_during_and_after_the_shutdown_of_an_interrupted_start_up(tmp_path: Path) -> None:
    """SIGTERM while a model loads interrupts the start-up; a second during that shutdown,
    and a third once it logged "stopped", change nothing: exit 0, no traceback. The second
    cancelled the shutdown (a traceback, exit 1, /dev/shm not swept), the third killed
    the process (exit -15) (found by fuzzing)."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    write_slow_model(tmp_path / "slow" / "1" / "model.onnx", 2000)  # seconds to load
    proc = ServerProcess(tmp_path)
    try:
        assert wait_for(lambda: "model 'slow' version 1: loading" in proc.log, 60), proc.log
        proc.process.send_signal(signal.SIGTERM)
        assert wait_for(lambda: "start-up interrupted" in proc.log, 30), proc.log
        proc.process.send_signal(signal.SIGTERM)
        assert wait_for(lambda: "INFO oipserve: stopped" in proc.log, 30), proc.log
        if proc.process.poll() is None:
            proc.process.send_signal(signal.SIGINT)
        code = proc.process.wait(30)
    finally:
        proc.kill()
    assert code == 0, proc.log
    assert "Traceback" not in proc.log, proc.log
    assert shm_entries(proc.process.pid) == []
