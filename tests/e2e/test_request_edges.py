"""Edges of the REST request format (issue #35, row 12), against the session server.

- ``priority`` (and ``timeout``) beyond what gRPC's types can carry: a 400 over REST, so
  both fronts accept the same values.
- NaN and ±Inf outputs: ``null`` in JSON (strict JSON has no token for them), the bits
  kept in binary and over gRPC (docs/protocol.md).
- A lone UTF-16 surrogate escape in a JSON string: a 400 that says so, not "Input data
  was truncated", on both the front's parse and a worker's (large bodies).
- ``Inference-Header-Content-Length`` equal to the body's length: served when the body
  is one JSON request, else a message that says what the header length should be.
"""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.raw_http import post_json
from tests.support.server import ServerProcess

SIMPLE_INPUTS = [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
]


def _simple(parameters: dict[str, object]) -> bytes:
    return json.dumps({"inputs": SIMPLE_INPUTS, "parameters": parameters}).encode()


# ---- priority and timeout -------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"priority": 2**64}, "unsigned 64-bit"),
        ({"priority": 10**30}, "unsigned 64-bit"),
        ({"priority": -1}, "unsigned 64-bit"),
        ({"timeout": 2**63}, "64-bit integer of microseconds"),
        ({"timeout": 10**40}, "64-bit integer of microseconds"),
    ],
)
def test_schedule_parameters_past_their_grpc_range_are_refused(
    server: ServerProcess, parameters: dict[str, object], words: str
) -> None:
    status, answer = post_json(server, "simple", _simple(parameters))
    assert status == 400, answer
    error = str(answer["error"])
    key = next(iter(parameters))
    assert f"parameter '{key}'" in error and words in error, error


def test_the_largest_priority_is_served_on_both_fronts(server: ServerProcess) -> None:
    top = 2**64 - 1
    for model in ("simple", "batched"):
        inputs = (
            SIMPLE_INPUTS
            if model == "simple"
            else [
                {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["t"]},
            ]
        )
        body = json.dumps(
            {"inputs": inputs, "parameters": {"priority": top, "timeout": 2**63 - 1}}
        ).encode()
        status, answer = post_json(server, model, body)
        assert status == 200, (model, answer)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensors = []
        for spec in SIMPLE_INPUTS:
            tensor = grpcclient.InferInput(str(spec["name"]), [1, 16], "INT32")
            tensor.set_data_from_numpy(np.array([spec["data"]], dtype=np.int32))
            tensors.append(tensor)
        client.infer("simple", tensors, priority=top)  # uint64_param
    finally:
        client.close()


# ---- NaN and infinities in outputs ----------------------------------------------------


def _refuse_constant(name: str) -> object:
    raise AssertionError(f"not strict JSON: {name}")


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
@pytest.mark.parametrize("elements", [4, 70_000])  # 70,000 FP32: printed by the worker
def test_nan_and_infinities_are_null_in_json_and_kept_in_binary(
    server: ServerProcess, datatype: str, elements: int
) -> None:
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
    values = np.ones((1, elements), dtype=dtype)
    values[0, :4] = [np.nan, np.inf, -np.inf, 1.5]
    model = f"identity_{datatype.lower()}"
    tensor = httpclient.InferInput("INPUT0", list(values.shape), datatype)
    tensor.set_data_from_numpy(values, binary_data=True)
    client = httpclient.InferenceServerClient(server.host_port)
    try:
        as_json = client.infer(
            model, [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
        )
        binary = client.infer(
            model, [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
        )
    finally:
        client.close()
    # null in their place (tritonclient's json.loads would turn NaN tokens into floats).
    data = as_json.get_response()["outputs"][0]["data"]
    assert data[:4] == [None, None, None, 1.5], data[:4]
    assert len(data) == elements and None not in data[4:]
    kept = binary.as_numpy("OUTPUT0")
    assert np.isnan(kept[0, 0]) and np.isposinf(kept[0, 1]) and np.isneginf(kept[0, 2])
    assert kept[0, 3] == 1.5
    rpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", list(values.shape), datatype)
        tensor.set_data_from_numpy(values)
        over_grpc = rpc.infer(model, [tensor]).as_numpy("OUTPUT0")
    finally:
        rpc.close()
    assert np.isnan(over_grpc[0, 0]) and np.isposinf(over_grpc[0, 1])
    assert np.isneginf(over_grpc[0, 2])


def test_strict_json_body_has_no_nan_token(server: ServerProcess) -> None:
    """The raw response text, parsed by a parser that refuses NaN/Infinity tokens."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 12},
                }
            ]
        }
    ).encode()
    body = header + np.array([np.nan, np.inf, -np.inf], dtype=np.float32).tobytes()
    connection = http.client.HTTPConnection(server.host_port, timeout=60)
    try:
        connection.request(
            "POST",
            "/v2/models/identity_fp32/infer",
            body,
            {"Inference-Header-Content-Length": str(len(header))},
        )
        response = connection.getresponse()
        text = response.read()
    finally:
        connection.close()
    assert response.status == 200, text
    answer = json.loads(text, parse_constant=_refuse_constant)
    assert answer["outputs"][0]["data"] == [None, None, None]


# ---- unpaired surrogates ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "body"),
    [
        ("simple", b'{"id": "\\ud800", "inputs": []}'),
        ("simple", b'{"inputs": [], "parameters": {"tag": "a\\ud800b"}}'),
        (
            "identity_bytes",
            b'{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES", '
            b'"data": ["fine", "\\udc00"]}]}',
        ),
        (
            "identity_bytes",
            b'{"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES", '
            b'"data": ["\\uD83D\\u0041"]}]}',
        ),
    ],
)
def test_an_unpaired_surrogate_is_named_not_called_truncated(
    server: ServerProcess, model: str, body: bytes
) -> None:
    status, answer = post_json(server, model, body)
    assert status == 400, answer
    error = str(answer["error"])
    assert "unpaired UTF-16 surrogate" in error and "truncated" not in error, error


def test_an_unpaired_surrogate_in_a_body_a_worker_parses(server: ServerProcess) -> None:
    """A body over 1 MiB is parsed by a worker (json_offload): the same message."""
    values = [1.5] * 300_000
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, len(values)], "datatype": "FP32",
                     "data": values}]}
    ).encode()  # fmt: skip
    body = body[:-1] + b', "id": "\\ud800"}'
    assert len(body) > 1024 * 1024
    status, answer = post_json(server, "identity_fp32", body)
    assert status == 400, answer
    error = str(answer["error"])
    assert "unpaired UTF-16 surrogate" in error and "truncated" not in error, error


def test_a_surrogate_pair_is_text(server: ServerProcess) -> None:
    body = (
        b'{"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES", '
        b'"data": ["\\ud83d\\ude00"]}]}'
    )
    status, answer = post_json(server, "identity_bytes", body)
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == ["\U0001f600"]  # type: ignore[index]


# ---- Inference-Header-Content-Length --------------------------------------------------


def _post(server: ServerProcess, body: bytes, header_length: int) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(server.host_port, timeout=60)
    try:
        connection.request(
            "POST",
            "/v2/models/simple/infer",
            body,
            {"Inference-Header-Content-Length": str(header_length)},
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _binary_request() -> tuple[bytes, bytes]:
    """(JSON header, binary data) of ``simple`` with INPUT0 in binary."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 64},
                },
                SIMPLE_INPUTS[1],
            ]
        }
    ).encode()
    return header, np.arange(16, dtype=np.int32).tobytes()


def test_header_length_of_the_whole_body_that_is_all_json_is_served(
    server: ServerProcess,
) -> None:
    body = json.dumps({"inputs": SIMPLE_INPUTS}).encode()
    status, answer = _post(server, body, len(body))
    assert status == 200, answer


@pytest.mark.parametrize("extra", [None, 10])  # the whole body; 10 bytes into the data
def test_header_length_past_the_json_says_where_the_json_ends(
    server: ServerProcess, extra: int | None
) -> None:
    header, data = _binary_request()
    body = header + data
    length = len(body) if extra is None else len(header) + extra
    status, answer = _post(server, body, length)
    assert status == 400, answer
    error = answer["error"]
    assert "trailing characters" not in error, error
    assert f"ends before byte {len(header)}" in error, error
    assert f"must be the length of the JSON header alone (here probably {len(header)})" in error
    assert ("(the whole body)" in error) == (extra is None), error


def test_header_length_of_the_whole_body_with_binary_inputs_declared(
    server: ServerProcess,
) -> None:
    header, _ = _binary_request()
    status, answer = _post(server, header, len(header))
    assert status == 400, answer
    error = answer["error"]
    assert "binary_data_size of input 'INPUT0' is 64" in error, error
    assert "whole body's length" in error, error
