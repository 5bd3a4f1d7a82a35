"""A GPU node whose ONNX Runtime cannot use CUDA: GPU instances fail to load, loudly (Triton).

ONNX Runtime falls back to the CPU without an error when the CUDA provider cannot start.
The fake inventory's ``"gpu_sessions": "real"`` sends the planned CUDA providers to the real
ONNX Runtime, which on this GPU-less machine falls back exactly as on such a node. The model
placed on the GPU must be UNAVAILABLE with a message saying why and what to do, nothing of it
may stay loaded, and a ``KIND_CPU`` model next to it must serve.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.http import fp32_infer, get, post, request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

#: The refusal for the model placed on the GPU (``Placement.place``).
REFUSAL = (
    "model 'on_gpu' version 1 on cuda:0: ONNX Runtime could not use the GPU "
    "(the session got CPUExecutionProvider only)"
)
WHAT_TO_DO = (
    "install onnxruntime-gpu with CUDA and cuDNN libraries that match the driver "
    "(docs/deploy.md), or serve the model on the CPU (--devices cpu, or instance_group KIND_CPU)"
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "on_gpu")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "on_cpu")
    (root / "on_cpu" / "config.pbtxt").write_text(
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
    inventory = tmp_path_factory.mktemp("hw") / "inventory.json"
    inventory.write_text(
        json.dumps({"gpus": [{"name": "NVIDIA H100 80GB HBM3"}], "gpu_sessions": "real"})
    )
    args = ["--devices", "auto", "--hardware-inventory", str(inventory)]
    args += ["--model-control-mode", "explicit", "--load-model", "*"]  # loads allowed
    proc = ServerProcess(root, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def gpu_device(srv: ServerProcess) -> dict[str, object]:
    status, hardware = get(srv, "/v2/hardware")
    assert status == 200
    assert hardware["simulated"] is False  # type: ignore[index]
    return hardware["devices"]["cuda:0"]  # type: ignore[index]


def assert_nothing_left_on_the_gpu(srv: ServerProcess) -> None:
    device = gpu_device(srv)
    assert device["instances"] == [] and device["models"] == []
    workers = device["workers"]
    assert workers and all(w["alive"] and w["sessions"] == 0 for w in workers)  # type: ignore[attr-defined]


def test_the_gpu_model_is_not_ready_and_start_up_says_why(srv: ServerProcess) -> None:
    assert not srv.started_ready
    assert "model 'on_gpu' is not ready: " in srv.log
    assert REFUSAL in srv.log and WHAT_TO_DO in srv.log
    assert request(srv, "GET", "/v2/models/on_gpu/ready")[0] == 503
    assert request(srv, "GET", "/v2/health/ready")[0] == 503
    status, index = post(srv, "/v2/repository/index")
    assert status == 200
    entry = next(e for e in json.loads(index) if e["name"] == "on_gpu")
    assert entry["state"] == "UNAVAILABLE"
    assert REFUSAL in entry["reason"] and WHAT_TO_DO in entry["reason"]


def test_a_kind_cpu_model_beside_it_serves(srv: ServerProcess) -> None:
    assert request(srv, "GET", "/v2/models/on_cpu/ready")[0] == 200
    fp32_infer(srv, "on_cpu")
    status, hardware = get(srv, "/v2/hardware")
    assert status == 200
    (instance,) = hardware["devices"]["cpu"]["instances"]  # type: ignore[index]
    assert instance["model"] == "on_cpu"
    assert instance["session_providers"] == ["CPUExecutionProvider"]


def test_a_repository_load_answers_the_refusal(srv: ServerProcess) -> None:
    status, body = post(srv, "/v2/repository/models/on_gpu/load")
    assert status == 400, body
    message = json.loads(body)["error"]
    assert message.startswith(f"failed to load 'on_gpu': version 1: {REFUSAL}; {WHAT_TO_DO}")
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("on_gpu")
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert REFUSAL in caught.value.message() and WHAT_TO_DO in caught.value.message()
    assert not client.is_model_ready("on_gpu")
    assert_nothing_left_on_the_gpu(srv)
    fp32_infer(srv, "on_cpu")


def test_an_endpoint_on_the_gpu_is_refused_the_same_way(srv: ServerProcess) -> None:
    status, body = post(
        srv, "/v2/workers/onnxruntime/load", {"model": "on_gpu", "device": "cuda:0"}
    )
    assert status == 400, body
    message = json.loads(body)["error"]
    assert "on cuda:0: ONNX Runtime could not use the GPU" in message and WHAT_TO_DO in message
    assert get(srv, "/v2/models/onnxruntime")[0] == 404
    assert_nothing_left_on_the_gpu(srv)
