"""A ``--hardware-inventory`` file that cannot be read: at start-up, and once serving.

At start-up the server must refuse to start (exit 3) and say which file and why, so an
operator's typo never turns into a server that answers hardware queries with errors. A
file that breaks while serving is a server-side condition: 503 naming the file and the
reason, and the server recovers by itself once the file is fixed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from oipserve.app.cli import EXIT_STARTUP_FAILURE
from tests.support.cli import run_serve
from tests.support.http import request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

GOOD = {"gpus": [{"name": "NVIDIA A10"}]}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file"),
        ("{not json", "not valid JSON"),
        (json.dumps({"gpuz": []}), "gpuz"),
        (json.dumps({"gpus": [{"memory_total": 1, "memory_free": 2}]}), "exceeds memory_total"),
    ],
)
def test_unreadable_inventory_stops_start_up(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    inventory = tmp_path / "inventory.json"
    if content is not None:
        inventory.write_text(content)
    result = run_serve(
        "--hardware-inventory",
        str(inventory),
    )
    assert result.returncode == EXIT_STARTUP_FAILURE, result.stderr
    assert str(inventory) in result.stderr and reason in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hw") / "inventory.json"
    path.write_text(json.dumps(GOOD))
    return path


@pytest.fixture(scope="module")
def srv(inventory: Path) -> Iterator[ServerProcess]:
    args = ["--devices", "cpu", "--hardware-inventory", str(inventory)]
    args += ["--model-control-mode", "explicit"]
    proc = ServerProcess(SAMPLE_REPOSITORY, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def call(srv: ServerProcess, method: str, path: str, body: object = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body)
    status, _, payload = request(srv, method, path, data)
    return status, payload.decode()


def test_inventory_broken_while_serving_is_503_until_fixed(
    srv: ServerProcess, inventory: Path
) -> None:
    assert call(srv, "GET", "/v2/hardware")[0] == 200
    onnx = {"model": "identity_fp32", "device": "auto"}
    for broken, reason in (("{not json", "not valid JSON"), (None, "No such file")):
        if broken is None:
            inventory.unlink()
        else:
            inventory.write_text(broken)
        for method, path, body in (
            ("GET", "/v2/hardware", None),
            ("POST", "/v2/hardware", {"name": "gpu"}),
            ("POST", "/v2/workers/onnxruntime/load", onnx),
        ):
            status, payload = call(srv, method, path, body)
            assert status == 503, (path, payload)
            error = json.loads(payload)["error"]
            assert str(inventory) in error and reason in error, error
        # What needs no inventory goes on working.
        assert call(srv, "POST", "/v2/workers/echo/load", {})[0] == 200
        assert call(srv, "POST", "/v2/workers/echo/unload")[0] == 200
        assert call(srv, "POST", "/v2/repository/index")[0] == 200

    inventory.write_text(json.dumps(GOOD))
    status, payload = call(srv, "GET", "/v2/hardware")
    assert status == 200 and "cuda:0" in json.loads(payload)["devices"]
    assert call(srv, "POST", "/v2/hardware", {"name": "gpu"})[0] == 200
    status, name = call(srv, "POST", "/v2/workers/onnxruntime/load", onnx)
    assert status == 200, name
    assert call(srv, "POST", f"/v2/workers/{name}/unload")[0] == 200


def test_repository_that_disappears_while_serving_is_503(tmp_path: Path) -> None:
    """Like a broken inventory: the repository's index is a server-side condition, not 501."""
    repository = tmp_path / "models"
    repository.mkdir()
    (repository / "simple").symlink_to(SAMPLE_REPOSITORY / "simple")
    proc = ServerProcess(repository).wait_ready()
    try:
        status, _, _ = request(proc, "POST", "/v2/repository/index", "{}")
        assert status == 200
        repository.rename(tmp_path / "moved")
        status, _, body = request(proc, "POST", "/v2/repository/index", "{}")
        assert status == 503, body
        assert str(repository) in json.loads(body)["error"]
        (tmp_path / "moved").rename(repository)
        status, _, _ = request(proc, "POST", "/v2/repository/index", "{}")
        assert status == 200
    finally:
        assert proc.stop() == 0, proc.log
