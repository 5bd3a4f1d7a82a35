"""``--model-name``: whatever KServe's storage initializer left at /mnt/models, the model is
served under the InferenceService's name (kserve/kserve#2287, #2755, #3513).

Each layout of ``KSERVE_LAYOUTS`` (a bare model.onnx with or without config.pbtxt, a
model's own directory, a single model directory, a one-model Triton repository) is served
as ``my-isvc`` version 1, inferred with tritonclient over HTTP and gRPC, and listed so by
the repository index; a repository of several models is served as without the flag. The
repository API (unload, load, reload) works on the model served that way and never
touches its files. The manifests' own args are run on these layouts by
tests/e2e/test_deploy_manifests.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deploy import (
    KSERVE_LAYOUTS,
    fingerprint,
    infer_simple_grpc,
    infer_simple_http,
    write_kserve_layout,
)
from tests.support.http import post, request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

NAME = "my-isvc"
ARGS = ["--devices", "cpu", "--model-name", NAME]


def serve(root: Path, args: list[str] = ARGS) -> ServerProcess:
    return ServerProcess(root, args).wait_ready()


def stop(srv: ServerProcess) -> None:
    assert srv.stop() == 0, srv.log
    assert "Traceback" not in srv.log, srv.log


@pytest.mark.parametrize("layout", sorted(KSERVE_LAYOUTS))
def test_every_kserve_layout_is_served_as_the_model_name(layout: str, tmp_path: Path) -> None:
    root = write_kserve_layout(tmp_path / "models", layout, NAME)
    srv = serve(root)
    try:
        assert srv.started_ready, srv.log
        metadata = infer_simple_http(srv.host_port, NAME)
        assert metadata["name"] == NAME and metadata["versions"] == ["1"]
        infer_simple_grpc(srv.grpc_url, NAME)
        # The same model answers on the version's own path.
        status, _, body = request(srv, "GET", f"/v2/models/{NAME}/versions/1/ready")
        assert status == 200, body
        index = json.loads(post(srv, "/v2/repository/index")[1])
        assert index == [{"name": NAME, "version": "1", "state": "READY", "reason": ""}]
        # The directory's own name (or the config's "simple") is not a second model.
        for other in ("densenet", "simple", "models"):
            assert request(srv, "GET", f"/v2/models/{other}/ready")[0] == 404
    finally:
        stop(srv)


def test_a_repository_of_several_models_is_served_as_without_the_name(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name in ("simple", "identity_fp32"):
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
    srv = serve(root)
    try:
        infer_simple_http(srv.host_port, "simple")
        assert request(srv, "GET", "/v2/models/identity_fp32/ready")[0] == 200
        assert request(srv, "GET", f"/v2/models/{NAME}/ready")[0] == 404
        # Said once at start, as a warning: the name given names none of them.
        assert f"--model-name {NAME}: the model repository {root} holds 2 models" in srv.log
    finally:
        stop(srv)


def test_a_bare_model_without_the_name_still_says_how_to_serve_it(tmp_path: Path) -> None:
    root = write_kserve_layout(tmp_path / "models", "bare", NAME)
    srv = serve(root, ["--devices", "cpu"])
    try:
        assert "holds no model directory" in srv.log and "--model-name NAME" in srv.log
        assert request(srv, "GET", f"/v2/models/{NAME}/ready")[0] == 404
    finally:
        stop(srv)


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[tuple[Path, ServerProcess]]:
    root = write_kserve_layout(tmp_path / "mnt" / "models", "bare-config", NAME)
    srv = serve(root, [*ARGS, "--model-control-mode", "explicit", "--load-model", NAME])
    yield root, srv
    stop(srv)


def test_the_repository_api_loads_unloads_and_reloads_the_named_model(
    bare: tuple[Path, ServerProcess],
) -> None:
    root, srv = bare
    before = fingerprint(root.parent)
    # A reload while it serves: the new version swaps in, the old one is unloaded.
    assert post(srv, f"/v2/repository/models/{NAME}/load")[0] == 200
    infer_simple_http(srv.host_port, NAME)
    # Unload: known, not ready (503 with Triton's body), and listed as unloaded.
    assert post(srv, f"/v2/repository/models/{NAME}/unload")[0] == 200
    status, _, body = request(srv, "GET", f"/v2/models/{NAME}/ready")
    assert status == 503 and json.loads(body)["ready"] is False
    index = json.loads(post(srv, "/v2/repository/index")[1])
    assert index == [{"name": NAME, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    assert post(srv, f"/v2/repository/models/{NAME}/load")[0] == 200
    infer_simple_http(srv.host_port, NAME)
    # The repository holds one model: any other name is a failed load, in Triton's words.
    status, body = post(srv, "/v2/repository/models/densenet/load")
    assert status == 400 and "failed to load 'densenet'" in json.loads(body)["error"], body
    # Nothing of the repository (nor the directory above it) was removed or written: the
    # model directory is the repository itself, never mistaken for an upload.
    assert fingerprint(root.parent) == before


def test_a_named_model_without_its_file_says_where_it_was_looked_for(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    shutil.copyfile(SAMPLE_REPOSITORY / "simple" / "config.pbtxt", root / "config.pbtxt")
    srv = serve(root)
    try:
        assert not srv.started_ready, srv.log
        expected = f"no model file in {root}: expected {root}/model.onnx (version 1)"
        assert expected in srv.log, srv.log
        status, _, body = request(srv, "GET", f"/v2/models/{NAME}")
        assert status == 503 and "no model file" in json.loads(body)["error"], body
    finally:
        stop(srv)
