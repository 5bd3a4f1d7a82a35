"""``--http-workers auto`` (the default) on a real server: as many fronts as the CPUs give,
with a model's dynamic batches formed in the primary over every front's connections
(``oipserve.scaleout.batch_link``), and one front for a repository with a sequence model.

Triton forms batches and applies a model's queue policy over all its connections, and its
clients and QA tests rely on it (its L0_batcher tests failed against two fronts that each
batched their own connections). Here the requests go on connections the test places on
each front (``socket_to_front``), so that the batches and the queue must span both.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hardware.cpus import fronts_for, usable_cpus
from tests.support.sequence_models import SIMPLE_SEQUENCE, write_simple_sequence
from tests.support.server import (
    SAMPLE_REPOSITORY,
    ServerProcess,
    front_pid,
    pending,
    socket_to_front,
    steadily,
    wait_for,
)

#: Requests sent at once, half on each front: the model's preferred batch.
CLIENTS = 8

pytestmark = pytest.mark.skipif(
    fronts_for(usable_cpus()) < 2, reason="auto gives one front on this machine's CPUs anyway"
)


def _batching_repository(root: Path, batching: str) -> Path:
    """The sample ``batched`` model with the ``dynamic_batching`` block ``batching``."""
    shutil.copytree(SAMPLE_REPOSITORY / "batched" / "1", root / "batched" / "1")
    config = (SAMPLE_REPOSITORY / "batched" / "config.pbtxt").read_text()
    head = config[: config.index("dynamic_batching")]
    (root / "batched" / "config.pbtxt").write_text(f"{head}dynamic_batching {{ {batching} }}\n")
    return root


def _on_both_fronts(server: ServerProcess, count: int) -> list[socket.socket]:
    """``count`` connections, alternately held by the primary and by the other front."""
    fronts = [front_pid(server, "primary"), front_pid(server, "extra front")]
    return [socket_to_front(server, fronts[i % 2]) for i in range(count)]


def _infer(server: ServerProcess, sock: socket.socket, seed: int) -> tuple[int, dict]:
    """One JSON request of ``batched`` on ``sock``: the status and the answer."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.sock = sock
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [float(seed)] * 4},
            {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [f"client-{seed}"]},
        ]
    }
    try:
        connection.request("POST", "/v2/models/batched/infer", json.dumps(body))
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _output(answer: dict, name: str) -> list:
    (output,) = [o for o in answer["outputs"] if o["name"] == name]
    return output["data"]


@pytest.fixture(scope="module")
def batching(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Waits up to 30 s for a batch of ``CLIENTS`` rows."""
    root = _batching_repository(
        tmp_path_factory.mktemp("default-fronts"),
        f"preferred_batch_size: [ {CLIENTS} ] max_queue_delay_microseconds: 30000000",
    )
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    yield server
    assert server.stop() == 0, server.log


def test_a_repository_with_a_dynamic_batching_model_gets_the_cpus_fronts(
    batching: ServerProcess,
) -> None:
    assert any("HTTP front 1 (pid" in line for line in batching.lines), batching.log
    assert not any("one HTTP front" in line for line in batching.lines)


def test_requests_on_both_fronts_form_one_batch(batching: ServerProcess) -> None:
    """The preferred batch of 8 forms from 4 connections on each front. Were the batches
    formed per front, each front's batcher would wait out the 30 s delay with 4."""
    sockets = _on_both_fronts(batching, CLIENTS)
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda i: _infer(batching, sockets[i], i), range(CLIENTS)))
    for seed, (status, answer) in enumerate(answers):
        assert status == 200, answer
        assert _output(answer, "OUTPUT0") == [seed + 1.0] * 4
        assert _output(answer, "TEXT_OUT") == [f"client-{seed}"]
        assert _output(answer, "ROWS") == [CLIENTS]


@pytest.mark.parametrize("first", ["primary", "extra front"])
def test_a_queue_limit_holds_over_both_fronts(tmp_path: Path, first: str) -> None:
    """``max_queue_size: 1``: once one request waits, every other is refused (503, as
    Triton), whichever front took it; formed per front, the other front admitted one
    (Triton's L0_http ``test_descriptive_status_code``)."""
    root = _batching_repository(
        tmp_path,
        "preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 5000000 "
        "default_queue_policy { max_queue_size: 1 }",
    )
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    try:
        waiting = socket_to_front(server, front_pid(server, first))
        others = _on_both_fronts(server, 2)
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(_infer, server, waiting, 1)
            assert wait_for(steadily(lambda: pending(server) == 1), timeout=4), server.log
            refusals = [_infer(server, sock, 2) for sock in others]
            status, answer = queued.result(timeout=30)
        assert status == 200 and _output(answer, "ROWS") == [1], answer
        assert refusals == [(503, {"error": "Exceeds maximum queue size"})] * 2
    finally:
        assert server.stop() == 0, server.log


def _sequence_repository(root: Path) -> Path:
    write_simple_sequence(root / "simple_sequence" / "1" / "model.onnx")
    config = SIMPLE_SEQUENCE.format(name="simple_sequence", extra="", count=1)
    (root / "simple_sequence" / "config.pbtxt").write_text(config)
    return root


def test_a_repository_with_a_sequence_model_gets_one_front(tmp_path: Path) -> None:
    """A sequence's slots and batches form in the front that took its requests."""
    root = _sequence_repository(tmp_path)
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    try:
        assert any("one HTTP front (--http-workers auto" in line for line in server.lines)
        assert not any("HTTP front 1 (pid" in line for line in server.lines), server.log
    finally:
        assert server.stop() == 0, server.log


def test_a_number_given_keeps_its_fronts_and_warns_of_each_sequence_model(
    tmp_path: Path,
) -> None:
    root = _sequence_repository(tmp_path)
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "2"}).wait_ready()
    try:
        assert any("HTTP front 1 (pid" in line for line in server.lines), server.log
        warnings = [line for line in server.lines if " WARNING " in line]
        assert any(
            "model 'simple_sequence' version 1 batches sequences per HTTP front (2 fronts)" in line
            for line in warnings
        ), warnings
    finally:
        assert server.stop() == 0, server.log
