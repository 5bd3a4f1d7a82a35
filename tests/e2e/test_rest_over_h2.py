"""OIP REST over HTTP/2 streams (issue #39, item 3): Knative's queue-proxy speaks HTTP/2 with
prior knowledge to a port named ``h2c`` for every request, so REST calls arrive as HTTP/2
streams beside gRPC calls. A stream whose request is not gRPC is served by the REST app
(``oipserve.front.http.h2_asgi``), on the HTTP port's h2c connections and on the gRPC port
alike, with HTTP/1.1's routes, restrictions, limits and error bodies.

Clients: python-hyper's ``h2`` (``tests.support.h2_rest``), and curl's nghttp2.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tests.support.h2_rest import H2c, grpc_message
from tests.support.server import ServerProcess, socket_to_front, wait_for
from tests.support.tensors import SIMPLE_JSON

#: --max-request-bytes: a 6 MiB body passes (more than a stream's 4 MiB window), 9 MiB not.
LIMIT = 8 * 1024 * 1024
ADMIN_KEY = "r3st"
JSON = ("content-type", "application/json")
SIMPLE = SIMPLE_JSON


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--devices", "cpu", "--max-request-bytes", str(LIMIT)]
    args += ["--http-restricted-api", f"model-repository:X-Admin-Key={ADMIN_KEY}"]
    proc = ServerProcess(args=args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def _ports(server: ServerProcess) -> dict[str, int]:
    return {"http": server.port, "grpc": server.grpc_port}


@pytest.mark.parametrize("port", ["http", "grpc"])
def test_health_metadata_and_json_infer(server: ServerProcess, port: str) -> None:
    with H2c("127.0.0.1", _ports(server)[port]) as h2:
        ready = h2.request("GET", "/v2/health/ready")
        assert (ready.status, json.loads(ready.body)) == (200, {"ready": True})
        assert h2.request("GET", "/v2/health/live").status == 200
        meta = h2.request("GET", "/v2")
        assert meta.status == 200 and "binary_tensor_data" in json.loads(meta.body)["extensions"]
        model = h2.request("GET", "/v2/models/simple")
        assert json.loads(model.body)["inputs"][0]["name"] == "INPUT0"
        head = h2.request("HEAD", "/v2/health/ready")  # not a route's method, as on HTTP/1.1
        assert head.status == 405 and head.headers["content-length"] != "0" and not head.body
        answer = h2.request("POST", "/v2/models/simple/infer", [JSON], json.dumps(SIMPLE).encode())
        assert answer.status == 200, answer.body
        outputs = {o["name"]: o["data"] for o in json.loads(answer.body)["outputs"]}
        assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]
        assert outputs["OUTPUT1"] == [i - 1 for i in range(16)]


def test_errors_are_json_with_their_status(server: ServerProcess) -> None:
    with H2c("127.0.0.1", server.port) as h2:
        missing = h2.request("GET", "/v2/models/nope")
        assert missing.status == 404 and "nope" in json.loads(missing.body)["error"]
        bad = h2.request("POST", "/v2/models/simple/infer", [JSON], b"{not json")
        assert bad.status == 400 and json.loads(bad.body)["error"]
        assert bad.headers["content-type"] == "application/json"
        # --http-restricted-api holds: the same app, the same guard.
        refused = h2.request("POST", "/v2/repository/index", [JSON], b"{}")
        assert refused.status == 403 and json.loads(refused.body)["error"]
        allowed = h2.request("POST", "/v2/repository/index", [JSON, ("x-admin-key", ADMIN_KEY)])
        assert allowed.status == 200, allowed.body
        # The connection serves on after every error.
        assert h2.request("GET", "/v2/health/ready").status == 200


def _binary_request(values: np.ndarray) -> tuple[list[tuple[str, str]], bytes]:
    raw = values.tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": list(values.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = [
        ("content-type", "application/octet-stream"),
        ("inference-header-content-length", str(len(header))),
        ("content-length", str(len(header) + len(raw))),
    ]
    return headers, header + raw


@pytest.mark.parametrize("port", ["http", "grpc"])
def test_large_binary_infer_with_flow_control(server: ServerProcess, port: str) -> None:
    """6 MiB each way: past the server's stream window (4 MiB) going in, and past this
    client's window (64 KiB, given back as it reads) coming out."""
    values = np.arange(6 * 1024 * 1024 // 4, dtype=np.float32).reshape(1, -1)
    headers, body = _binary_request(values)
    with H2c("127.0.0.1", _ports(server)[port]) as h2:
        answer = h2.request("POST", "/v2/models/identity_fp32/infer", headers, body)
        assert answer.status == 200, bytes(answer.body[:300])
        length = int(answer.headers["inference-header-content-length"])
        meta = json.loads(answer.body[:length])
        assert meta["outputs"][0]["parameters"]["binary_data_size"] == values.nbytes
        out = np.frombuffer(bytes(answer.body[length:]), dtype=np.float32)
        assert np.array_equal(out, values.ravel())


def test_a_body_declared_past_the_limit_is_refused_before_it_is_sent(
    server: ServerProcess,
) -> None:
    with H2c("127.0.0.1", server.port) as h2:
        headers = [JSON, ("content-length", str(LIMIT + 1))]
        stream = h2.start("POST", "/v2/models/simple/infer", headers, end=False)
        answer = h2.wait(stream)  # not one byte of the body was sent
        assert answer.status == 413
        assert str(LIMIT) in json.loads(answer.body)["error"]
        assert answer.reset == 0  # RST_STREAM NO_ERROR: stop sending (RFC 9113, 8.1)
        assert h2.request("GET", "/v2/health/ready").status == 200


def test_a_body_of_no_declared_length_is_refused_at_the_limit(server: ServerProcess) -> None:
    with H2c("127.0.0.1", server.port) as h2:
        stream = h2.start("POST", "/v2/models/simple/infer", [JSON], end=False)
        h2.send_body(stream, b" " * (LIMIT + 1024 * 1024))
        answer = h2.wait(stream)
        assert answer.status == 413, answer
        assert str(LIMIT) in json.loads(answer.body)["error"]
        assert h2.request("GET", "/v2/health/ready").status == 200


def _grpc_infer_request(seed: int) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="simple", id=f"g{seed}")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        del tensor
        request.raw_input_contents.append((np.arange(16, dtype=np.int32) + seed).tobytes())
    return request.SerializeToString()


@pytest.mark.parametrize("port", ["http", "grpc"])
def test_grpc_and_rest_streams_interleaved_on_one_connection(
    server: ServerProcess, port: str
) -> None:
    with H2c("127.0.0.1", _ports(server)[port]) as h2:
        streams = []
        for seed in range(6):
            streams.append(("grpc", seed, h2.grpc("ModelInfer", _grpc_infer_request(seed))))
            body = json.dumps(SIMPLE).encode()
            streams.append(
                ("rest", seed, h2.start("POST", "/v2/models/simple/infer", [JSON], body))
            )
            streams.append(("live", seed, h2.grpc("ServerLive", b"")))
        for kind, seed, stream in reversed(streams):
            answer = h2.wait(stream)
            assert answer.status == 200, (kind, answer)
            if kind == "rest":
                assert answer.headers["content-type"] == "application/json"
                assert json.loads(answer.body)["outputs"][0]["data"][0] == 1
                continue
            assert answer.headers["content-type"] == "application/grpc"
            assert answer.trailers["grpc-status"] == "0", answer.trailers
            if kind == "grpc":
                reply = service_pb2.ModelInferResponse.FromString(grpc_message(answer.body))
                assert reply.id == f"g{seed}"
                out = np.frombuffer(reply.raw_output_contents[0], dtype=np.int32)
                assert out[0] == 2 * seed


def _curl_speaks_h2c() -> bool:
    curl = shutil.which("curl")
    if curl is None:
        return False
    version = subprocess.run([curl, "--version"], capture_output=True, text=True).stdout
    return "HTTP2" in version


@pytest.mark.skipif(not _curl_speaks_h2c(), reason="curl without HTTP/2 (nghttp2)")
def test_curl_with_http2_prior_knowledge(server: ServerProcess) -> None:
    base = [
        "curl",
        "-sS",
        "--http2-prior-knowledge",
        "-o",
        "-",
        "-w",
        "\n%{http_version} %{http_code}",
    ]
    ready = subprocess.run(
        [*base, f"{server.url}/v2/health/ready"], capture_output=True, text=True, timeout=30
    )
    assert ready.stdout.splitlines()[-1] == "2 200", ready.stdout + ready.stderr
    infer = subprocess.run(
        [*base, "-H", "content-type: application/json", "--data-binary", json.dumps(SIMPLE)]
        + [f"http://{server.grpc_url}/v2/models/simple/infer"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    body, status = infer.stdout.rsplit("\n", 1)
    assert status == "2 200", infer.stdout + infer.stderr
    assert json.loads(body)["outputs"][0]["data"][:3] == [1, 2, 3]


def test_every_front_of_http_workers_serves_rest_over_h2() -> None:
    """``--http-workers 2``: each front's own HTTP/2 serves REST (a connection lands on any
    front, and the client must not be able to tell which): inference answered there, the
    repository API forwarded to the primary, on the HTTP port's h2c and the gRPC port."""
    proc = ServerProcess(args=["--devices", "cpu", "--http-workers", "2"]).wait_ready()
    try:
        fronts = [proc.process.pid, *proc.http_front_pids()]
        assert len(fronts) == 2
        for pid in fronts:
            for port in (proc.port, proc.grpc_port):
                sock = socket_to_front(proc, pid, port=port)
                with H2c("127.0.0.1", port, sock=sock) as h2:
                    assert h2.request("GET", "/v2/health/ready").status == 200
                    body = json.dumps(SIMPLE).encode()
                    answer = h2.request("POST", "/v2/models/simple/infer", [JSON], body)
                    assert answer.status == 200, (pid, port, answer)
                    index = h2.request("POST", "/v2/repository/index", [JSON], b"{}")
                    assert index.status == 200, (pid, port, index)
                    assert "simple" in {m["name"] for m in json.loads(index.body)}
                    # A method HTTP/1.1's parser refuses: the same answer on every front.
                    brew = h2.request("BREW", "/v2/health/ready")
                    assert (brew.status, json.loads(brew.body)) == (
                        400,
                        {"error": "Invalid HTTP request received."},
                    ), (pid, port, brew)
    finally:
        assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


#: Clients taking large answers at SIGTERM, each answer's size (4 MiB), their window
#: (WINDOW_UPDATEs all along an answer) and the most one of their reads takes.
_CLIENTS = 4
_FLOATS = 1 << 20
_WINDOW = 1 << 20
_READ = 64 * 1024


def _take_answers_until_goaway(port: int, answered: list[int], index: int) -> list[str]:
    """One client's 4 MiB round trips until the server's GOAWAY, then its connection read
    to its end: what went wrong (nothing, for a server that loses nothing)."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, _FLOATS],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": _FLOATS * 4},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    fields = [
        ("content-type", "application/octet-stream"),
        ("inference-header-content-length", str(len(header))),
    ]
    body = header + bytes(_FLOATS * 4)
    with H2c("127.0.0.1", port, window=_WINDOW, through_goaway=True) as h2:
        h2.read_size = _READ
        try:
            while h2.goaway_last is None:
                stream = h2.start("POST", "/v2/models/identity_fp32/infer", fields, body)
                try:
                    answer = h2.wait(stream)
                except ConnectionError:  # closed after its GOAWAY: not taken, if past it
                    last = h2.goaway_last
                    return [] if last is not None and stream > last else [f"{stream} lost"]
                if answer.status != 200 or len(answer.body) <= _FLOATS * 4:
                    return [f"stream {stream}: {answer.status}, {len(answer.body)} bytes"]
                answered[index] += 1
            while not h2.closed:  # the connection's end: a FIN, not a reset
                h2._read_once()
        except OSError as exc:
            return [f"{type(exc).__name__} after {answered[index]} answers: {exc}"]
    return []


def test_answers_under_way_at_shutdown_reach_h2c_clients_whole() -> None:
    """SIGTERM while clients take 4 MiB answers over h2c (``--http-workers 2``): every
    stream the server took is answered whole and each connection ends with a FIN. Until
    2026-11-30 a connection whose last call was answered closed with the client's last
    WINDOW_UPDATEs unread: the kernel reset it, and the reset dropped the tail of the
    answer still in flight and the last GOAWAY (found by fuzzing; here 1 to 4 of the 4
    clients lost an answer, in each of 8 runs)."""
    proc = ServerProcess(args=["--devices", "cpu", "--http-workers", "2"]).wait_ready()
    answered = [0] * _CLIENTS
    with ThreadPoolExecutor(_CLIENTS) as pool:
        futures = [
            pool.submit(_take_answers_until_goaway, proc.port, answered, i) for i in range(_CLIENTS)
        ]
        assert wait_for(lambda: all(answered) or any(f.done() for f in futures), 60)
        proc.process.send_signal(signal.SIGTERM)
        problems = [problem for future in futures for problem in future.result(60)]
    assert problems == [], problems
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log
