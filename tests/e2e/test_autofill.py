"""Auto-complete over a real server: a model without config.pbtxt, or with a partial one, is
served as Triton serves it (its ONNX Runtime backend's ``AutoCompleteConfig``): metadata,
the config response, batch limits, the dynamic batcher; ``--disable-auto-complete-config``
(and Triton's ``--strict-model-config=true``) keeps each configuration as given;
``--backend-config`` sets the max_batch_size filled in (docs/model-config.md,
"Auto-complete"). Shapes are checked against the graph by Triton's rules, and an unbatched
scalar output is answered as Triton answers it, ``[1]``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.model_config_pb2 as mc
import tritonclient.http as httpclient
from google.protobuf import json_format, text_format
from tritonclient.utils import InferenceServerException

from tests.support.autofill_models import (
    REFUSED_OTHER_GRAPHS,
    TRITON_REFUSED,
    write_autofill_repository,
)
from tests.support.cli import run_cli
from tests.support.http import get, post
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

#: Triton's answer for its QA model ``autofill_noplatform_success/onnx/no_config`` (the
#: same graph: INT32 [-1, 16] in and out), less its GPU instance group and pinned memory.
TRITON_NO_CONFIG = """
name: "no_config"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
version_policy { latest { num_versions: 1 } }
max_batch_size: 4
input { name: "INPUT0" data_type: TYPE_INT32 dims: 16 }
input { name: "INPUT1" data_type: TYPE_INT32 dims: 16 }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: 16 }
output { name: "OUTPUT1" data_type: TYPE_INT32 dims: 16 }
dynamic_batching { preferred_batch_size: 4 }
default_model_filename: "model.onnx"
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("autofill")
    write_autofill_repository(root)
    return root


@pytest.fixture(scope="module")
def completing(repository: Path) -> Iterator[ServerProcess]:
    """The repository with auto-complete on (the default), in explicit mode: loads may
    give a configuration too."""
    args = ["--model-control-mode", "explicit", "--load-model", "*", "--http-workers", "1"]
    proc = ServerProcess(repository, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _inputs(client: object, rows: int, batched: bool = True) -> list[object]:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    shape = [rows, 16] if batched else [16]
    data = np.arange(rows * 16 if batched else 16, dtype=np.int32).reshape(shape)
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, shape, "INT32")
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def _reasons(proc: ServerProcess) -> dict[str, str]:
    status, body = post(proc, "/v2/repository/index")
    assert status == 200
    index = json.loads(body)
    return {entry["name"]: entry.get("reason", "") for entry in index if entry["state"] != "READY"}


def _stripped(config: mc.ModelConfig) -> mc.ModelConfig:
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    copy.ClearField("instance_group")
    copy.ClearField("optimization")
    return copy


def test_a_model_without_config_is_served_as_triton_serves_it(completing: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(completing.grpc_url) as client:
        config = client.get_model_config("no_config").config
        assert _stripped(config) == text_format.Parse(TRITON_NO_CONFIG, mc.ModelConfig())
        metadata = client.get_model_metadata("no_config")
        assert [list(t.shape) for t in metadata.inputs] == [[-1, 16], [-1, 16]]
        result = client.infer("no_config", _inputs(client, 4))
        assert result.as_numpy("OUTPUT0").shape == (4, 16)
        with pytest.raises(InferenceServerException) as info:
            client.infer("no_config", _inputs(client, 5))
        assert info.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
        assert "inference request batch-size must be <= 4 for 'no_config'" in str(info.value)
    with httpclient.InferenceServerClient(completing.host_port) as client:
        document = client.get_model_config("no_config")
        assert document["max_batch_size"] == 4
        assert document["dynamic_batching"]["preferred_batch_size"] == [4]
        # (a [16] without the batch dimension: its first dimension is read as the batch
        #  size, which Triton checks before the shape)
        with pytest.raises(InferenceServerException, match=r"batch-size must be <= 4 .* 16$"):
            client.infer("no_config", _inputs(client, 1, batched=False))
    assert (
        "autofilled max_batch_size to 4 for model 'no_config' since batching is supported"
        in completing.log
    )
    # A graph with a fixed first dim (Triton's no_config_no_batch) keeps max_batch_size 0.
    with httpclient.InferenceServerClient(completing.host_port) as client:
        config = client.get_model_config("no_batch")
        assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
        assert [t["dims"] for t in config["input"]] == [[16], [16]]
    assert (
        "model 'no_batch': configuration auto-completed from the ONNX graph: inputs, outputs"
        in (completing.log)
    )


def test_a_partial_config_is_completed(completing: ServerProcess) -> None:
    with httpclient.InferenceServerClient(completing.host_port) as client:
        config = client.get_model_config("partial")
        assert config["max_batch_size"] == 4 and "dynamic_batching" in config
        assert [(t["name"], t["dims"]) for t in config["output"]] == [
            ("OUTPUT0", [16]),
            ("OUTPUT1", [16]),
        ]
        result = client.infer("partial", _inputs(client, 2))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((2, 16), np.int32))


def test_a_tensor_of_one_variable_dim_gets_dims_1(completing: ServerProcess) -> None:
    """Triton's rule for [-1] with batching: dims [1], reshape [] (the model sees [-1])."""
    with httpclient.InferenceServerClient(completing.host_port) as client:
        config = client.get_model_config("vector")
        assert config["input"][0]["dims"] == [1]
        assert config["input"][0]["reshape"] == {"shape": []}
        tensor = httpclient.InferInput("INPUT0", [3, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[1], [2], [3]], dtype=np.float32))
        result = client.infer("vector", [tensor])
        assert result.get_output("OUTPUT0")["shape"] == [3, 1]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[2], [3], [4]])


def test_an_unbatched_scalar_input_is_dims_1(completing: ServerProcess) -> None:
    """Triton shows a scalar as dims [1]; requests send [1], the model gets a scalar."""
    with httpclient.InferenceServerClient(completing.host_port) as client:
        config = client.get_model_config("scalar")
        assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [1]
        tensor = httpclient.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.array([2], dtype=np.float32))
        assert client.infer("scalar", [tensor]).as_numpy("Y").item() == 3


def test_an_unbatched_scalar_output_is_answered_as_dims_1(completing: ServerProcess) -> None:
    """The model makes Y a scalar; Triton's backend answers it with its config dims, [1]
    (its scalar_outputs_), REST and gRPC alike, as the metadata says."""
    with httpclient.InferenceServerClient(completing.host_port) as client:
        assert client.get_model_config("scalar")["output"][0]["dims"] == [1]
        assert client.get_model_metadata("scalar")["outputs"][0]["shape"] == [1]
        tensor = httpclient.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.array([2], dtype=np.float32))
        result = client.infer("scalar", [tensor])
        assert result.get_output("Y")["shape"] == [1]
        np.testing.assert_array_equal(result.as_numpy("Y"), np.array([3], np.float32))
        as_json = [httpclient.InferRequestedOutput("Y", binary_data=False)]
        json_result = client.infer("scalar", [tensor], outputs=as_json)
        assert json_result.get_output("Y")["shape"] == [1]
    with grpcclient.InferenceServerClient(completing.grpc_url) as client:
        given = grpcclient.InferInput("X", [1], "FP32")
        given.set_data_from_numpy(np.array([2], dtype=np.float32))
        output = client.infer("scalar", [given]).get_output("Y")
        assert output is not None and list(output.shape) == [1]


def test_a_sequence_model_is_completed_without_what_the_server_fills(
    completing: ServerProcess,
) -> None:
    """A deliberate difference: Triton's auto-complete lists the control and state inputs
    too, and its load then fails counting them (``configuration expects 5 inputs, model
    provides 3``); here the completed configuration lists what clients send and receive,
    and the model serves its sequences."""
    with httpclient.InferenceServerClient(completing.host_port) as client:
        config = client.get_model_config("sequence_partial")
        assert [(t["name"], t["dims"]) for t in config["input"]] == [("INPUT", [1])]
        assert [(t["name"], t["dims"]) for t in config["output"]] == [("OUTPUT", [1])]
        assert config["max_batch_size"] == 8 and "dynamic_batching" not in config
    with grpcclient.InferenceServerClient(completing.grpc_url) as client:
        sums = []
        for step, value in enumerate((1, 2, 3)):
            given = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            given.set_data_from_numpy(np.array([[value]], np.int32))
            result = client.infer(
                "sequence_partial",
                [given],
                sequence_id=7,
                sequence_start=step == 0,
                sequence_end=step == 2,
            )
            sums.append(int(result.as_numpy("OUTPUT").item()))
        assert sums == [1, 3, 6]


def test_conflicts_are_refused_with_a_clear_reason(completing: ServerProcess) -> None:
    reasons = _reasons(completing)
    assert set(reasons) == {
        "batch_dim_given",
        "bad_max_batch_size",
        *TRITON_REFUSED,
        *REFUSED_OTHER_GRAPHS,
    }
    assert reasons["bad_max_batch_size"] == (
        "autofill failed for model 'bad_max_batch_size': model does not support "
        "batching while non-zero max_batch_size is specified"
    )
    reason = reasons["batch_dim_given"]
    assert "config.pbtxt gives input 'INPUT0' shape [-1, -1, 16] but the ONNX graph has" in reason
    assert "auto-complete set max_batch_size to 4" in reason
    assert "list every input and output in config.pbtxt" in reason


REFUSALS = {**{case: words for case, (_, words) in TRITON_REFUSED.items()}, **REFUSED_OTHER_GRAPHS}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_tritons_qa_refusals_lead_with_tritons_words(completing: ServerProcess, case: str) -> None:
    """Triton's ``autofill_noplatform/onnx`` cases and the rest of its backend's shape
    rules (a -1 over a fixed dim, batching over a fixed first dim, a scalar's dims): its
    words first (what its QA looks for), ours after; REST's index and load, gRPC's load
    alike."""
    words = REFUSALS[case]
    reason = _reasons(completing)[case]
    assert reason.startswith(words + "; config.pbtxt "), reason
    status, body = post(completing, f"/v2/repository/models/{case}/load")
    assert status == 400 and words in json.loads(body)["error"]
    client = grpcclient.InferenceServerClient(f"localhost:{completing.grpc_port}")
    with pytest.raises(InferenceServerException) as info:
        client.load_model(case)
    assert words in str(info.value.message())
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_load_with_a_partial_config_is_completed(completing: ServerProcess) -> None:
    given = json.dumps({"max_batch_size": 2})
    status, body = post(
        completing, "/v2/repository/models/no_config/load", {"parameters": {"config": given}}
    )
    assert status == 200, body
    status, config = get(completing, "/v2/models/no_config/config")
    assert status == 200 and isinstance(config, dict)
    assert config["max_batch_size"] == 2
    assert config["dynamic_batching"]["preferred_batch_size"] == [2]
    given = json.dumps(
        {
            "max_batch_size": 2,
            "input": [
                {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1, 16]},
                {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
            ],
        }
    )
    status, body = post(
        completing, "/v2/repository/models/no_config/load", {"parameters": {"config": given}}
    )
    assert status == 400
    assert "config.pbtxt gives input 'INPUT0' shape [-1, -1, 16]" in json.loads(body)["error"]
    status, config = get(completing, "/v2/models/no_config/config")  # the last load serves
    assert isinstance(config, dict) and config["max_batch_size"] == 2


@pytest.mark.parametrize(
    "flags",
    [["--disable-auto-complete-config"], ["--strict-model-config=true"]],
    ids=["disable", "strict"],
)
def test_without_auto_complete_each_config_is_taken_as_given(
    repository: Path, flags: list[str]
) -> None:
    """As Triton: a model without config.pbtxt is not loaded (core cannot read the file),
    one whose config.pbtxt lists no inputs fails its backend's count, a partial one is
    checked as it is; one that lists inputs but no outputs, which Triton loads to fail each
    request, is refused; the index shows each reason, a load answers 400 with it."""
    args = [*flags, "--model-control-mode", "explicit", "--load-model", "*"]
    proc = ServerProcess(repository, [*args, "--http-workers", "1"]).wait_ready()
    try:
        reasons = _reasons(proc)
        for name in ("no_config", "no_batch", "vector", "scalar"):
            assert reasons[name].startswith(
                f"failed to open text file for read {repository / name / 'config.pbtxt'}: "
                "No such file or directory; the model has no config.pbtxt and auto-complete "
                "is off"
            ), reasons[name]
        assert reasons["empty_config"].startswith(
            "unable to load model 'empty_config', configuration expects 0 inputs, model "
            "provides 2; config.pbtxt leaves out graph inputs ['INPUT0', 'INPUT1']"
        )
        assert reasons["partial"].startswith(
            "model 'partial', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) "
            "but the model configuration specifies 1 dimensions (shape [16]); config.pbtxt "
            "gives input 'INPUT0' shape [16] but the ONNX graph has"
        )
        # (batch_dim_given's dims fit the graph as given, but it lists no outputs: Triton
        #   loads it and fails every request, which answer only the outputs listed)
        assert reasons["batch_dim_given"] == (
            "unable to load model 'batch_dim_given': config.pbtxt lists no outputs and "
            "auto-complete is off (--disable-auto-complete-config or "
            "--strict-model-config=true), so no output could be answered (Triton loads such "
            "a model and fails each of its requests: 'onnx runtime error 2: At least one "
            "output should be requested.'); list the outputs clients need (the ONNX graph's: "
            "['OUTPUT0', 'OUTPUT1']), or start the server without the flag"
        )
        assert set(reasons) == {
            "no_config",
            "batch_dim_given",
            "no_batch",
            "vector",
            "scalar",
            "empty_config",
            "partial",
            "bad_max_batch_size",
            "sequence_partial",
            *TRITON_REFUSED,
            *REFUSED_OTHER_GRAPHS,
        }
        status, body = post(proc, "/v2/repository/models/no_config/load")
        assert status == 400
        assert "failed to open text file for read" in json.loads(body)["error"]
        with grpcclient.InferenceServerClient(proc.grpc_url) as client:
            with pytest.raises(InferenceServerException) as info:
                client.load_model("no_config")
            assert info.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
            assert "failed to open text file for read" in str(info.value.message())
            given = json_format.MessageToJson(text_format.Parse(TRITON_NO_CONFIG, mc.ModelConfig()))
            client.load_model("no_config", config=given)  # a configuration given serves
            assert client.is_model_ready("no_config")
    finally:
        assert proc.stop() == 0, proc.log
    deprecated = "Warning: '--strict-model-config' has been deprecated!"
    assert (deprecated in proc.log) == (flags[0] != "--disable-auto-complete-config")
    assert "auto-completed" not in proc.log


def test_backend_config_sets_the_max_batch_size_filled_in(tmp_path: Path) -> None:
    write_autofill_repository(tmp_path)
    args = ["--backend-config=onnxruntime,default-max-batch-size=8", "--strict-model-config=false"]
    proc = ServerProcess(tmp_path, [*args, "--http-workers", "1"]).wait_ready()
    try:
        with httpclient.InferenceServerClient(proc.host_port) as client:
            assert client.get_model_config("no_config")["max_batch_size"] == 8
            assert client.infer("no_config", _inputs(client, 8)).as_numpy("OUTPUT0").shape == (
                8,
                16,
            )
    finally:
        assert proc.stop() == 0, proc.log


def test_a_backend_config_oipserve_does_not_take_is_refused() -> None:
    result = run_cli(
        "tritonserver",
        f"--model-store={SAMPLE_REPOSITORY}",
        "--backend-config=onnxruntime,enable-global-threadpool=1",
    )
    assert result.returncode == 2, result.stderr
    assert "--backend-config" in result.stderr
    assert "'enable-global-threadpool' is not a setting oipserve takes" in result.stderr


def test_the_sample_autofill_model(http: httpclient.InferenceServerClient) -> None:
    """The sample repository's ``simple_autofill`` (``simple`` without its config.pbtxt)
    shows it in the session's server; the unbatched samples list their tensors."""
    config = http.get_model_config("simple_autofill")
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert http.get_model_metadata("simple_autofill")["inputs"][0]["shape"] == [-1, 16]
    identity = http.get_model_config("identity_fp32")
    assert identity["max_batch_size"] == 0 and "dynamic_batching" not in identity
