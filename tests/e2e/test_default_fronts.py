"""``--http-workers auto`` (the default) on a real server: as many fronts as the CPUs give,
but one for a repository whose models batch, so that batches form over every client's
connections as in Triton (``oipserve.app.fronts``; Triton's L0_batcher QA tests failed
against two fronts, each batching only its own connections).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from hardware.cpus import fronts_for, usable_cpus
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

#: Requests sent at once, each on a connection of its own: the model's preferred batch.
CLIENTS = 8

pytestmark = pytest.mark.skipif(
    fronts_for(usable_cpus()) < 2, reason="auto gives one front on this machine's CPUs anyway"
)


def _batching_repository(root: Path) -> Path:
    """The sample ``batched`` model, waiting up to 30 s for a batch of ``CLIENTS`` rows."""
    shutil.copytree(SAMPLE_REPOSITORY / "batched" / "1", root / "batched" / "1")
    config = (SAMPLE_REPOSITORY / "batched" / "config.pbtxt").read_text()
    head = config[: config.index("dynamic_batching")]
    (root / "batched" / "config.pbtxt").write_text(
        f"{head}dynamic_batching {{ preferred_batch_size: [ {CLIENTS} ] "
        "max_queue_delay_microseconds: 30000000 }\n"
    )
    return root


@pytest.fixture(scope="module")
def batching(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = _batching_repository(tmp_path_factory.mktemp("default-fronts"))
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    yield server
    assert server.stop() == 0, server.log


def _rows_of_one_request(server: ServerProcess, seed: int) -> int:
    """One request on a client (a connection) of its own; the rows its execution ran."""
    client = httpclient.InferenceServerClient(server.host_port, network_timeout=20.0)
    values = np.full((1, 4), seed, dtype=np.float32)
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(values)
    t = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    t.set_data_from_numpy(np.array([[f"client-{seed}".encode()]], dtype=object))
    try:
        result = client.infer("batched", [x, t])
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values + 1)
    return int(result.as_numpy("ROWS").ravel()[0])


def test_a_repository_with_a_batching_model_gets_one_front(batching: ServerProcess) -> None:
    assert any("one HTTP front (--http-workers auto" in line for line in batching.lines)
    assert not any("HTTP front 1 (pid" in line for line in batching.lines), batching.log


def test_requests_of_separate_connections_form_one_batch(batching: ServerProcess) -> None:
    """The preferred batch of 8 forms from 8 clients at once. Split over two fronts (the
    kernel spreads connections), each front's batcher would wait out the 30 s delay."""
    with ThreadPoolExecutor(CLIENTS) as pool:
        rows = list(pool.map(lambda seed: _rows_of_one_request(batching, seed), range(CLIENTS)))
    assert rows == [CLIENTS] * CLIENTS


def test_a_repository_without_batching_models_gets_the_cpus_fronts(tmp_path: Path) -> None:
    shutil.copytree(SAMPLE_REPOSITORY / "simple", tmp_path / "simple")
    server = ServerProcess(tmp_path, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    try:
        assert any("HTTP front 1 (pid" in line for line in server.lines), server.log
        assert not any("one HTTP front" in line for line in server.lines)
    finally:
        assert server.stop() == 0, server.log


def test_a_number_given_keeps_its_fronts_and_warns_of_each_batching_model(
    tmp_path: Path,
) -> None:
    root = _batching_repository(tmp_path)
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "2"}).wait_ready()
    try:
        assert any("HTTP front 1 (pid" in line for line in server.lines), server.log
        warnings = [line for line in server.lines if " WARNING " in line]
        assert any(
            "model 'batched' version 1 batches per HTTP front (2 fronts)" in line
            for line in warnings
        ), warnings
    finally:
        assert server.stop() == 0, server.log
