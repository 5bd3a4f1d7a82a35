"""config.pbtxt over a real server: reshape, optional inputs, version_policy, the config
response, and fields that are refused or ignored with a warning."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import ALL_OPTIONAL_DEFAULTS, write_all_optional_repository
from tests.support.sequence_models import ACCUMULATE, write_accumulate
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

SCALE = np.array([[1, 0], [0, 2]], dtype=np.float32)
DEFAULT_BIAS = np.array([[10, 20], [30, 40]], dtype=np.float32)


def _expected(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return (x.reshape(-1, 2, 2) @ SCALE + bias).reshape(-1, 4)


def test_reshape_and_optional_input_over_http(http: httpclient.InferenceServerClient) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    given = httpclient.InferInput("X", [3, 4], "FP32")
    given.set_data_from_numpy(x)
    result = http.infer("reshape_optional", [given])  # BIAS left out: the graph's default
    assert result.get_output("Y")["shape"] == [3, 4]
    np.testing.assert_array_equal(result.as_numpy("Y"), _expected(x, DEFAULT_BIAS))

    bias = np.full((3, 2, 2), -1, dtype=np.float32)
    extra = httpclient.InferInput("BIAS", [3, 2, 2], "FP32")
    extra.set_data_from_numpy(bias, binary_data=False)
    result = http.infer("reshape_optional", [given, extra])
    np.testing.assert_array_equal(result.as_numpy("Y"), _expected(x, bias))


def test_reshape_and_optional_input_over_grpc(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    given = grpcclient.InferInput("X", [1, 4], "FP32")
    given.set_data_from_numpy(x)
    result = grpc_client.infer("reshape_optional", [given])
    np.testing.assert_array_equal(result.as_numpy("Y"), _expected(x, DEFAULT_BIAS))


def test_request_is_checked_against_dims_not_reshape(
    http: httpclient.InferenceServerClient,
) -> None:
    given = httpclient.InferInput("X", [1, 2, 2], "FP32")
    given.set_data_from_numpy(np.ones((1, 2, 2), dtype=np.float32))
    with pytest.raises(InferenceServerException, match=r"Expected \[-1,4\], got \[1,2,2\]"):
        http.infer("reshape_optional", [given])
    bias = httpclient.InferInput("BIAS", [1, 2, 2], "FP32")
    bias.set_data_from_numpy(np.ones((1, 2, 2), dtype=np.float32))
    # (BIAS optional: Triton's words for a range of inputs)
    with pytest.raises(
        InferenceServerException,
        match=r"expected number of inputs between 1 and 2 but got 1 inputs for model "
        r"'reshape_optional'. Got input\(s\) \['BIAS'\], but missing required input\(s\) "
        r"\['X'\]",
    ):
        http.infer("reshape_optional", [bias])


def test_a_model_whose_inputs_are_all_optional_runs_with_none(tmp_path: Path) -> None:
    """As Triton runs one (core's ValidateRequestInputs: 0 inputs, 0 required; its QA test
    input_all_optional): REST and gRPC. It was refused ('inputs' must list at least one
    input). A model that batches takes its batch size from its inputs: refused there."""
    write_all_optional_repository(tmp_path, "all_optional", 0)
    write_all_optional_repository(tmp_path, "all_optional_queued", 0, "dynamic_batching { }")
    write_all_optional_repository(tmp_path, "all_optional_batched", 4)
    proc = ServerProcess(tmp_path).wait_ready()
    defaults = {
        name: np.array(values, np.float32) for name, values in ALL_OPTIONAL_DEFAULTS.items()
    }
    try:
        http = httpclient.InferenceServerClient(proc.host_port)
        rpc = grpcclient.InferenceServerClient(proc.grpc_url)
        for client in (http, rpc):
            for model in ("all_optional", "all_optional_queued"):  # (alone; its batcher)
                result = client.infer(model, [])
                np.testing.assert_array_equal(result.as_numpy("Y"), defaults["A"] + defaults["B"])
        given = httpclient.InferInput("A", [2], "FP32")
        given.set_data_from_numpy(np.array([5, 5], np.float32))
        result = http.infer("all_optional", [given])
        np.testing.assert_array_equal(result.as_numpy("Y"), 5 + defaults["B"])
        for client in (http, rpc):
            with pytest.raises(InferenceServerException) as info:
                client.infer("all_optional_batched", [])
            assert "must give at least one of its inputs: the model batches" in str(
                info.value.message()
            ), info.value
            assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        http.close()
        rpc.close()
    finally:
        assert proc.stop() == 0, proc.log


def test_metadata_and_config_show_what_clients_send(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    meta = http.get_model_metadata("reshape_optional")
    assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [
        ("X", [-1, 4]),
        ("BIAS", [-1, 2, 2]),
    ]
    assert [(t["name"], t["shape"]) for t in meta["outputs"]] == [("Y", [-1, 4])]
    config = http.get_model_config("reshape_optional")
    # Every field without presence, at its default too, as Triton prints them.
    unset = {"format": "FORMAT_NONE", "is_shape_tensor": False, "allow_ragged_batch": False}
    unset |= {"optional": False, "is_non_linear_format_io": False}
    assert config["input"] == [
        {**unset, "name": "X", "data_type": "TYPE_FP32", "dims": [4], "reshape": {"shape": [2, 2]}},
        {**unset, "name": "BIAS", "data_type": "TYPE_FP32", "dims": [2, 2], "optional": True},
    ]
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    message = grpc_client.get_model_config("reshape_optional").config
    assert list(message.input[0].reshape.shape) == [2, 2] and message.input[1].optional
    versioned = http.get_model_config("versioned")
    assert versioned["version_policy"] == {"all": {}}


def test_policies_warnings_and_refusals(tmp_path: Path) -> None:
    shutil.copytree(SAMPLE_REPOSITORY / "versioned", tmp_path / "latest")
    (tmp_path / "latest" / "config.pbtxt").write_text('model_warmup { name: "w" }\n')
    shutil.copytree(SAMPLE_REPOSITORY / "versioned", tmp_path / "stateful")
    (tmp_path / "stateful" / "config.pbtxt").write_text(
        "sequence_batching { iterative_sequence: true }\n"
    )
    shutil.copytree(SAMPLE_REPOSITORY / "reshape_optional", tmp_path / "required")
    config = (tmp_path / "required" / "config.pbtxt").read_text()
    config = config.replace('name: "reshape_optional"', "").replace(
        '"X"', '"X"\n    optional: true'
    )
    (tmp_path / "required" / "config.pbtxt").write_text(config)
    proc = ServerProcess(tmp_path).wait_ready()
    try:
        # NOTE: closed by the with: the exception pytest.raises caught holds this frame in a
        #   cycle, and a client left to the collector may be closed in another thread,
        #   where tritonclient's HTTP client fails (gevent).
        with httpclient.InferenceServerClient(proc.host_port) as client:
            # Triton's default version policy: the latest version only.
            assert client.get_model_metadata("latest")["versions"] == ["2"]
            assert not client.is_model_ready("latest", "1")
            with pytest.raises(
                InferenceServerException,
                match="Request for unknown model: 'latest' version 1 is not found",
            ):
                client.get_model_metadata("latest", "1")
            index = {entry["name"]: entry for entry in client.get_model_repository_index()}
            assert index["stateful"]["state"] == "UNAVAILABLE"
            assert "sequence_batching" in index["stateful"]["reason"]
            assert index["required"]["state"] == "UNAVAILABLE"
            assert "'X' optional, but the ONNX graph requires it" in index["required"]["reason"]
    finally:
        assert proc.stop() == 0
    assert (
        "model 'latest': config.pbtxt field 'model_warmup' is not supported by oipserve "
        "and is ignored" in proc.log
    )
    assert "model 'stateful' is UNAVAILABLE: config.pbtxt:" in proc.log


#: ``accumulate`` with an initial state, and the fields this server ignores with a warning
#: that Triton's answer prints 64-bit integers of.
STRINGS_AND_NUMBERS = ACCUMULATE.replace(
    "dims: [ 1 ] }} ]\n}}",
    'dims: [ 1 ]\n    initial_state {{ name: "zero" data_type: TYPE_INT32 dims: [ 1 ] '
    "zero_data: true }} }} ]\n}}",
) + (
    'optimization {{ cuda {{ graph_spec {{ batch_size: 2 input {{ key: "INPUT" value '
    "{{ dim: [ 1 ] }} }} }} }} }}\n"
    'model_warmup {{ name: "w" batch_size: 1 inputs {{ key: "INPUT" value {{ '
    "data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }} }} }}\n"
)


def test_64_bit_fields_are_numbers_or_strings_as_in_triton(tmp_path: Path) -> None:
    """Core's ModelConfigToJson makes numbers of the 64-bit fields it knows and leaves the
    others strings (proto3 JSON): an initial state's dims (its fix-up looks for them in the
    wrong object), a CUDA graph's input dims; all were numbers here."""
    write_accumulate(tmp_path / "acc" / "1" / "model.onnx")
    config = STRINGS_AND_NUMBERS.format(
        name="acc", max_batch=8, idle_us=5000, strategy="direct { }", count=1
    )
    (tmp_path / "acc" / "config.pbtxt").write_text(config)
    proc = ServerProcess(tmp_path).wait_ready()
    try:
        with httpclient.InferenceServerClient(proc.host_port) as client:
            shown = client.get_model_config("acc")
        with grpcclient.InferenceServerClient(f"localhost:{proc.grpc_port}") as grpc_client:
            message = grpc_client.get_model_config("acc").config
    finally:
        assert proc.stop() == 0
    sequence = shown["sequence_batching"]
    assert shown["input"][0]["dims"] == [1] and sequence["state"][0]["dims"] == [1]
    assert sequence["max_sequence_idle_microseconds"] == 5000
    assert sequence["direct"]["max_queue_delay_microseconds"] == 0
    assert shown["model_warmup"][0]["inputs"]["INPUT"]["dims"] == [1]
    assert sequence["state"][0]["initial_state"][0]["dims"] == ["1"]
    graph = shown["optimization"]["cuda"]["graph_spec"][0]
    assert graph["input"]["INPUT"]["dim"] == ["1"] and graph["batch_size"] == 2
    assert list(message.sequence_batching.state[0].initial_state[0].dims) == [1]


def test_grpc_config_of_unknown_model(grpc_client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.get_model_config("nope")
    assert info.value.status() == str(grpc.StatusCode.NOT_FOUND)
    assert "Request for unknown model: 'nope' is not found" in str(info.value.message())
