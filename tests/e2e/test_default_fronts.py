"""``--http-workers auto`` (the default) on a real server: as many fronts as the CPUs give,
whatever the repository holds, with a model's dynamic batches and its sequences formed in
the primary over every front's connections (``oipserve.scaleout.batch_link``).

Triton forms batches and applies a model's queue policy over all its connections, and its
clients and QA tests rely on it (its L0_batcher tests failed against two fronts that each
batched their own connections). Here the requests go on connections the test places on
each front (``socket_to_front``), so that the batches and the queue must span both.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from onnx import helper

from hardware.cpus import fronts_for, usable_cpus
from tests.support.ensemble_models import ensemble_config, write_ensemble
from tests.support.sequence_models import ACCUMULATE, save_int32_graph, write_accumulate
from tests.support.server import (
    SAMPLE_REPOSITORY,
    ServerProcess,
    failures,
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
    before = _counts(batching)
    sockets = _on_both_fronts(batching, CLIENTS)
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda i: _infer(batching, sockets[i], i), range(CLIENTS)))
    for seed, (status, answer) in enumerate(answers):
        assert status == 200, answer
        assert _output(answer, "OUTPUT0") == [seed + 1.0] * 4
        assert _output(answer, "TEXT_OUT") == [f"client-{seed}"]
        assert _output(answer, "ROWS") == [CLIENTS]
    # each counted once, where it ran (the primary), the other front's too: one execution
    after = _counts(batching)
    assert [a - b for a, b in zip(after, before, strict=True)] == [CLIENTS, CLIENTS, 1]


def test_a_client_of_the_other_front_that_leaves_withdraws_its_request_at_once(
    batching: ServerProcess,
) -> None:
    """Its request leaves the primary's queue when it goes, not at the end of the 30 s
    delay, and counts once, as canceled, where it was queued (the primary answers such a
    request from its batcher's future, without a task of its own: ``infer_crossed``)."""
    server = batching
    assert wait_for(lambda: pending(server) == 0, timeout=10), server.log
    before = failures(server, "CANCELED")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.sock = socket_to_front(server, front_pid(server, "extra front"))
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4},
            {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["leaving"]},
        ]
    }
    connection.request("POST", "/v2/models/batched/infer", json.dumps(body))
    assert wait_for(steadily(lambda: pending(server) == 1), timeout=10), server.log
    connection.close()  # the client goes away
    assert wait_for(lambda: pending(server) == 0, timeout=10), server.log
    assert wait_for(steadily(lambda: failures(server, "CANCELED") == before + 1), timeout=10)
    assert "Traceback" not in server.log, server.log


def _counts(server: ServerProcess) -> tuple[int, int, int]:
    """``batched``'s successes, inferences and executions, as the statistics give them."""
    with urllib.request.urlopen(f"{server.url}/v2/models/batched/stats", timeout=10) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    success = stats["inference_stats"]["success"]["count"]
    return success, stats["inference_count"], stats["execution_count"]


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``batched`` with ``max_queue_size: 1`` (the test below, once for each front: its
    queue is empty again when a run ends, its one request answered)."""
    root = _batching_repository(
        tmp_path_factory.mktemp("queue-limit"),
        "preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 3000000 "
        "default_queue_policy { max_queue_size: 1 }",
    )
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    yield server
    assert server.stop() == 0, server.log


@pytest.mark.parametrize("first", ["primary", "extra front"])
def test_a_queue_limit_holds_over_both_fronts(limited: ServerProcess, first: str) -> None:
    """``max_queue_size: 1``: once one request waits, every other is refused (503, as
    Triton), whichever front took it; formed per front, the other front admitted one
    (Triton's L0_http ``test_descriptive_status_code``)."""
    server = limited
    assert wait_for(lambda: pending(server) == 0, timeout=10), server.log
    waiting = socket_to_front(server, front_pid(server, first))
    others = _on_both_fronts(server, 2)
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(_infer, server, waiting, 1)
        assert wait_for(steadily(lambda: pending(server) == 1), timeout=2.5), server.log
        refusals = [_infer(server, sock, 2) for sock in others]
        status, answer = queued.result(timeout=30)
    assert status == 200 and _output(answer, "ROWS") == [1], answer
    assert refusals == [(503, {"error": "Exceeds maximum queue size"})] * 2


def test_a_front_that_dies_withdraws_what_it_queued_in_the_primary(tmp_path: Path) -> None:
    """Its requests waiting in the primary's batcher (for a 30 s delay) leave the queue when
    its batch socket closes, instead of holding their places until the delay is over."""
    root = _batching_repository(
        tmp_path, "preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 30000000"
    )
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    try:
        extra = front_pid(server, "extra front")
        sockets = [socket_to_front(server, extra) for _ in range(3)]
        with ThreadPoolExecutor(3) as pool:
            waiting = [pool.submit(_infer, server, sock, i) for i, sock in enumerate(sockets)]
            assert wait_for(lambda: pending(server) == 3, timeout=10), server.log
            os.kill(extra, signal.SIGKILL)
            assert wait_for(lambda: pending(server) == 0, timeout=10), server.log
            for call in waiting:  # their clients lost their connections with the front
                with pytest.raises((ConnectionError, http.client.HTTPException)):
                    call.result(timeout=30)
        assert wait_for(lambda: server.http_front_pids() not in ([], [extra]), timeout=30)
        sockets = _on_both_fronts(server, CLIENTS)  # the replacement batches with the primary
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(lambda i: _infer(server, sockets[i], i), range(CLIENTS)))
        assert [_output(answer, "ROWS") for _, answer in answers] == [[CLIENTS]] * CLIENTS
    finally:
        assert server.stop() == 0, server.log


def _sequence_repository(root: Path) -> Path:
    """``accumulate_direct``: each request's output is its sequence's running sum, kept as
    implicit state in the worker."""
    model = root / "accumulate_direct"
    write_accumulate(model / "1" / "model.onnx")
    config = ACCUMULATE.format(
        name="accumulate_direct", max_batch=8, idle_us=60_000_000, strategy="direct { }", count=1
    )
    (model / "config.pbtxt").write_text(config)
    return root


def _add(
    server: ServerProcess,
    sock: socket.socket,
    value: int,
    model: str = "accumulate_direct",
    **sequence: object,
) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.sock = sock
    body = {
        "parameters": {"sequence_id": 7, **sequence},
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
    }
    try:
        connection.request("POST", f"/v2/models/{model}/infer", json.dumps(body))
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200, answer
        return answer
    finally:
        connection.close()


def _ensemble_of_both_kinds(root: Path) -> None:
    """``sum_then_copy``: ``accumulate_direct`` (a sequence) then ``copy_batched`` (an
    identity with dynamic batching), the sequence's parameters going to both steps."""
    save_int32_graph(
        root / "copy_batched" / "1" / "model.onnx",
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
        ["INPUT"],
        ["OUTPUT"],
    )
    (root / "copy_batched" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
    )
    tensor = [("INPUT", "TYPE_INT32", "[ 1 ]")]
    steps = [
        ("accumulate_direct", {"INPUT": "INPUT"}, {"OUTPUT": "sum"}),
        ("copy_batched", {"INPUT": "sum"}, {"OUTPUT": "OUTPUT"}),
    ]
    config = ensemble_config("sum_then_copy", steps, tensor, [("OUTPUT", "TYPE_INT32", "[ 1 ]")])
    write_ensemble(root, "sum_then_copy", config)


def test_a_sequence_may_go_through_both_fronts(tmp_path: Path) -> None:
    """A repository with a sequence model gets the CPUs' fronts too: its sequences live in
    the primary, whichever front a request reaches. Scheduled per front, the second
    request reached a front that never saw the START (400) or started a state of its own."""
    root = _sequence_repository(tmp_path)
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    try:
        assert any("HTTP front 1 (pid" in line for line in server.lines), server.log
        sockets = _on_both_fronts(server, 4)
        sums = [
            _add(server, sockets[0], 1, sequence_start=True),
            _add(server, sockets[1], 2),
            _add(server, sockets[2], 3),
            _add(server, sockets[3], 4, sequence_end=True),
        ]
        assert [_output(answer, "OUTPUT") for answer in sums] == [[1], [3], [6], [10]]
    finally:
        assert server.stop() == 0, server.log


def test_an_ensemble_of_a_sequence_and_a_batched_step_goes_through_both_fronts(
    tmp_path: Path,
) -> None:
    """Each step crosses from the other front to its batcher in the primary: the batched
    step carries the ensemble's sequence too, and goes to its dynamic batcher (it went to
    a sequence batcher it does not have, a 500, until the primary chose by the model)."""
    root = _sequence_repository(tmp_path)
    _ensemble_of_both_kinds(root)
    server = ServerProcess(root, env={"OIPSERVE_HTTP_WORKERS": "auto"}).wait_ready()
    try:
        sockets = _on_both_fronts(server, 4)
        model = "sum_then_copy"
        sums = [
            _add(server, sockets[0], 1, model, sequence_start=True),
            _add(server, sockets[1], 2, model),
            _add(server, sockets[2], 3, model),
            _add(server, sockets[3], 4, model, sequence_end=True),
        ]
        assert [_output(answer, "OUTPUT") for answer in sums] == [[1], [3], [6], [10]]
    finally:
        assert server.stop() == 0, server.log
