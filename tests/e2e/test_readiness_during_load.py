"""Readiness that tells the truth under a slow load (Triton's server#7014: a pod restarted
because /v2/health/ready failed while an explicit load ran).

The loads are really slow: ONNX graphs of thousands of distinct nodes, whose sessions take
seconds to create (``write_slow_model``). One server, in explicit mode, loads one of them
at start, so:

- the start: the manifests' startupProbe (``/v2/health/ready`` on a port known before
  the server says it) gets no 200 before the models of the start are loaded;
- a first load of another model: the server stays ready (REST and gRPC) from the first
  probe to the last, and the model being loaded is not ready (REST 503 with
  ``{"ready": false}``, gRPC ready false) until its load returns, then ready;
- a reload of a model loaded at start: the server stays ready, and so does the model,
  whose old version serves until the new one swaps in.
"""

from __future__ import annotations

import datetime
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deploy import free_port, logged_at, probe_status, readiness_while
from tests.support.http import post, request
from tests.support.onnx_models import write_slow_model
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, wait_for

#: Nodes of the slow models: about 2 s of session creation on an idle core of the 2-core
#: test box (session creation grows faster than linearly: 3,000 took 5 s), under 1 s on a
#: fast one; the probes of a check take ~0.1 s. Every check below runs while a load is
#: under way, and says so when it was not.
SLOW_NODES = 2000
READY = "/v2/health/ready"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readiness")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "identity_fp32")
    for name in ("slow", "later"):
        (root / name / "1").mkdir(parents=True)
        write_slow_model(root / name / "1" / "model.onnx", SLOW_NODES)
    return root


@pytest.fixture(scope="module")
def started(repo: Path) -> Iterator[tuple[ServerProcess, list[tuple[datetime.datetime, int]]]]:
    """The server, and the 200s its startupProbe got while it started (time received)."""
    port = free_port()
    args = ["--devices", "cpu", "--model-control-mode", "explicit", "--http-port", str(port)]
    srv = ServerProcess(repo, [*args, "--load-model", "slow", "--load-model", "identity_fp32"])
    answers: list[tuple[datetime.datetime, int]] = []
    try:
        while not srv.ready_line and srv.process.poll() is None:
            status = probe_status(port, READY, timeout=1.0)
            answers.append((datetime.datetime.now(), status or 0))
            # NOTE: the probe's own period (a kubelet's is seconds): probing without a pause
            #   kept a core of this 2-core box busy with refused connects while the slow
            #   model loaded.
            time.sleep(0.05)
        srv.wait_ready()
        yield srv, answers
    finally:
        assert srv.stop() == 0, srv.log
        assert "Traceback" not in srv.log, srv.log


@pytest.fixture(scope="module")
def srv(started: tuple[ServerProcess, list[tuple[datetime.datetime, int]]]) -> ServerProcess:
    return started[0]


def test_the_startup_probe_waits_for_the_models_of_the_start(
    started: tuple[ServerProcess, list[tuple[datetime.datetime, int]]],
) -> None:
    srv, answers = started
    assert wait_for(lambda: "model 'slow' version 1 is READY" in srv.log, 60), srv.log
    loaded = logged_at(srv.log, "model 'slow' version 1 is READY")
    began = logged_at(srv.log, "model 'slow' version 1: loading")
    assert loaded is not None and began is not None, srv.log
    during = [status for when, status in answers if began < when < loaded]
    assert during, "no probe ran while the model of the start loaded"
    early = [(when, status) for when, status in answers if status == 200 and when < loaded]
    assert not early, (early, loaded)
    assert probe_status(srv.port, READY) == 200


def test_the_server_stays_ready_while_another_model_loads(srv: ServerProcess) -> None:
    answer: dict[str, tuple[int, bytes]] = {}
    load = threading.Thread(
        target=lambda: answer.update(r=post(srv, "/v2/repository/models/later/load"))
    )
    load.start()
    try:
        assert wait_for(lambda: "model 'later' version 1: loading" in srv.log, 60), srv.log
        seen = readiness_while(srv, "later", load)
    finally:
        load.join(120)
    assert seen["server"] == {200} and seen["grpc server"] == {True}, seen
    # Known and not ready while it loads: 503 (404 is for names never heard of).
    assert seen["model"] == {(503, False)} and seen["grpc"] == {False}, seen
    assert answer["r"][0] == 200, answer
    assert request(srv, "GET", "/v2/models/later/ready")[0] == 200
    assert request(srv, "GET", READY)[0] == 200


def test_a_model_of_the_start_stays_ready_while_it_reloads(srv: ServerProcess) -> None:
    loads = srv.log.count("model 'slow' version 1: loading")
    answer: dict[str, tuple[int, bytes]] = {}
    load = threading.Thread(
        target=lambda: answer.update(r=post(srv, "/v2/repository/models/slow/load"))
    )
    load.start()
    try:
        assert wait_for(lambda: srv.log.count("model 'slow' version 1: loading") > loads, 60)
        seen = readiness_while(srv, "slow", load)
    finally:
        load.join(120)
    # The old version serves until the new one is ready: neither the server nor it blinks.
    assert seen["server"] == {200} and seen["grpc server"] == {True}, seen
    assert seen["model"] == {(200, True)} and seen["grpc"] == {True}, seen
    assert answer["r"][0] == 200, answer
    assert request(srv, "GET", READY)[0] == 200
