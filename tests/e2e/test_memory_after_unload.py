"""Memory after unload (issue 39 item 4): load/unload cycles and failed loads leave the front
and the workers where they were after the first cycle, and /dev/shm as it was.

A smaller count than ``benchmarks/load_unload_memory.py`` (200 cycles, 50 failed loads): 30
cycles of a model with 16 MiB of weights (load, one inference, unload), 10 failed loads (a
model.onnx that is not ONNX, a config.pbtxt that does not parse), then one more good cycle.
The bound is the promise of docs/management.md: the RSS of the front and of each worker
within 10 % (or 20 MiB, the larger) of what it was after the first cycle.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.http import post
from tests.support.memory import MiB, proc_status
from tests.support.onnx_models import WEIGHTY, write_weighty_repository
from tests.support.server import ServerProcess, shm_entries, wait_for

MODEL = WEIGHTY
LAYERS = 4  # 4 MiB of weights each
CYCLES = 30
FAILED = 10
BROKEN = ("broken_onnx", "broken_config")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_weighty_repository(root, LAYERS)
    for name in BROKEN:
        shutil.copytree(root / MODEL, root / name)
    (root / "broken_onnx" / "1" / "model.onnx").write_bytes(b"not an ONNX file\n" * 64)
    (root / "broken_config" / "config.pbtxt").write_text("max_batch_size: [ not a number\n")
    return root


@pytest.fixture(scope="module")
def srv(repo: Path) -> Iterator[ServerProcess]:
    args = ["--devices", "cpu", "--instances-per-device", "2", "--model-control-mode", "explicit"]
    proc = ServerProcess(repo, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _cycle(srv: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    """Load, infer once, unload; returns once the model reports not ready."""
    status, body = post(srv, f"/v2/repository/models/{MODEL}/load")
    assert status == 200, body
    x = np.ones((1, 1024), np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 1024], "FP32")
    tensor.set_data_from_numpy(x)
    assert client.infer(MODEL, [tensor]).as_numpy("OUTPUT0").shape == (1, 1024)
    status, body = post(srv, f"/v2/repository/models/{MODEL}/unload")
    assert status == 200, body
    assert wait_for(lambda: not client.is_model_ready(MODEL), timeout=30)


def _rss(srv: ServerProcess) -> dict[str, int]:
    """RSS of the front and of each worker (by PID), in bytes."""
    found = {"front": proc_status(srv.process.pid, "VmRSS")}
    for pid in srv.worker_pids():
        found[f"worker {pid}"] = proc_status(pid, "VmRSS")
    return found


def _shm(srv: ServerProcess) -> dict[str, int]:
    """The server's /dev/shm entries with their sizes."""
    return {n: os.stat(f"/dev/shm/{n}").st_size for n in shm_entries(srv.process.pid)}


def _grown(first: dict[str, int], now: dict[str, int]) -> dict[str, str]:
    """The processes whose RSS grew past the bound (all processes of ``first`` must remain)."""
    return {
        name: f"{first[name] / MiB:.1f} -> {now.get(name, 0) / MiB:.1f} MiB"
        for name in first
        if name not in now or now[name] - first[name] > max(first[name] // 10, 20 * MiB)
    }


def test_memory_comes_back_after_unloads_and_failed_loads(srv: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(srv.host_port)
    try:
        _cycle(srv, client)
        first, shm = _rss(srv), _shm(srv)
        assert len(first) == 3, first  # the front and its two workers
        for _ in range(CYCLES - 1):
            _cycle(srv, client)
        for i in range(FAILED):
            name = BROKEN[i % len(BROKEN)]
            status, body = post(srv, f"/v2/repository/models/{name}/load")
            assert status == 400 and f"failed to load '{name}'".encode() in body, body
        _cycle(srv, client)  # the workers that saw the failures still serve
        # NOTE: waited for, not sampled once: the front's trimmer returns freed heap within
        #   a few seconds, on its own schedule.
        assert wait_for(lambda: not _grown(first, _rss(srv)), timeout=15, interval=0.5), _grown(
            first, _rss(srv)
        )
        assert _shm(srv) == shm
    finally:
        client.close()
