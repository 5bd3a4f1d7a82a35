"""config.pbtxt instance_group decides where repository models get sessions (Triton's rule)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.model_config_pb2 as mc

from tests.support.http import placements, request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

GROUPS = {
    "gpu1": "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 1 ] } ]",
    "cpu_many": "instance_group [ { count: 5 kind: KIND_CPU } ]",
    "auto_one": "instance_group [ { count: 1 kind: KIND_AUTO } ]",
    "both": "instance_group [ { count: 1 kind: KIND_CPU }, { count: 2 kind: KIND_GPU } ]",
    "nogroup": "",
    "missing_gpu": "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]",
    "model_kind": "instance_group [ { count: 1 kind: KIND_MODEL } ]",
    # No count: Triton's default, 2 on the CPU (core's SetDefaultInstanceCount), 1 on a GPU.
    "cpu_default": "instance_group [ { kind: KIND_CPU } ]",
    "gpu_default": "instance_group [ { kind: KIND_GPU } ]",
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    for name, group in GROUPS.items():
        shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / name)
        if group:
            (root / name / "config.pbtxt").write_text(group + "\n")
    inventory = tmp_path_factory.mktemp("hw") / "inventory.json"
    inventory.write_text(json.dumps({"gpus": [{"name": "NVIDIA A10"}, {"name": "NVIDIA A10"}]}))
    args = [
        "--devices",
        "cpu,cuda:1",
        "--instances-per-device",
        "2",
        "--hardware-inventory",
        str(inventory),
    ]
    proc = ServerProcess(root, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def test_instance_groups_place_sessions(srv: ServerProcess) -> None:
    where = placements(srv)
    assert [d for d, _ in where["gpu1"]] == ["cuda:1"]
    assert [d for d, _ in where["cpu_many"]] == ["cpu", "cpu"]  # capped at the 2 cpu workers
    assert [d for d, _ in where["auto_one"]] == ["cuda:1"]  # GPUs first, as Triton's KIND_AUTO
    assert [d for d, _ in where["both"]] == ["cpu", "cuda:1", "cuda:1"]
    assert [d for d, _ in where["nogroup"]] == ["cpu", "cpu", "cuda:1", "cuda:1"]
    assert "missing_gpu" not in where
    assert [d for d, _ in where["cpu_default"]] == ["cpu", "cpu"]
    assert [d for d, _ in where["gpu_default"]] == ["cuda:1"]


def test_a_group_on_a_device_without_workers_is_unavailable(srv: ServerProcess) -> None:
    status, _, raw = request(srv, "GET", "/v2/models/missing_gpu/ready")
    assert status == 503
    status, _, raw = request(srv, "POST", "/v2/repository/index", "")
    entry = next(m for m in json.loads(raw) if m["name"] == "missing_gpu")
    assert entry["state"] == "UNAVAILABLE"
    assert "cuda:0" in entry["reason"] and "--devices" in entry["reason"]


def test_models_with_groups_still_infer(srv: ServerProcess) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]}]}
    )
    for model in ("gpu1", "cpu_many", "both"):
        status, _, raw = request(srv, "POST", f"/v2/models/{model}/infer", body)
        assert status == 200, raw
        assert json.loads(raw)["outputs"][0]["data"] == [1.5, 2.5]


def test_the_config_response_shows_groups_as_placed(srv: ServerProcess) -> None:
    """Triton's normalisation: KIND_AUTO is reported as the kind it ran as, and a GPU group
    names the GPUs it is on (it said KIND_AUTO, with no GPUs); KIND_MODEL as given (its
    GPUs named, the config could not be loaded back); a model without groups as placed (it
    said KIND_CPU for every worker, GPUs included). All found by fuzzing."""
    shown = {}
    for model in ("auto_one", "both", "cpu_many", "model_kind", "nogroup", "cpu_default"):
        status, _, raw = request(srv, "GET", f"/v2/models/{model}/config")
        assert status == 200, raw
        groups = json.loads(raw)["instance_group"]
        shown[model] = [(g["kind"], g.get("gpus", []), g["count"]) for g in groups]
    assert shown == {
        "auto_one": [("KIND_GPU", [1], 1)],
        "both": [("KIND_CPU", [], 1), ("KIND_GPU", [1], 2)],
        "cpu_many": [("KIND_CPU", [], 5)],
        "model_kind": [("KIND_MODEL", [], 1)],
        "nogroup": [("KIND_GPU", [1], 2), ("KIND_CPU", [], 2)],
        "cpu_default": [("KIND_CPU", [], 2)],
    }
    assert [d for d, _ in placements(srv)["model_kind"]] == ["cuda:1"]


def test_a_group_without_count_gets_tritons_default(srv: ServerProcess) -> None:
    """Triton's count for a KIND_CPU group that gives none is 2 (it was 1 here), 1 for a
    GPU group; the config response says so, REST and gRPC alike, and nothing warns of a
    cap; a model without groups has Triton's group name, the model's (it was <model>_0)."""
    with grpcclient.InferenceServerClient(f"localhost:{srv.grpc_port}") as client:
        cpu = client.get_model_config("cpu_default").config.instance_group
        gpu = client.get_model_config("gpu_default").config.instance_group
        nogroup = client.get_model_config("nogroup").config.instance_group
    assert [(g.name, g.count, g.kind) for g in cpu] == [
        ("cpu_default_0", 2, mc.ModelInstanceGroup.KIND_CPU)
    ]
    assert [(g.name, g.count, list(g.gpus)) for g in gpu] == [("gpu_default_0", 1, [1])]
    assert [g.name for g in nogroup] == ["nogroup", "nogroup_1"]
    status, _, raw = request(srv, "GET", "/v2/models/gpu_default/config")
    assert status == 200 and json.loads(raw)["instance_group"][0]["count"] == 1
    assert "model 'cpu_default': instance_group asks" not in srv.log
