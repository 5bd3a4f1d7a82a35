"""Every client mistake gets a clear {"error": ...} with the right 4xx, and nothing breaks."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from tests.support.http import request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, wait_for


def simple_body(**overrides: object) -> dict:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }
    body.update(overrides)
    return body


def with_input(index: int, **changes: object) -> dict:
    body = simple_body()
    body["inputs"][index].update(changes)
    return body


def post(server: ServerProcess, body: object, model: str = "simple") -> tuple[int, dict]:
    raw = body if isinstance(body, bytes | str) else json.dumps(body)
    status, headers, data = request(server, "POST", f"/v2/models/{model}/infer", raw)
    assert headers["content-type"].startswith("application/json"), data
    reply = json.loads(data)
    return status, reply


CASES = {
    "malformed JSON": (b'{"inputs": [', 400, "malformed JSON"),
    "JSON not an object": (b"[1, 2]", 400, "invalid inference request"),
    "absurdly deep nesting": (
        b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": '
        + b"[" * 200_000
        + b"]" * 200_000
        + b"}]}",
        400,
        "nested too deeply",
    ),
    "missing inputs": ({}, 400, "inputs"),
    "empty inputs": (
        {"inputs": []},
        400,
        "expected 2 inputs but got 0 inputs for model 'simple'. Got input(s) [], but missing "
        "required input(s) ['INPUT0','INPUT1']. Please provide all required input(s).",
    ),
    "missing field shape": (
        {"inputs": [{"name": "INPUT0", "datatype": "INT32", "data": [1]}]},
        400,
        "shape",
    ),
    "missing field datatype": (
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "data": [1] * 16}]},
        400,
        "datatype",
    ),
    "missing data": (
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32"}]},
        400,
        "has no 'data'",
    ),
    "unknown datatype": (with_input(0, datatype="INT33"), 400, "unknown datatype 'INT33'"),
    "datatype not the model's": (
        with_input(0, datatype="FP32"),
        400,
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
    ),
    "shape rank": (
        with_input(0, shape=[1, 16, 1]),
        400,
        "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,16,1]",
    ),
    "shape fixed dim": (
        with_input(0, shape=[1, 8], data=list(range(8))),
        400,
        "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]",
    ),
    "batch above max_batch_size": (
        {"inputs": [{**i, "shape": [9, 16], "data": [0] * 144} for i in simple_body()["inputs"]]},
        400,
        "inference request batch-size must be <= 8 for 'simple'",
    ),
    "too few elements": (
        with_input(0, data=list(range(15))),
        400,
        "Failed to parse 'data' field: shape does not match true shape: input 'INPUT0': its "
        "shape holds 16 elements but 'data' has 15",
    ),
    "too many elements": (
        with_input(0, data=list(range(17))),
        400,
        "Unable to parse 'data': Shape does not match true shape of 'data' field: input "
        "'INPUT0': its shape holds 16 elements but 'data' has 17",
    ),
    "ragged nesting": (with_input(0, data=[[1] * 9, [1] * 7]), 400, "ragged"),
    "string in INT32": (with_input(0, data=["a"] * 16), 400, "must be integers, got strings"),
    "float in INT32": (with_input(0, data=[1.5] * 16), 400, "must be integers"),
    "bool in INT32": (with_input(0, data=[True] * 16), 400, "must be integers, got booleans"),
    "out of range": (with_input(0, data=[2**31] * 16), 400, "out of range for INT32"),
    "data not an array": (with_input(0, data=5), 400, "must be an array"),
    "null data": (with_input(0, data=None), 400, "must be an array"),
    "unknown input": (
        with_input(0, name="NOPE"),
        400,
        "unexpected inference input 'NOPE' for model 'simple'",
    ),
    "duplicate input": (
        {"inputs": [simple_body()["inputs"][0], simple_body()["inputs"][0]]},
        400,
        "input 'INPUT0' already exists in request",
    ),
    "missing required input": (
        {"inputs": [simple_body()["inputs"][0]]},
        400,
        "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but "
        "missing required input(s) ['INPUT1']. Please provide all required input(s).",
    ),
    "unknown requested output": (
        simple_body(outputs=[{"name": "OUTPUT9"}]),
        400,
        "unexpected inference output 'OUTPUT9' for model 'simple'",
    ),
    "parameter value an array": (
        simple_body(parameters={"x": [1]}),
        400,
        "parameters",
    ),
    "id not a string": (simple_body(id=5), 400, "id"),
}


def test_an_empty_list_of_outputs_asks_for_every_output(server: ServerProcess) -> None:
    # (as gRPC's empty repeated field, and Triton: it was an IndexError, a 500)
    status, reply = post(server, simple_body(outputs=[]))
    assert status == 200, reply
    assert [o["name"] for o in reply["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_a_string_the_model_cannot_read_as_a_number_is_400(server: ServerProcess) -> None:
    # simple_string casts its BYTES inputs to INT32 in the graph: ONNX Runtime's Cast
    #   fails on "abc" (a RUNTIME_EXCEPTION naming stoll), the request's fault.
    data = [str(i) for i in range(15)] + ["abc"]
    body = {
        "inputs": [
            {"name": name, "shape": [1, 16], "datatype": "BYTES", "data": data}
            for name in ("INPUT0", "INPUT1")
        ]
    }
    status, reply = post(server, body, "simple_string")
    assert status == 400 and "Cast node" in reply["error"], reply


@pytest.mark.parametrize("data", [[["a", "b"], "c"], ["a", ["b"], "c"], [["a", "b"], ["c"]]])
def test_ragged_bytes_data_is_400_as_ragged_numbers_are(
    server: ServerProcess, data: list[object]
) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES", "data": data}]}
    status, reply = post(server, body, "identity_bytes")
    assert status == 400 and "is ragged" in reply["error"], reply


@pytest.mark.parametrize(
    "head",
    [
        b"FOO /v2/health/ready HTTP/1.1",  # a method httptools does not know
        b"get /v2/health/ready HTTP/1.1",  # methods are case-sensitive
        b"GET /v2/models/\xd9\xa1 HTTP/1.1",  # a raw non-ASCII byte in the target
    ],
)
def test_a_request_the_parser_refuses_is_a_json_400(server: ServerProcess, head: bytes) -> None:
    answer = _send_head(server, head)
    status_line, _, rest = answer.partition(b"\r\n")
    fields, _, body = rest.partition(b"\r\n\r\n")
    assert status_line == b"HTTP/1.1 400 Bad Request", answer
    assert b"content-type: application/json" in fields.lower(), answer
    assert json.loads(body) == {"error": "Invalid HTTP request received."}


def _send_head(server: ServerProcess, head: bytes) -> bytes:
    """``head`` as a request line with a minimal head; the whole answer."""
    return _send_raw(server, head + b"\r\nHost: x\r\nContent-Length: 0\r\n\r\n")


def _send_raw(server: ServerProcess, data: bytes) -> bytes:
    """``data`` on a connection of its own; the whole answer (the server closes after it)."""
    host, port = server.host_port.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(data)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_a_request_the_parser_refuses_is_not_a_warning(tmp_path: Path) -> None:
    """uvicorn logged a warning for each (found by fuzzing): any client may send them as
    often as it likes. One debug line each now; the server's own warnings still show."""
    shutil.copytree(SAMPLE_REPOSITORY / "simple", tmp_path / "simple")
    proc = ServerProcess(tmp_path, ["--log-level", "debug"]).wait_ready()
    try:
        for _ in range(3):
            assert _send_head(proc, b"FOO / HTTP/1.1").startswith(b"HTTP/1.1 400 ")
        assert wait_for(lambda: proc.log.count("a request head not parsed") == 3), proc.log
    finally:
        assert proc.stop() == 0, proc.log
    assert "Invalid HTTP request received." not in proc.log.replace(
        "a request head not parsed (answered and closed): Invalid HTTP request received.", ""
    ), proc.log


@pytest.mark.parametrize(
    ("coding", "status"),
    [
        (b"xchunked", 400),
        (b"gzip", 400),
        (b"chunked;x=1", 400),
        (b"gzip, chunked", 501),
        (b"identity, chunked", 200),
        (b"CHUNKED", 200),
    ],
)
def test_a_transfer_encoding_that_cannot_frame_the_body_is_refused(
    server: ServerProcess, coding: bytes, status: int
) -> None:
    """RFC 9112 6.3: a request whose last transfer coding is not chunked has no length:
    400 and close. llhttp read such a body to the connection's end (no answer; a pipelined
    request swallowed: found by fuzzing). A coding before chunked that the server does not
    apply is a 501. Each answer is the only one, and the connection closes after a refusal."""
    body = b"2\r\n{}\r\n0\r\n\r\n"
    request = (
        b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: " + coding + b"\r\n\r\n" + body
    )
    answer = _send_raw(server, request + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer
    assert answer.count(b"HTTP/1.1 ") == 1, answer  # closed after it (TE with Content-Length)
    if status != 200:
        assert b"content-type: application/json" in answer.lower(), answer


@pytest.mark.parametrize("case", list(CASES))
def test_bad_request_is_400_with_message(server: ServerProcess, case: str) -> None:
    body, status_expected, fragment = CASES[case]
    status, reply = post(server, body)
    assert status == status_expected, reply
    assert set(reply) == {"error"}
    assert fragment in reply["error"], reply["error"]


def test_value_not_representable_in_uint8(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "UINT8", "data": [300]}]}
    status, reply = post(server, body, "identity_uint8")
    assert status == 400 and "out of range for UINT8" in reply["error"]


def test_string_in_bytes_model_must_be_string(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "BYTES", "data": ["a", 1]}]}
    status, reply = post(server, body, "string_upper")
    assert status == 400 and "must hold strings" in reply["error"]


def test_float_overflow_in_fp16(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP16", "data": [1e6]}]}
    status, reply = post(server, body, "identity_fp16")
    assert status == 400 and "too large for FP16" in reply["error"]


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/v2/models/nope/infer", "Request for unknown model: 'nope' is not found"),
        (
            "/v2/models/simple/versions/7/infer",
            "Request for unknown model: 'simple' version 7 is not found",
        ),
        ("/v2/models/nope", "unknown model"),
        (
            "/v2/models/versioned/versions/3",
            "Request for unknown model: 'versioned' version 3 is not found",
        ),
    ],
)
def test_unknown_model_or_version_is_404(server: ServerProcess, path: str, fragment: str) -> None:
    method = "POST" if path.endswith("infer") else "GET"
    status, _, raw = request(server, method, path, json.dumps(simple_body()))
    assert status == 404
    assert fragment in json.loads(raw)["error"]


def test_unknown_route_and_method(server: ServerProcess) -> None:
    status, _, raw = request(server, "GET", "/v3/whatever")
    assert status == 404 and "error" in json.loads(raw)
    status, _, raw = request(server, "DELETE", "/v2/models/simple")
    assert status == 405 and "error" in json.loads(raw)


def test_server_still_serves_after_every_error(server: ServerProcess) -> None:
    for body, _, _ in CASES.values():
        post(server, body)
    status, reply = post(server, simple_body())
    assert status == 200, reply
    assert reply["outputs"][0]["data"] == [i + 1 for i in range(16)]


def test_body_above_limit_is_413_before_reading() -> None:
    proc = ServerProcess(args=["--max-request-bytes", "4096"]).wait_ready()
    try:
        big = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 2000], "datatype": "FP32", "data": [0.5] * 2000}
                ]
            }
        )
        status, reply = post(proc, big, "identity_fp32")
        assert status == 413 and "limit of 4096 bytes" in reply["error"]
        status, reply = post(proc, simple_body())
        assert status == 200, reply
    finally:
        assert proc.stop() == 0, proc.log


@pytest.mark.parametrize("line", [b"GET /v2/health/live", b"GET /v2/health/live HTTP/0.9"])
def test_a_request_without_http_1_is_a_json_505(server: ServerProcess, line: bytes) -> None:
    # (llhttp reads a request line without a version as HTTP/0.9; Falcon raised on it: a 500)
    answer = _send_raw(server, line + b"\r\n\r\n")
    status_line, _, rest = answer.partition(b"\r\n")
    fields, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.startswith(b"HTTP/1.1 505 "), answer
    assert b"content-type: application/json" in fields.lower(), answer
    assert "is not supported" in json.loads(body)["error"]
