"""Health, metadata and JSON inference over real HTTP, with tritonclient and raw requests."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.http import request
from tests.support.server import ServerProcess
from tests.support.tensors import ROUND_TRIP


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    # NOTE: closed at teardown: the ExceptionInfo of a pytest.raises holds a test's frame,
    #   and so this client, in a cycle; left to the collector, it may be closed in another
    #   thread, where tritonclient's HTTP client fails (gevent).
    with httpclient.InferenceServerClient(server.host_port) as client:
        yield client


def test_health(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    status, _, body = request(server, "GET", "/v2/health/live")
    assert (status, json.loads(body)) == (200, {"live": True})
    status, _, body = request(server, "GET", "/v2/health/ready")
    assert (status, json.loads(body)) == (200, {"ready": True})


def test_server_metadata(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "oipserve"
    assert meta["extensions"] == [
        "binary_tensor_data",
        "classification",
        "model_configuration",
        "model_repository",
        "sequence",
        "statistics",
        "system_shared_memory",
    ]
    for path in ("/v2", "/v2/"):
        status, headers, body = request(server, "GET", path)
        assert status == 200 and json.loads(body) == meta
        assert headers["content-type"].startswith("application/json")


def test_model_metadata(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("simple")
    assert meta == {
        "name": "simple",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
    }
    assert client.get_model_metadata("versioned")["versions"] == ["1", "2"]
    assert client.get_model_metadata("versioned", "1")["versions"] == ["1"]


def test_model_ready(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple")
    assert client.is_model_ready("versioned", "2")
    status, _, body = request(server, "GET", "/v2/models/simple/versions/1/ready")
    assert status == 200 and json.loads(body) == {"name": "simple", "ready": True}
    status, _, body = request(server, "GET", "/v2/models/nope/ready")
    assert status == 404 and "nope" in json.loads(body)["error"]
    status, _, body = request(server, "GET", "/v2/models/simple/versions/9/ready")
    assert status == 404


def test_model_config(server: ServerProcess) -> None:
    status, _, body = request(server, "GET", "/v2/models/simple/config")
    config = json.loads(body)
    assert status == 200
    assert config["max_batch_size"] == 8
    assert config["input"][0] == {
        "name": "INPUT0",
        "data_type": "TYPE_INT32",
        "format": "FORMAT_NONE",
        "dims": [16],
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": False,
        "is_non_linear_format_io": False,
    }  # every field without presence, as Triton prints them


def test_simple_with_tritonclient(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=False)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    result = client.infer("simple", inputs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "req-7"
    assert response["model_name"] == "simple" and response["model_version"] == "1"


def test_outputs_selects_and_orders(server: ServerProcess) -> None:
    body = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [2, 16],
                "datatype": "INT32",
                "data": [[i for i in range(16)], [2 * i for i in range(16)]],
            },
            {"name": "INPUT1", "shape": [2, 16], "datatype": "INT32", "data": [1] * 32},
        ],
        "outputs": [{"name": "OUTPUT1"}],
    }
    status, _, raw = request(server, "POST", "/v2/models/simple/infer", json.dumps(body))
    reply = json.loads(raw)
    assert status == 200, reply
    assert [o["name"] for o in reply["outputs"]] == ["OUTPUT1"]
    assert reply["outputs"][0]["shape"] == [2, 16]
    assert reply["outputs"][0]["data"] == [i - 1 for i in range(16)] + [
        2 * i - 1 for i in range(16)
    ]
    assert "id" not in reply
    body["outputs"] = [{"name": "OUTPUT1"}, {"name": "OUTPUT0"}]
    reply = json.loads(request(server, "POST", "/v2/models/simple/infer", json.dumps(body))[2])
    assert [o["name"] for o in reply["outputs"]] == ["OUTPUT1", "OUTPUT0"]


def test_versions_answer_differently(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    data = np.array([1.0, 2.0], dtype=np.float32)
    answers = {}
    for version in ("1", "2", ""):
        inp = httpclient.InferInput("INPUT0", [2], "FP32")
        inp.set_data_from_numpy(data, binary_data=False)
        result = client.infer("versioned", [inp], model_version=version)
        answers[version] = result.as_numpy("OUTPUT0").tolist()
        assert result.get_response()["model_version"] == (version or "2")
    assert answers == {"1": [2.0, 3.0], "2": [3.0, 4.0], "": [3.0, 4.0]}


#: BF16 has no JSON form in tritonclient; it is covered in test_binary.py.
JSON_ROUND_TRIP = {k: v for k, v in ROUND_TRIP.items() if k != "BF16"}


@pytest.mark.parametrize("datatype", list(JSON_ROUND_TRIP))
def test_every_datatype_round_trips_as_json(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    data = JSON_ROUND_TRIP[datatype]
    inp = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=False)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    result = client.infer(f"identity_{datatype.lower()}", [inp], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    assert result.get_output("OUTPUT0")["datatype"] == datatype
    if datatype == "BYTES":
        assert [g.decode() if isinstance(g, bytes) else g for g in got.reshape(-1)] == list(
            data.reshape(-1)
        )
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


def test_bf16_json_round_trip(server: ServerProcess) -> None:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 3], "datatype": "BF16", "data": [1.0, -2.5, 0.5]}
        ]
    }
    status, _, raw = request(server, "POST", "/v2/models/identity_bf16/infer", json.dumps(body))
    assert status == 200, raw
    assert json.loads(raw)["outputs"][0]["data"] == [1.0, -2.5, 0.5]


def test_string_model(client: httpclient.InferenceServerClient) -> None:
    inp = httpclient.InferInput("INPUT0", [2], "BYTES")
    inp.set_data_from_numpy(np.array(["abc", "Hello"], dtype=object), binary_data=False)
    result = client.infer("string_upper", [inp])
    assert result.as_numpy("OUTPUT0").tolist() == [b"ABC", b"HELLO"]


def test_nested_and_flat_data_are_equivalent(server: ServerProcess) -> None:
    def call(data: list) -> list:
        body = {"inputs": [{"name": "INPUT0", "shape": [2, 2], "datatype": "FP32", "data": data}]}
        status, _, raw = request(server, "POST", "/v2/models/identity_fp32/infer", json.dumps(body))
        assert status == 200, raw
        return json.loads(raw)["outputs"][0]["data"]

    assert call([[1, 2], [3, 4]]) == call([1, 2, 3, 4]) == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("datatype", [d for d in JSON_ROUND_TRIP if d not in ("BYTES", "BOOL")])
def test_large_json_tensors_round_trip(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    # Bodies past wire.json_numbers.MIN_BODY take the simdjson path and a pooled receive.
    data = np.tile(JSON_ROUND_TRIP[datatype], (1, 12_000))
    inp = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=False)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    result = client.infer(f"identity_{datatype.lower()}", [inp], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    assert got.dtype == data.dtype
    np.testing.assert_array_equal(got, data)


def test_large_json_nested_ragged_and_bad_values(server: ServerProcess) -> None:
    rows = np.random.default_rng(3).standard_normal((64, 400)).astype(np.float32)

    def call(data: object, shape: list[int] = [64, 400]) -> tuple[int, dict]:  # noqa: B006
        body = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": data}]}
        text = json.dumps(body)
        assert len(text) > 64 * 1024
        status, _, raw = request(server, "POST", "/v2/models/identity_fp32/infer", text)
        return status, json.loads(raw)

    status, answer = call(rows.tolist())
    assert status == 200, answer
    np.testing.assert_array_equal(np.array(answer["outputs"][0]["data"], np.float32), rows.ravel())
    ragged = rows.tolist()
    ragged[1].append(ragged[0].pop())  # the same count, one row longer than another
    status, answer = call(ragged)
    assert status == 400 and "ragged" in answer["error"]
    hidden = rows.ravel().tolist()
    hidden[5] = [hidden[5]]  # an array among the numbers
    status, answer = call(hidden, [1, 64 * 400])
    assert status == 400 and "ragged" in answer["error"]
    too_big = rows.ravel().tolist()
    too_big[-1] = 1e39
    status, answer = call(too_big, [1, 64 * 400])
    assert status == 400 and "too large for FP32" in answer["error"]
    status, answer = call(rows.tolist())  # and it keeps serving
    assert status == 200


def test_values_onnxruntime_refuses_are_400_and_worker_keeps_serving(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    body = {
        "inputs": [
            {"name": "DATA", "shape": [6], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
            {"name": "SHAPE", "shape": [2], "datatype": "INT64", "data": [4, 4]},
        ]
    }
    status, _, raw = request(server, "POST", "/v2/models/reshape/infer", json.dumps(body))
    assert status == 400  # a Reshape target this request's data cannot take, as Triton
    assert "cannot be reshaped to the requested shape" in json.loads(raw)["error"]
    body["inputs"][1]["data"] = [2, 3]
    status, _, raw = request(server, "POST", "/v2/models/reshape/infer", json.dumps(body))
    assert status == 200, raw
    assert json.loads(raw)["outputs"][0]["shape"] == [2, 3]
    assert client.is_server_ready()


def test_tritonclient_error_surface(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'missing' is not found"
    ):
        client.get_model_metadata("missing")
