"""Triton's ONNX Runtime session parameters in config.pbtxt reach the worker's session.

``optimization { graph { level: N } }`` sets the session's graph optimization level as
Triton's ONNX Runtime backend maps it (-1 basic, 1 extended, 2 none, else all): the worker
reads the level back from its session, and ``/v2/hardware`` shows it for each instance.

``enable_mem_arena: "0"`` lets a worker give back what one large request took; with ONNX
Runtime's default arena it keeps it (issue #18: large buffers live in memory that is returned
to the OS). Real server, real
worker, its heap (RssAnon: shared-memory segments are not counted) read from /proc.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.http import get
from tests.support.memory import MiB, proc_status
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

_PARAMETER = 'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
MODELS = {
    "arena_default": {},
    "arena_off": {"enable_mem_arena": "0"},
    "arena_shrunk": {"memory.enable_memory_arena_shrinkage": "gpu:0;cpu:0"},
    "arena_bad": {"enable_mem_arena": "yes"},
}
#: optimization blocks, and the level each session must get (Triton's backend's table).
GRAPH_LEVELS = {
    "graph_basic": ("optimization { graph { level: -1 } }\n", "ORT_ENABLE_BASIC"),
    "graph_extended": ("optimization { graph { level: 1 } }\n", "ORT_ENABLE_EXTENDED"),
    "graph_none": (
        "optimization { graph { level: 2 } priority: PRIORITY_MAX }\n",
        "ORT_DISABLE_ALL",
    ),
    "arena_default": ("", "ORT_ENABLE_ALL"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("session_options")
    for name, parameters in MODELS.items():
        shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32" / "1", root / name / "1")
        config = "".join(_PARAMETER.format(key=k, value=v) for k, v in parameters.items())
        (root / name / "config.pbtxt").write_text(config)
    for name, (block, _) in GRAPH_LEVELS.items():
        if name not in MODELS:
            shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32" / "1", root / name / "1")
            (root / name / "config.pbtxt").write_text(block)
    proc = ServerProcess(root).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _infer(client: httpclient.InferenceServerClient, model: str, count: int) -> None:
    values = np.ones((1, count), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    assert client.infer(model, [tensor]).as_numpy("OUTPUT0").shape == values.shape


def _worker_heap_after(server: ServerProcess, model: str) -> int:
    """The worker's heap growth (bytes) after a 64 MiB request to ``model`` and a small one.

    ONNX Runtime shrinks an arena at the end of a run, while that run's outputs are still
    held, so what a large request took is given back at the end of the next one.
    """
    (worker,) = server.worker_pids()
    client = httpclient.InferenceServerClient(server.host_port, network_timeout=120)
    before = proc_status(worker, "RssAnon")
    _infer(client, model, 16 * MiB)
    _infer(client, model, 16)
    return proc_status(worker, "RssAnon") - before


def test_a_bad_value_fails_that_model_with_the_parameter_named(server: ServerProcess) -> None:
    # NOTE: closed by the with: the exception pytest.raises caught holds this frame in a
    #   cycle, and a client left to the collector may be closed in another thread, where
    #   tritonclient's HTTP client fails (gevent).
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert not client.is_model_ready("arena_bad")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert 'parameter \'enable_mem_arena\' must be "1" or "0"' in index["arena_bad"]["reason"]
        with pytest.raises(InferenceServerException):
            client.infer("arena_bad", [])


def test_arena_off_gives_the_memory_back(server: ServerProcess) -> None:
    # Order matters: the default arena keeps its 64 MiB, so it runs last.
    assert _worker_heap_after(server, "arena_off") < 16 * MiB
    assert _worker_heap_after(server, "arena_default") > 48 * MiB  # the test can see it


def test_shrinkage_naming_a_gpu_runs_on_a_cpu_session(server: ServerProcess) -> None:
    # Triton configs name "gpu:0;cpu:0" and the like; ONNX Runtime fails every run that
    # names an arena the session does not have, so the worker keeps only the CPU entry here.
    client = httpclient.InferenceServerClient(server.host_port, network_timeout=120)
    for _ in range(2):
        _infer(client, "arena_shrunk", 1024)


def test_the_graph_optimization_level_reaches_the_session(server: ServerProcess) -> None:
    status, hardware = get(server, "/v2/hardware")
    assert status == 200 and isinstance(hardware, dict)
    levels = {
        instance["model"]: instance["graph_optimization_level"]
        for device in hardware["devices"].values()
        for instance in device["instances"]
    }
    for name, (_, level) in GRAPH_LEVELS.items():
        assert levels[name] == level, name
        _infer(httpclient.InferenceServerClient(server.host_port), name, 4)
    # graph is honoured; the rest of optimization is still ignored, with a warning
    assert "config.pbtxt field 'optimization.priority' is not supported" in server.log
    assert "field 'optimization' is" not in server.log
    assert "field 'optimization.graph' is" not in server.log
