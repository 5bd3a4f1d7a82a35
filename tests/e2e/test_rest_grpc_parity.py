"""One logical inference request over REST and gRPC: the same answer, Triton's where it has
one (found by fuzzing, 2026-11-30, twentieth session).

- Request parameters Triton's HTTP front refuses (``triton_`` keys, values that are not a
  string, number or boolean, badly typed sequence parameters on any model) were served over
  REST where gRPC refused them.
- Inputs with different batch sizes ran on a model without dynamic batching: ONNX Runtime
  broadcast one over the other's rows, a 200 with a wrong shape.
- ±Inf in gRPC's ``fp32_contents`` was refused as a value too large for FP32.
- A binary-extension input without ``binary_data_size`` took the body's last bytes,
  wherever it stood: two inputs silently swapped their data.
"""

from __future__ import annotations

import http.client
import json
import re

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tests.support.raw_http import post_json
from tests.support.server import ServerProcess

ROW = list(range(16))


def _simple(parameters: dict[str, object], rows: tuple[int, int] = (1, 1)) -> bytes:
    inputs = [
        {"name": name, "shape": [n, 16], "datatype": "INT32", "data": ROW * n}
        for name, n in zip(("INPUT0", "INPUT1"), rows, strict=True)
    ]
    return json.dumps({"inputs": inputs, "parameters": parameters}).encode()


def _grpc_simple(client: grpcclient.InferenceServerClient, rows: tuple[int, int]) -> None:
    inputs = []
    for name, n in zip(("INPUT0", "INPUT1"), rows, strict=True):
        tensor = grpcclient.InferInput(name, [n, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16 * n, dtype=np.int32).reshape(n, 16))
        inputs.append(tensor)
    client.infer("simple", inputs)


# ---- request parameters --------------------------------------------------------------

TRITON_KEY = "parameter keys starting with 'triton_' are reserved for Triton usage"


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"triton_foo": 1}, TRITON_KEY),
        ({"triton_": "x"}, TRITON_KEY),
        ({"triton_enable_empty_final_response": True}, TRITON_KEY),  # reserved over HTTP
        ({"custom": None}, "got `null` - at `$.parameters[...]`"),
        ({"custom": [1]}, "got `array` - at `$.parameters[...]`"),
        ({"sequence_start": "yes"}, "Unable to parse 'sequence_start'"),
        ({"sequence_end": 1}, "Unable to parse 'sequence_end'"),
        ({"sequence_id": 1.5}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": True}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": -1}, "Unable to parse 'sequence_id'"),
    ],
)
def test_rest_refuses_the_parameters_triton_refuses_on_any_model(
    server: ServerProcess, parameters: dict[str, object], words: str
) -> None:
    status, answer = post_json(server, "simple", _simple(parameters))
    assert status == 400 and words in str(answer["error"]), answer


def test_a_long_sequence_id_is_refused_on_any_model_over_both(
    server: ServerProcess, grpc_client: grpcclient.InferenceServerClient
) -> None:
    status, answer = post_json(server, "simple", _simple({"sequence_id": "s" * 129}))
    assert status == 501 and "cannot be longer than 128" in str(answer["error"]), answer
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(ROW)
    request.parameters["sequence_id"].string_param = "s" * 129
    with pytest.raises(grpc.RpcError) as info:
        grpc_client._client_stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "cannot be longer than 128" in str(info.value.details())


@pytest.mark.parametrize(
    "parameters",
    [
        {"custom": "text", "number": 7, "ratio": 0.5, "flag": False, "big": 2**63},
        {"sequence_id": "abc", "sequence_start": True, "sequence_end": True},
        {"sequence_id": 2**64 - 1, "binary_data_output": False, "priority": 1, "timeout": 10**7},
    ],
)
def test_rest_serves_the_parameters_triton_takes(
    server: ServerProcess, parameters: dict[str, object]
) -> None:
    """Sequence parameters on a model without sequence batching are checked, then ignored."""
    status, answer = post_json(server, "simple", _simple(parameters))
    assert status == 200, answer


# ---- batch sizes -----------------------------------------------------------------------

MISMATCH = (
    "[request id: <id_unknown>] input 'INPUT1' batch size does not match other inputs for 'simple'"
)


@pytest.mark.parametrize("rows", [(1, 2), (2, 1)])
def test_inputs_of_different_batch_sizes_are_refused_over_both(
    server: ServerProcess, grpc_client: grpcclient.InferenceServerClient, rows: tuple[int, int]
) -> None:
    status, answer = post_json(server, "simple", _simple({}, rows))
    assert (status, answer) == (400, {"error": MISMATCH})
    with pytest.raises(InferenceServerException, match=re.escape(MISMATCH)) as info:
        _grpc_simple(grpc_client, rows)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_dynamically_batched_model_refuses_them_in_the_same_words(server: ServerProcess) -> None:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [2, 4], "datatype": "FP32", "data": [0.0] * 8},
            {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]},
        ]
    }
    status, answer = post_json(server, "batched", json.dumps(body).encode())
    words = (
        "[request id: <id_unknown>] input 'TEXT' batch size does not match other inputs for "
        "'batched'"
    )
    assert (status, answer) == (400, {"error": words})


# ---- infinities in typed contents ---------------------------------------------------------


def test_infinities_in_fp32_contents_are_kept(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    values = [float("-inf"), 1.5, float("inf"), -2.0]
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend(values)
    reply = grpc_client._client_stub.ModelInfer(request)
    assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == values


def test_a_finite_value_beyond_fp32_is_still_refused(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 1e39]}]}
    status, answer = post_json(server, "identity_fp32", json.dumps(body).encode())
    assert status == 400 and "a value is too large for FP32" in str(answer["error"]), answer


# ---- the binary input without a size -------------------------------------------------------


def _binary_simple(server: ServerProcess, inputs: list[object], output: str, data: bytes) -> object:
    head = json.dumps({"inputs": inputs, "outputs": [{"name": output}]}).encode()
    connection = http.client.HTTPConnection(server.host_port, timeout=30)
    try:
        connection.request(
            "POST",
            "/v2/models/simple/infer",
            head + data,
            {"Inference-Header-Content-Length": str(len(head))},
        )
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == 200, answer
    (tensor,) = answer["outputs"]
    return tensor["data"]


@pytest.mark.parametrize("unsized", ["INPUT0", "INPUT1"])
def test_the_binary_input_without_a_size_takes_its_own_place(
    server: ServerProcess, unsized: str
) -> None:
    """Chunks follow the inputs' order: the input without ``binary_data_size`` gets the
    bytes between the others' (it got the body's last bytes, wherever it stood)."""
    first, second = np.arange(16, dtype=np.int32), np.full(16, 100, dtype=np.int32)
    inputs: list[object] = []
    for name in ("INPUT0", "INPUT1"):
        entry: dict[str, object] = {"name": name, "shape": [1, 16], "datatype": "INT32"}
        if name != unsized:
            entry["parameters"] = {"binary_data_size": 64}
        inputs.append(entry)
    data = first.tobytes() + second.tobytes()
    # OUTPUT1 = INPUT0 - INPUT1: which input got which bytes
    assert _binary_simple(server, inputs, "OUTPUT1", data) == (first - second).tolist()
    assert _binary_simple(server, inputs, "OUTPUT0", data) == (first + second).tolist()
