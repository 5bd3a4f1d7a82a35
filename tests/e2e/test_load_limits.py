"""Bounded cost for worker loads (issue #18), over real HTTP against a server subprocess.

Every number a load may send is bounded by the node (a fake inventory with 2 logical
cores and two GPUs) and by a flag, and refused with a 400 naming the bound before any
process starts. Loads run concurrently, each under ``--load-timeout``: a slow one (a real
slow thing: an ONNX graph of thousands of nodes, whose session takes many seconds to
create) holds up neither other loads nor inference, and past the timeout it is answered
503 and leaves no worker and no name behind.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.http import fp32_infer, get, post
from tests.support.onnx_models import write_slow_model
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, wait_for

#: Long enough for the other loads and inferences of the slow-load test to run within it
#: on a loaded box (about a second of work there).
LOAD_TIMEOUT = 4.0
#: Nodes of the slow model: session creation grows faster than linearly with them
#: (7,000 nodes took 21 s on a 2-core machine), so this is far past LOAD_TIMEOUT.
SLOW_NODES = 8000
INVENTORY = {
    "cpu": {"logical_cores": 2},
    "gpus": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total": 85_899_345_920},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total": 85_899_345_920},
    ],
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    for name in ("simple", "identity_fp32"):
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
    write_slow_model(root / "slow.onnx", SLOW_NODES)
    inventory = tmp_path_factory.mktemp("hw") / "inventory.json"
    inventory.write_text(json.dumps(INVENTORY))
    args = [
        "--devices",
        "cpu",
        "--hardware-inventory",
        str(inventory),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "identity_fp32",
        "--max-threads-per-session",
        "1",
        "--load-timeout",
        str(LOAD_TIMEOUT),
    ]
    env = {"OIPSERVE_MAX_ENDPOINT_BATCH_SIZE": "64"}
    proc = ServerProcess(root, args, env).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def refused(srv: ServerProcess, worker: str, params: dict[str, object]) -> str:
    """The 400 message of a load that must be refused at once, starting nothing."""
    before = sorted(srv.worker_pids())
    started = time.monotonic()
    status, body = post(srv, f"/v2/workers/{worker}/load", params)
    assert time.monotonic() - started < 5
    assert status == 400, body
    assert sorted(srv.worker_pids()) == before
    return json.loads(body)["error"]


@pytest.mark.parametrize(
    ("worker", "params", "message"),
    [
        (
            "onnxruntime",
            {"model": "simple", "intra_op_threads": 100000},
            "intra_op_threads 100000 is more than this node's 2 logical cores (the limit)",
        ),
        (
            "onnxruntime",
            {"model": "simple", "inter_op_threads": 100000},
            "inter_op_threads 100000 is more than this node's 2 logical cores (the limit)",
        ),
        (
            "onnxruntime",
            {"model": "simple", "intra_op_threads": 2},
            "intra_op_threads 2 is more than --max-threads-per-session 1 (the limit)",
        ),
        (
            "onnxruntime",
            {"model": "simple", "instances": 10000},
            "instances 10000 is more than --max-instances-per-endpoint 16 (the limit)",
        ),
        (
            "onnxruntime",
            {"model": "simple", "instances": 10000, "device": "cuda:1"},
            "instances 10000 is more than --max-instances-per-endpoint 16 (the limit)",
        ),
        (
            "onnxruntime",
            {"model": "simple", "instances": 3, "device": "cpu"},
            "instances 3 is more than this node's 2 logical cores (the limit)",
        ),
        (
            "onnxruntime",
            {"model": "simple", "batch_size": 65},
            "batch_size 65 is more than --max-endpoint-batch-size 64 (the limit)",
        ),
        (
            "onnxruntime",
            {"model": "simple", "device": "cuda:0", "gpu_mem_limit": 10**12},
            "gpu_mem_limit 1000000000000 is more than the memory of cuda:0 (85899345920 bytes)",
        ),
        ("onnxruntime", {"model": "simple", "device": "cuda:7"}, "cuda:7"),
        ("echo", {"instances": 10000}, "--max-instances-per-endpoint 16"),
    ],
)
def test_numbers_beyond_the_bounds_are_refused_before_anything_starts(
    srv: ServerProcess, worker: str, params: dict[str, object], message: str
) -> None:
    assert message in refused(srv, worker, params)
    assert get(srv, f"/v2/workers/{worker}")[0] == 404


def test_share_false_cannot_grow_an_endpoint_past_the_bound(srv: ServerProcess) -> None:
    params: dict[str, object] = {"model": "identity_fp32", "device": "cpu", "instances": 2}
    status, body = post(srv, "/v2/workers/onnxruntime/load", params)
    assert status == 200, body
    name = body.decode()
    message = refused(srv, "onnxruntime", {**params, "share": False})
    assert "instances 3 is more than this node's 2 logical cores" in message
    assert get(srv, f"/v2/workers/{name}")[1]["instances"] == 2  # type: ignore[index]
    for _ in range(2):
        assert post(srv, f"/v2/workers/{name}/unload")[0] == 200
    assert get(srv, f"/v2/workers/{name}")[0] == 404


def test_a_slow_load_blocks_neither_other_loads_nor_inference(srv: ServerProcess) -> None:
    before = set(srv.worker_pids())
    slow: dict[str, object] = {}

    def load_slowly() -> None:
        slow["answer"] = post(
            srv, "/v2/workers/onnxruntime/load", {"model": "slow.onnx", "device": "cuda:1"}
        )

    thread = threading.Thread(target=load_slowly)
    thread.start()
    try:
        # The slow load's dedicated worker is up: its session is being created now.
        assert wait_for(lambda: set(srv.worker_pids()) - before, timeout=30)
        status, body = post(srv, "/v2/workers/echo/load", {})
        assert status == 200, body
        status, body = post(
            srv, "/v2/workers/onnxruntime/load", {"model": "identity_fp32", "device": "cpu"}
        )
        assert status == 200, body
        # The slow load took the bare name when it started; this one is the next.
        assert body == b"onnxruntime-0"
        fp32_infer(srv, "onnxruntime-0")
        fp32_infer(srv, "identity_fp32")
        assert thread.is_alive(), "the slow load finished first: nothing was shown"
    finally:
        thread.join(LOAD_TIMEOUT + 60)
    for name in ("echo", "onnxruntime-0", "onnxruntime"):
        assert post(srv, f"/v2/workers/{name}/unload")[0] == 200
    assert wait_for(lambda: set(srv.worker_pids()) == before, timeout=20)


def test_a_load_past_the_timeout_is_503_and_leaves_nothing(srv: ServerProcess) -> None:
    before = set(srv.worker_pids())
    started = time.monotonic()
    status, body = post(
        srv, "/v2/workers/onnxruntime/load", {"model": "slow.onnx", "device": "cuda:0"}
    )
    took = time.monotonic() - started
    assert status == 503, body
    message = json.loads(body)["error"]
    assert f"--load-timeout {LOAD_TIMEOUT:g}s" in message
    assert LOAD_TIMEOUT <= took < LOAD_TIMEOUT + 10
    # Its dedicated worker is gone, and so is the name: the next load gets it.
    assert wait_for(lambda: set(srv.worker_pids()) == before, timeout=10)
    assert get(srv, "/v2/workers/onnxruntime")[0] == 404
    assert get(srv, "/v2/models/onnxruntime")[0] == 404
    status, body = post(
        srv, "/v2/workers/onnxruntime/load", {"model": "identity_fp32", "device": "cpu"}
    )
    assert (status, body) == (200, b"onnxruntime")
    fp32_infer(srv, "onnxruntime")
    assert post(srv, "/v2/workers/onnxruntime/unload")[0] == 200
