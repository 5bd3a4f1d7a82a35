"""Model files sent with a load: how many, and who waits for them (issue #35).

A load of 100,000 ``file:`` parameters was answered 400 after 8 s, and a load of another
model sent meanwhile waited 6 s: the files were checked on the event loop and written
while the load held the lock every repository load takes. Now more than
``--max-upload-files`` (default 1,000) are refused before any is looked at, and a load's
files are decoded and written by a thread before it takes the lock: another model's
load goes ahead meanwhile. The server's temporary directory is the test's, so the test
sees the files being written.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, wait_for

IDENTITY = (SAMPLE_REPOSITORY / "identity_fp32" / "1" / "model.onnx").read_bytes()
CONFIG = json.dumps({"max_batch_size": 0})
#: The default of --max-upload-files.
BOUND = 1000


@pytest.fixture(scope="module")
def tmpdir_of_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-tmp")


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory, tmpdir_of_server: Path
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "identity_fp32")
    args = ["--devices", "cpu", "--model-control-mode", "explicit"]
    proc = ServerProcess(root, args, env={"TMPDIR": str(tmpdir_of_server)}).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def _load(srv: ServerProcess, name: str, parameters: dict[str, object]) -> tuple[int, str]:
    connection = http.client.HTTPConnection(srv.host_port, timeout=300)
    try:
        body = json.dumps({"parameters": parameters})
        connection.request("POST", f"/v2/repository/models/{name}/load", body)
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data)["error"] if data else ""
    finally:
        connection.close()


def _written(tmpdir_of_server: Path, name: str) -> list[Path]:
    return list(tmpdir_of_server.glob(f"oipserve-*-uploads-*/*/{name}/1/*"))


def test_more_files_than_the_bound_are_refused_before_any_is_written(
    srv: ServerProcess, tmpdir_of_server: Path
) -> None:
    crowd: dict[str, object] = {"config": CONFIG}
    crowd |= {f"file:1/f{i}": "AAAA" for i in range(20_000)}
    assert _load(srv, "crowd", crowd) == (
        400,
        "failed to load 'crowd': the load gives 20000 files, more than --max-upload-files "
        f"{BOUND} (the limit)",
    )
    # gRPC too (bytes, not base64), one file past the bound.
    files = {f"file:1/f{i}": b"x" for i in range(BOUND + 1)}
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("crowd", config=CONFIG, files=files)
    finally:
        client.close()
    assert caught.value.message() == (
        f"failed to load 'crowd': the load gives {BOUND + 1} files, more than "
        f"--max-upload-files {BOUND} (the limit)"
    )
    assert not _written(tmpdir_of_server, "crowd")


def test_a_large_upload_does_not_hold_up_another_models_load(
    srv: ServerProcess, tmpdir_of_server: Path
) -> None:
    """The other load is answered while the large one's files are still being written.

    No timing is compared: the other load starts once the first file is seen on disk, and
    must be answered while some of the large load's files are not there yet. Before, it
    waited for the lock the large load held while writing (and loading), and so was
    answered after it.
    """
    extra = base64.b64encode(os.urandom(64 * 1024)).decode()
    large: dict[str, object] = {"config": CONFIG, "file:1/model.onnx": b64(IDENTITY)}
    large |= {f"file:1/extra{i}.bin": extra for i in range(BOUND - 1)}  # exactly the bound
    answers: list[tuple[str, tuple[int, str]]] = []

    def load_large() -> None:
        answers.append(("large", _load(srv, "large", large)))

    loader = threading.Thread(target=load_large, daemon=True)
    loader.start()
    try:
        assert wait_for(lambda: _written(tmpdir_of_server, "large") or not loader.is_alive(), 120)
        assert loader.is_alive(), f"the large load was answered before it wrote: {answers}"
        answers.append(("other", _load(srv, "identity_fp32", {})))
        written = len(_written(tmpdir_of_server, "large"))
    finally:
        loader.join(300)
    assert answers == [("other", (200, "")), ("large", (200, ""))]
    assert written < BOUND, "the other load was answered once the large one's files were written"
    assert len(_written(tmpdir_of_server, "large")) == BOUND
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        assert client.is_model_ready("large") and client.is_model_ready("identity_fp32")
    finally:
        client.close()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
