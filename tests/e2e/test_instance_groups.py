"""config.pbtxt instance_group decides where repository models get sessions (Triton's rule)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

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
    for model in ("auto_one", "both", "cpu_many", "model_kind", "nogroup"):
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
    }
    assert [d for d, _ in placements(srv)["model_kind"]] == ["cuda:1"]
