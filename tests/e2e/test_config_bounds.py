"""Numbers of a model configuration that once sized what the server allocated (issue #35).

``dynamic_batching { priority_levels: 1000000000 }`` in a load's ``config`` held the event
loop for 55 s and took 7.7 GB (a queue, and a policy, per level). Now a level costs
nothing until it holds a request, and ``--max-priority-levels`` bounds the number: past
it a load is a quick 400 and a repository model is not ready, with the reason. One server
in explicit mode on a private copy of identity_fp32 (twice: one loaded on demand, one
whose config.pbtxt asks for one level more than the bound).
"""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

BOUND = 300_000
#: What the front may grow by while serving a model with BOUND levels (the eager queues
#: took ~1.3 KB a level: ~390 MB here).
GROWTH_MAX = 100 * 1024 * 1024
#: Far past the bound (not 10^9: the eager code would take 7.7 GB of a test machine).
FAR = 50_000_000


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    for name in ("identity_fp32", "spare", "too_many_levels"):
        shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / name)
    (root / "too_many_levels" / "config.pbtxt").write_text(
        f"max_batch_size: 8\ndynamic_batching {{ priority_levels: {BOUND + 1} "
        "default_priority_level: 1 }\n"
    )
    args = ["--devices", "cpu", "--model-control-mode", "explicit"]
    args += ["--load-model", "identity_fp32", "--load-model", "too_many_levels"]
    args += ["--max-priority-levels", str(BOUND)]
    proc = ServerProcess(root, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def _call(srv: ServerProcess, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(srv.host_port, timeout=60)
    try:
        data = None if body is None else json.dumps(body)
        connection.request(method, path, data)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _load(srv: ServerProcess, name: str, config: dict[str, object]) -> tuple[int, str]:
    status, body = _call(
        srv,
        "POST",
        f"/v2/repository/models/{name}/load",
        {"parameters": {"config": json.dumps(config)}},
    )
    return status, json.loads(body)["error"] if body else ""


def _levels(levels: int, default: int = 1) -> dict[str, object]:
    batching = {"priority_levels": levels, "default_priority_level": default}
    return {"max_batch_size": 8, "dynamic_batching": batching}


def test_a_repository_model_past_the_bound_is_not_ready_with_the_reason(
    srv: ServerProcess,
) -> None:
    assert not srv.started_ready
    status, body = _call(srv, "POST", "/v2/repository/index")
    assert status == 200
    entries = [e for e in json.loads(body) if e["name"] == "too_many_levels"]
    assert entries and entries[0]["state"] == "UNAVAILABLE", entries
    assert (
        f"dynamic_batching.priority_levels {BOUND + 1} is more than --max-priority-levels "
        f"{BOUND} (the limit)" in entries[0]["reason"]
    ), entries
    with httpclient.InferenceServerClient(srv.host_port) as client:
        assert not client.is_model_ready("too_many_levels")


def test_a_load_far_past_the_bound_is_a_quick_400_while_the_server_answers(
    srv: ServerProcess,
) -> None:
    """50 million levels (the eager code spent ~3 s of the loop on them, and loaded them):
    refused at once; the event loop answers health probes all along."""
    outcome: list[tuple[int, str]] = []
    loader = threading.Thread(
        target=lambda: outcome.append(_load(srv, "spare", _levels(FAR))), daemon=True
    )
    probe = http.client.HTTPConnection(srv.host_port, timeout=5)
    try:
        loader.start()
        while loader.is_alive():
            # A loop held by the load would leave this probe unanswered (timeout: 5 s).
            probe.request("GET", "/v2/health/live")
            response = probe.getresponse()
            assert (response.status, response.read()) == (200, b'{"live":true}')
            time.sleep(0.01)  # the probe's own pace while the load runs
    finally:
        probe.close()
    loader.join(60)
    assert outcome == [
        (
            400,
            "failed to load 'spare': invalid config override: dynamic_batching.priority_levels "
            f"{FAR} is more than --max-priority-levels {BOUND} (the limit)",
        )
    ]
    assert _call(srv, "GET", "/v2/health/live")[0] == 200


def test_grpc_loads_are_bounded_too(srv: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("spare", config=json.dumps(_levels(BOUND + 1)))
    finally:
        client.close()
    assert caught.value.message() == (
        "failed to load 'spare': invalid config override: dynamic_batching.priority_levels "
        f"{BOUND + 1} is more than --max-priority-levels {BOUND} (the limit)"
    )
    assert "INVALID_ARGUMENT" in str(caught.value.status())


def _front_rss(srv: ServerProcess) -> int:
    return psutil.Process(srv.process.pid).memory_info().rss


def _infer(client: httpclient.InferenceServerClient, priority: int) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("spare", [tensor], priority=priority)
    assert np.array_equal(result.as_numpy("OUTPUT0"), x)


def test_a_model_with_as_many_levels_as_the_bound_serves_at_no_cost_per_level(
    srv: ServerProcess,
) -> None:
    before = _front_rss(srv)
    assert _load(srv, "spare", _levels(BOUND, default=BOUND)) == (200, "")
    with httpclient.InferenceServerClient(srv.host_port) as client:
        # The batcher is made on the first request: the eager one made every level then.
        for priority in (0, 1, BOUND, BOUND // 2, 7):
            _infer(client, priority)
        statistics = client.get_inference_statistics("spare")
    assert statistics["model_stats"][0]["inference_count"] == 5
    growth = _front_rss(srv) - before
    assert growth < GROWTH_MAX, f"the front grew by {growth / 2**20:.0f} MiB"
