"""The infer lane answers as the REST app does, byte for byte, on every front (issue #40).

A plain ``POST .../infer`` is served below the ASGI app (``front.http.lane``); the same
request with a query string goes the ASGI way (uvicorn's cycle, the header rules, Falcon,
the app's error handlers). Each pair is sent on one connection to each front of a
two-front server and the raw responses compared, ``date`` aside: successes (JSON, binary
outputs, compressed, large outputs sent as views), errors (unknown model and version,
malformed JSON, a wrong shape) and ``Connection: close``. With inference a restricted
API there is no lane: a request without the key is refused either way.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, front_pid, socket_to_front
from tests.support.tensors import SIMPLE_JSON as SIMPLE


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--devices", "cpu", "--http-workers", "2"]
    args += ["--model-control-mode", "explicit", "--load-model", "simple"]
    args += ["--load-model", "identity_fp32"]
    proc = ServerProcess(SAMPLE_REPOSITORY, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


@pytest.fixture(scope="module", params=["primary", "extra front"])
def front(request: pytest.FixtureRequest, server: ServerProcess) -> int:
    return front_pid(server, request.param)


def _request(target: str, body: bytes, *fields: str) -> bytes:
    head = [f"POST {target} HTTP/1.1", "host: t", *fields, f"content-length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _response(sock: socket.socket) -> bytes:
    """One whole response, raw (a Content-Length or a chunked body), ``date`` left out."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1 << 20)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
    if b"content-length" in fields:
        while len(body) < int(fields[b"content-length"]):
            body += sock.recv(1 << 20)
    else:
        while not body.endswith(b"0\r\n\r\n"):
            body += sock.recv(1 << 20)
    kept = [line for line in lines if not line.lower().startswith(b"date:")]
    return b"\r\n".join(kept) + b"\r\n\r\n" + body


def _both_ways(
    server: ServerProcess, front: int, path: str, body: bytes, *fields: str
) -> tuple[bytes, bytes]:
    """The answer on the lane and the ASGI way's, on one connection to ``front``."""
    with socket_to_front(server, front) as sock:
        sock.sendall(_request(path, body, *fields))
        lane = _response(sock)
        sock.sendall(_request(path + "?way=asgi", body, *fields))
        return lane, _response(sock)


def _binary(values: np.ndarray, outputs: list[str]) -> tuple[bytes, str]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": list(values.shape),
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs],
        }
    ).encode()
    return header + values.tobytes(), f"inference-header-content-length: {len(header)}"


CASES = {
    "json": ("/v2/models/simple/infer", json.dumps(SIMPLE).encode(), ()),
    "version": ("/v2/models/simple/versions/1/infer", json.dumps(SIMPLE).encode(), ()),
    "gzip answer": (
        "/v2/models/simple/infer",
        json.dumps(SIMPLE).encode(),
        ("accept-encoding: gzip",),
    ),
    "unknown model": ("/v2/models/nothing/infer", b"{}", ()),
    "unknown version": ("/v2/models/simple/versions/7/infer", json.dumps(SIMPLE).encode(), ()),
    "malformed JSON": ("/v2/models/simple/infer", b'{"inputs": [', ()),
    "wrong shape": (
        "/v2/models/simple/infer",
        json.dumps(
            {"inputs": [{**SIMPLE["inputs"][0], "shape": [2, 16]}, SIMPLE["inputs"][1]]}
        ).encode(),
        (),
    ),
    "connection close": (
        "/v2/models/simple/infer",
        json.dumps(SIMPLE).encode(),
        ("connection: close",),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_lane_answers_as_the_app(server: ServerProcess, front: int, case: str) -> None:
    path, body, fields = CASES[case]
    if case == "connection close":
        answers = []
        for target in (path, path + "?way=asgi"):
            with socket_to_front(server, front) as sock:
                sock.sendall(_request(target, body, *fields))
                answers.append(_response(sock))
                assert sock.recv(1) == b""  # closed after its answer
        lane, asgi = answers
    else:
        lane, asgi = _both_ways(server, front, path, body, *fields)
    assert lane == asgi
    assert lane.startswith(
        b"HTTP/1.1 "
        + (b"200" if case in ("json", "version", "gzip answer", "connection close") else b"4")
    )


@pytest.mark.parametrize("elements", [16, 1 << 20], ids=["small", "4 MiB, sent as views"])
def test_binary_outputs_as_the_app(server: ServerProcess, front: int, elements: int) -> None:
    values = np.arange(elements, dtype=np.float32).reshape(1, elements)
    body, field = _binary(values, ["OUTPUT0"])
    lane, asgi = _both_ways(server, front, "/v2/models/identity_fp32/infer", body, field)
    assert lane == asgi
    head, _, answer = lane.partition(b"\r\n\r\n")
    assert b"content-type: application/octet-stream" in head
    length = int(head.split(b"inference-header-content-length: ")[1].split(b"\r\n")[0])
    assert np.frombuffer(answer[length:], np.float32).tolist() == values.ravel().tolist()


def test_no_lane_where_inference_is_restricted() -> None:
    args = ["--devices", "cpu", "--model-control-mode", "explicit", "--load-model", "simple"]
    args += ["--http-restricted-api", "inference:x-infer-key=s3cr3t"]
    proc = ServerProcess(SAMPLE_REPOSITORY, args).wait_ready()
    try:
        body = json.dumps(SIMPLE).encode()
        with socket.create_connection(("127.0.0.1", proc.port), timeout=30) as sock:
            sock.sendall(_request("/v2/models/simple/infer", body))
            refused = _response(sock)
            sock.sendall(_request("/v2/models/simple/infer", body, "x-infer-key: s3cr3t"))
            allowed = _response(sock)
        assert refused.startswith(b"HTTP/1.1 403"), refused
        assert allowed.startswith(b"HTTP/1.1 200"), allowed
    finally:
        assert proc.stop() == 0, proc.log


def test_the_binary_header_length_is_read_as_the_app_reads_it(
    server: ServerProcess, front: int
) -> None:
    """A header length past the body: the same 400 both ways."""
    values = np.zeros((1, 4), np.float32)
    body, _ = _binary(values, ["OUTPUT0"])
    field = f"inference-header-content-length: {len(body) + 1}"
    lane, asgi = _both_ways(server, front, "/v2/models/identity_fp32/infer", body, field)
    assert lane == asgi and lane.startswith(b"HTTP/1.1 400")
