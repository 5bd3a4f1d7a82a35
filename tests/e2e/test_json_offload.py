"""Issue #18, no loop stall: large JSON bodies are parsed and decoded by a worker.

A 40 MB JSON body took the front ~35 ms to check and ~130 ms to decode, all on the
event loop: every other client waited. Bodies of ``json_offload.PARSE_MIN`` bytes or
more are now read by one of the model's workers (``oipserve.request.json_offload``). These
tests check that the answers are the same as when the front reads a body (results,
and the words of every error), for batched and unbatched models, and that the loop
keeps answering while large bodies are read.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import signal
import socket
import threading
import zlib
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from oipserve.errors import InvalidInput
from oipserve.request.json_offload import DECODE_MIN, PARSE_MIN
from oipserve.request.tensors import array_from_values, decode_data
from oipserve.wire.datatypes import bf16_to_float32, float32_to_bf16
from oipserve.wire.json_request import decode_request
from oipserve.wire.messages import TEXT_OUTPUT_MIN
from tests.support.loop_checks import cpu_seconds_of, held_bound, most_loop_cpu_while
from tests.support.raw_http import json_infer, post_json, read_response
from tests.support.server import ServerProcess, shm_entries, steadily, wait_for
from tests.support.sockets import read_by_peer


def _body(data_text: str, shape: list[int], datatype: str, **extra: object) -> bytes:
    tensor = {"name": "INPUT0", "shape": shape, "datatype": datatype, "data": "@DATA@"}
    request = {"inputs": [tensor], **extra}
    return json.dumps(request).replace('"@DATA@"', data_text).encode()


def _large_json_body(values: np.ndarray) -> bytes:
    """identity_fp32's JSON request for ``values`` (flat), its output asked for as binary.

    The text is json.dumps(values.tolist())'s (each float32 printed as the double it is),
    made by orjson: json took ~0.75 s of this process's CPU a million values.
    """
    text = orjson.dumps(values.astype(np.float64), option=orjson.OPT_SERIALIZE_NUMPY)
    data = text.decode().replace(",", ", ")
    return _body(data, [1, values.size], "FP32", parameters={"binary_data_output": True})


def _front_error(body: bytes) -> str | None:
    """What the front says of ``body`` when it reads it itself (None: it is fine)."""
    try:
        request = decode_request(body)
    except ValueError as exc:
        return str(exc)
    for tensor in request.inputs:
        count = int(np.prod(tensor.shape))
        try:
            values = decode_data(tensor.name, tensor.datatype, tensor.data)
            array_from_values(tensor.name, tensor.datatype, values, count)
        except InvalidInput as exc:
            return exc.message
    return None


@pytest.mark.parametrize(
    "datatype, values",
    [
        ("FP32", np.linspace(-3, 3, 160_000, dtype=np.float32).reshape(400, 400)),
        ("INT8", (np.arange(600_000) % 256 - 128).astype(np.int8).reshape(1000, 600)),
        ("UINT64", np.array([0, 2**64 - 1] * 100_000, dtype=np.uint64).reshape(2, 100_000)),
        ("BOOL", (np.arange(300_000) % 3 == 0).reshape(300, 1000)),
        ("FP16", np.linspace(-60000, 60000, 300_000).astype(np.float16).reshape(3, 100_000)),
    ],
)
def test_a_large_body_gives_the_same_tensor(
    server: ServerProcess, datatype: str, values: np.ndarray
) -> None:
    body = _body(json.dumps(values.tolist()), list(values.shape), datatype)
    assert len(body) >= PARSE_MIN
    status, answer = post_json(server, f"identity_{datatype.lower()}", body)
    assert status == 200, answer
    (output,) = answer["outputs"]  # type: ignore[misc]
    assert output["shape"] == list(values.shape)
    got = np.array(output["data"], dtype=values.dtype).reshape(values.shape)
    np.testing.assert_array_equal(got, values)


def _large_rows(rows: int, row: str) -> str:
    return "[" + ",".join([row] * rows) + "]"


# Each body is over PARSE_MIN; the front's own words for it are the expected answer.
BAD_BODIES = {
    "truncated JSON": _body(_large_rows(150_000, "[1.5,2.5]"), [150_000, 2], "FP32")[:-3],
    "not an inference request": _body(
        _large_rows(150_000, "[1.5,2.5]"), [150_000, 2], "FP32"
    ).replace(b'"shape"', b'"shapes"'),
    "a string among numbers": _body(
        _large_rows(150_000, "[1.5,2.5]")[:-1] + ',["x", 1]]', [150_001, 2], "FP32"
    ),
    "out of range": _body(_large_rows(200_000, "[1,2]")[:-1] + ",[1,300]]", [200_001, 2], "INT8"),
    "ragged": _body(_large_rows(200_000, "[1,2]")[:-1] + ",[1]]", [200_001, 2], "INT32"),
    "fewer elements than the shape": _body(_large_rows(200_000, "[1,2]"), [200_000, 3], "INT32"),
    "too large for FP16": _body(_large_rows(200_000, "[1,70000]"), [200_000, 2], "FP16"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_errors_are_the_words_the_front_uses(server: ServerProcess, case: str) -> None:
    body = BAD_BODIES[case]
    assert len(body) >= PARSE_MIN
    expected = _front_error(body)
    assert expected is not None
    datatype = "FP32" if b'"FP32"' in body else "INT8" if b'"INT8"' in body else "INT32"
    datatype = "FP16" if b'"FP16"' in body else datatype
    pids = server.worker_pids()
    status, answer = post_json(server, f"identity_{datatype.lower()}", body)
    assert (status, answer) == (400, {"error": expected})
    assert server.worker_pids() == pids  # nothing crashed
    small = _body("[[1,2]]", [1, 2], datatype)
    assert post_json(server, f"identity_{datatype.lower()}", small)[0] == 200


def test_a_batched_model_takes_a_large_body(server: ServerProcess) -> None:
    # NOTE: ``batched`` takes 4 floats a row; blanks make the data text large enough to
    #   be decoded by a worker (JSON allows any whitespace between values).
    rows = [[float(r), r + 0.5, -r, 2.0**r] for r in range(4)]
    data = json.dumps(rows).replace(",", "," + " " * (DECODE_MIN // 12))
    text = {"name": "TEXT", "shape": [4, 1], "datatype": "BYTES", "data": ["a", "b", "c", "d"]}
    request = {
        "inputs": [{"name": "INPUT0", "shape": [4, 4], "datatype": "FP32", "data": "@DATA@"}, text],
        "id": "x" * PARSE_MIN,
    }
    body = json.dumps(request).replace('"@DATA@"', data).encode()
    status, answer = post_json(server, "batched", body)
    assert status == 200, answer
    assert answer["id"] == "x" * PARSE_MIN
    outputs = {o["name"]: o for o in answer["outputs"]}  # type: ignore[union-attr]
    np.testing.assert_array_equal(
        np.array(outputs["OUTPUT0"]["data"]).reshape(4, 4), np.array(rows, dtype=np.float32) + 1
    )


def test_the_loop_keeps_answering_while_large_bodies_are_read(server: ServerProcess) -> None:
    values = np.random.default_rng(0).random(4_000_000, dtype=np.float32)
    body = _large_json_body(values)  # ~80 MB: ~0.25 s of the front's loop when it read one
    statuses: list[int] = []

    def send() -> None:
        for _ in range(2):
            connection = http.client.HTTPConnection(server.host_port, timeout=120)
            connection.request("POST", "/v2/models/identity_fp32/infer", body)
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
            connection.close()

    held = most_loop_cpu_while(server, [threading.Thread(target=send) for _ in range(2)])
    assert statuses == [200] * 4
    # NOTE: the front read such a body in ~0.25 s of its loop at once; its loop now spends
    #   a few ms between a probe's arrival and its answer (the CPU of its reading, the
    #   same code as the front's, is timed here).
    reading = cpu_seconds_of(lambda: _front_error(body), times=1)
    assert held < held_bound(reading), (
        f"a probe waited while the front's loop spent {held * 1e3:.0f} ms of CPU "
        f"(reading one body costs {reading * 1e3:.0f} ms)"
    )


def _binary_input(server: ServerProcess, values: np.ndarray, **output: object) -> dict:
    """identity_fp32 sent ``values`` as binary data, its output asked for as JSON."""
    client = httpclient.InferenceServerClient(server.host_port, network_timeout=120)
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=True)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    result = client.infer("identity_fp32", [tensor], outputs=[wanted], **output)
    return result.get_response()


@pytest.mark.parametrize("size", [1000, TEXT_OUTPUT_MIN // 4, 1_000_000])
def test_a_large_json_output_is_the_text_the_front_would_print(
    server: ServerProcess, size: int
) -> None:
    values = np.random.default_rng(size).standard_normal((1, size)).astype(np.float32)
    (output,) = _binary_input(server, values)["outputs"]
    assert output["shape"] == [1, size]
    np.testing.assert_array_equal(np.array(output["data"], dtype=np.float32), values.ravel())
    printed = orjson.dumps(values.ravel(), option=orjson.OPT_SERIALIZE_NUMPY)
    assert output["data"] == json.loads(printed)  # the same shortest float32 forms


def _binary_request(values: np.ndarray, headers: dict[str, str] | None = None) -> tuple:
    """A raw identity_fp32 request with ``values`` as binary data, its output as JSON."""
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": list(values.shape),
                "datatype": "FP32",
                "parameters": {"binary_data_size": values.nbytes},
            }
        ]
    }
    text = json.dumps(header).encode()
    fields = {"Inference-Header-Content-Length": str(len(text)), **(headers or {})}
    return "/v2/models/identity_fp32/infer", text + values.tobytes(), fields


def _raw_post(server: ServerProcess, request: tuple) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(server.host_port, timeout=120)
    try:
        connection.request("POST", *request)
        response = connection.getresponse()
        fields = {name.lower(): value for name, value in response.getheaders()}
        return response.status, fields, response.read()
    finally:
        connection.close()


def test_a_large_json_output_compressed(server: ServerProcess) -> None:
    values = np.arange(300_000, dtype=np.float32).reshape(1, -1)
    status, headers, raw = _raw_post(server, _binary_request(values, {"Accept-Encoding": "gzip"}))
    assert status == 200
    assert headers["content-encoding"] == "gzip"
    (output,) = json.loads(gzip.decompress(raw))["outputs"]
    np.testing.assert_array_equal(np.array(output["data"], dtype=np.float32), values.ravel())


def _held_while_printing(server: ServerProcess, values: np.ndarray) -> float:
    """``most_loop_cpu_while`` two clients each get ``values`` back as JSON twice."""
    request = _binary_request(values)
    answers: list[tuple[int, dict[str, str], bytes]] = []

    def send() -> None:
        # NOTE: responses are parsed after the probe: parsing holds this process's GIL.
        answers.extend(_raw_post(server, request) for _ in range(2))

    held = most_loop_cpu_while(server, [threading.Thread(target=send) for _ in range(2)])
    assert [status for status, _, _ in answers] == [200] * 4, answers[0][2][:200]
    (output,) = orjson.loads(answers[0][2])["outputs"]
    np.testing.assert_array_equal(np.array(output["data"], dtype=np.float32), values.ravel())
    return held


def test_the_loop_keeps_answering_while_large_outputs_are_printed(server: ServerProcess) -> None:
    values = np.random.default_rng(1).random((1, 4_000_000), dtype=np.float32)
    held = _held_while_printing(server, values)
    # NOTE: the front printed 4 M floats in ~100 ms of its loop; now the worker does.
    printing = cpu_seconds_of(lambda: orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY))
    assert held < held_bound(printing), (
        f"a probe waited while the front's loop spent {held * 1e3:.0f} ms of CPU "
        f"(printing one output costs {printing * 1e3:.0f} ms)"
    )


@pytest.mark.parametrize("encoding", ["gzip", "chunked"])
def test_compressed_and_chunked_large_bodies_are_read_by_a_worker(
    server: ServerProcess, encoding: str
) -> None:
    values = np.random.default_rng(2).random(3_000_000, dtype=np.float32)
    text = _large_json_body(values)
    headers = {"Content-Type": "application/json"}
    if encoding == "gzip":
        body: object = gzip.compress(text, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    else:
        body = (text[i : i + (1 << 20)] for i in range(0, len(text), 1 << 20))
        headers["Transfer-Encoding"] = "chunked"
    answers: list[tuple[int, int, bytes]] = []

    def send() -> None:
        # NOTE: the answer is checked after the probe: comparing 12 MB of floats holds this
        #   process's GIL, which the probe thread would wait for and count as a stall.
        connection = http.client.HTTPConnection(server.host_port, timeout=120)
        connection.request(
            "POST",
            "/v2/models/identity_fp32/infer",
            body,  # type: ignore[arg-type]
            headers,
            encode_chunked=encoding == "chunked",
        )
        response = connection.getresponse()
        size = int(response.getheader("Inference-Header-Content-Length", "0"))
        answers.append((response.status, size, response.read()))
        connection.close()

    held = most_loop_cpu_while(server, [threading.Thread(target=send)])
    ((status, size, payload),) = answers
    assert status == 200
    np.testing.assert_array_equal(np.frombuffer(payload[size:], dtype=np.float32), values)
    # NOTE: parsing 60 MB of JSON in the front took ~0.2 s of its loop.
    reading = cpu_seconds_of(lambda: _front_error(text), times=1)
    assert held < held_bound(reading), (
        f"a probe waited while the front's loop spent {held * 1e3:.0f} ms of CPU "
        f"(reading the body costs {reading * 1e3:.0f} ms)"
    )


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_the_loop_keeps_answering_while_a_large_response_is_compressed(
    server: ServerProcess, encoding: str
) -> None:
    values = np.random.default_rng(3).random((1, 1_000_000), dtype=np.float32)
    request = _binary_request(values, {"Accept-Encoding": encoding})
    answers: list[tuple[int, dict[str, str], bytes]] = []

    def send() -> None:
        answers.append(_raw_post(server, request))

    held = most_loop_cpu_while(server, [threading.Thread(target=send)])
    ((status, headers, body),) = answers
    assert status == 200
    assert headers["content-encoding"] == encoding
    raw = zlib.decompress(body, 31 if encoding == "gzip" else 15)
    (output,) = orjson.loads(raw)["outputs"]
    np.testing.assert_array_equal(np.array(output["data"], dtype=np.float32), values.ravel())
    # NOTE: zlib compresses JSON text at ~20 MB/s here: 10 MB took ~0.5 s of the loop at
    #   once. Its steps now run in threads, whose CPU is not the loop thread's. (Half of
    #   the text is compressed here: the bound is half of the whole's cost.)
    half = cpu_seconds_of(lambda: zlib.compress(raw[: len(raw) // 2], 6), times=1)
    assert held < held_bound(half, share=1.0), (
        f"a probe waited while the front's loop spent {held * 1e3:.0f} ms of CPU "
        f"(compressing half the response costs {half * 1e3:.0f} ms)"
    )


def _json_output(server: ServerProcess, model: str, tensor: httpclient.InferInput) -> list:
    client = httpclient.InferenceServerClient(server.host_port, network_timeout=120)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    return client.infer(model, [tensor], outputs=[wanted]).get_response()["outputs"][0]["data"]


def test_a_large_bytes_output_is_printed_as_the_front_prints_it(server: ServerProcess) -> None:
    strings = [f"row {i} é✓".encode() for i in range(40_000)]
    tensor = httpclient.InferInput("INPUT0", [1, len(strings)], "BYTES")
    tensor.set_data_from_numpy(np.array([strings], dtype=object), binary_data=True)
    assert sum(4 + len(s) for s in strings) >= TEXT_OUTPUT_MIN
    data = _json_output(server, "identity_bytes", tensor)
    assert data == [s.decode("utf-8", "replace") for s in strings]


def test_a_large_bf16_output_is_printed_as_the_front_prints_it(server: ServerProcess) -> None:
    values = np.linspace(-1000, 1000, 200_000, dtype=np.float32).reshape(1, -1)
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "BF16")
    tensor.set_data_from_numpy(values.astype(ml_dtypes.bfloat16), binary_data=True)
    assert values.size * 2 >= TEXT_OUTPUT_MIN
    data = _json_output(server, "identity_bf16", tensor)
    expected = bf16_to_float32(float32_to_bf16(values.ravel()))
    np.testing.assert_array_equal(np.array(data, dtype=np.float32), expected)


@pytest.fixture(scope="module")
def batched_server() -> Iterator[ServerProcess]:
    """identity_fp32 with dynamic batching: its outputs are split, and printed, in the front."""
    proc = ServerProcess(
        args=["--model-control-mode", "explicit", "--load-model", "identity_fp32"]
    ).wait_ready()
    config = {
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "dynamic_batching": {},
    }
    client = httpclient.InferenceServerClient(proc.host_port)
    client.load_model("identity_fp32", config=json.dumps(config))
    yield proc
    assert proc.stop() == 0, proc.log


def test_large_outputs_the_front_prints_are_printed_a_step_at_a_time(
    batched_server: ServerProcess,
) -> None:
    values = np.random.default_rng(4).random((1, 8_000_000), dtype=np.float32)
    # NOTE: orjson printed 8 M floats in ~200 ms of the loop at once (each response's
    #   output); in steps, the loop is given back every ~1.5 ms.
    printing = cpu_seconds_of(lambda: orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY))
    held = _held_while_printing(batched_server, values)
    assert held < held_bound(printing), (
        f"a probe waited while the front's loop spent {held * 1e3:.0f} ms of CPU "
        f"(printing one output costs {printing * 1e3:.0f} ms)"
    )


def test_a_worker_killed_while_it_reads_a_body(batched_server: ServerProcess) -> None:
    """503 for that request, nothing leaked, and the replacement reads the next body."""
    server = batched_server
    body = _large_json_body(np.arange(400_000, dtype=np.float32))

    def inputs() -> set[str]:
        return {n for n in shm_entries(server.process.pid) if "-in-" in n}

    before = inputs()
    (worker,) = server.worker_pids()
    os.kill(worker, signal.SIGSTOP)  # the body's ParseJson waits for it
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(json_infer("identity_fp32", body))
        # The front has read the whole body, on several polls in a row: its handler has
        #   had the time to hand it to the stopped worker to parse.
        assert wait_for(steadily(lambda: read_by_peer(sock)), 10)
        os.kill(worker, signal.SIGKILL)
        status, _, raw = read_response(sock)
    answer = json.loads(raw)
    assert status == 503, answer
    assert "stopped while handling this request" in str(answer["error"])
    assert wait_for(lambda: server.worker_pids() not in ([], [worker]))
    again = ("/v2/models/identity_fp32/infer", body, {})
    assert wait_for(lambda: _raw_post(server, again)[0] == 200, timeout=60)
    # The killed request's body lease went back to the pool: its body and its decoded
    #   tensor need at most two new input segments, request after request (a leaked
    #   lease would make the next body take a third).
    for _ in range(2):
        assert _raw_post(server, again)[0] == 200
        assert len(inputs() - before) <= 2, inputs() - before
