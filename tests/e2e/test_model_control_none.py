"""``--model-control-mode none`` locks the repository, as in Triton; explicit mode does not.

Triton refuses a repository load or unload outside explicit mode with UNAVAILABLE and
"explicit model load / unload is not allowed if polling is enabled" (its words for mode
none too), which its QA tests (``http_restricted_api_test.py``) and operators rely on.
One server per mode, over a private copy of two sample models, with tritonclient and
plain HTTP.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.cli import run_cli
from tests.support.http import fp32_infer, post
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

MODELS = ("identity_fp32", "versioned")
TRITON_WORDS = "explicit model load / unload is not allowed if polling is enabled"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for name in MODELS:
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
    return root


def _serve(repo: Path, args: list[str]) -> Iterator[ServerProcess]:
    proc = ServerProcess(repo, ["--devices", "cpu", *args]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


@pytest.fixture(scope="module")
def locked(repo: Path) -> Iterator[ServerProcess]:
    yield from _serve(repo, [])  # mode none is the default, as in Triton


@pytest.fixture(scope="module")
def explicit(repo: Path) -> Iterator[ServerProcess]:
    yield from _serve(repo, ["--model-control-mode", "explicit", "--load-model", "*"])


@pytest.mark.parametrize("action", ["load", "unload"])
@pytest.mark.parametrize("name", ["identity_fp32", "absent"])
def test_rest_load_and_unload_are_refused(locked: ServerProcess, action: str, name: str) -> None:
    status, body = post(locked, f"/v2/repository/models/{name}/{action}")
    assert status == 503, body
    assert json.loads(body)["error"].startswith(TRITON_WORDS)
    assert "--model-control-mode explicit" in json.loads(body)["error"]
    fp32_infer(locked, "identity_fp32")  # still loaded, still serving


def test_tritonclient_http_sees_triton_words(locked: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(locked.host_port)
    try:
        for call in (client.unload_model, client.load_model):
            with pytest.raises(InferenceServerException, match=TRITON_WORDS) as caught:
                call("versioned")
            assert caught.value.status() == "503"
        assert client.is_model_ready("versioned", "2")
    finally:
        client.close()


def test_grpc_load_and_unload_are_unavailable(locked: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(locked.grpc_url) as client:
        for call in (client.unload_model, client.load_model):
            with pytest.raises(InferenceServerException, match=TRITON_WORDS) as caught:
                call("versioned")
            assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert client.is_model_ready("versioned", "1")


def test_the_index_still_answers(locked: ServerProcess) -> None:
    status, body = post(locked, "/v2/repository/index", {"ready": True})
    assert status == 200, body
    ready = {(e["name"], e["version"]) for e in json.loads(body)}
    assert ready == {("identity_fp32", "1"), ("versioned", "1"), ("versioned", "2")}
    with grpcclient.InferenceServerClient(locked.grpc_url) as client:
        index = client.get_model_repository_index(as_json=True)["models"]
        assert {m["name"] for m in index} == set(MODELS)


def test_explicit_mode_loads_and_unloads_as_before(explicit: ServerProcess) -> None:
    assert post(explicit, "/v2/repository/models/versioned/unload") == (200, b"")
    with grpcclient.InferenceServerClient(explicit.grpc_url) as client:
        assert not client.is_model_ready("versioned")
        client.load_model("versioned")
        assert client.is_model_ready("versioned", "2")
        client.unload_model("identity_fp32")
    assert post(explicit, "/v2/repository/models/identity_fp32/load") == (200, b"")
    fp32_infer(explicit, "identity_fp32")


def test_poll_mode_is_refused_at_start_with_a_reason() -> None:
    result = run_cli(
        "serve", "--model-repository", str(SAMPLE_REPOSITORY), "--model-control-mode=poll"
    )
    assert result.returncode == 2, result.stderr
    assert "poll" in result.stderr and "not implemented" in result.stderr, result.stderr
    assert "explicit" in result.stderr
