"""Every inference has a deadline, and a worker that stops answering is replaced.

Issue #18 found that with a worker SIGSTOPped for 10 s, requests waited the full 10 s and
``/v2/health/ready`` said ready throughout. Here the worker is stopped on purpose: its
requests must fail at their deadline (503 / DEADLINE_EXCEEDED), and, past the heartbeat
timeout, the server must say it is not ready and replace the worker.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.batching import hold_the_instance
from tests.support.metrics import scrape
from tests.support.onnx_models import WEIGHTY, write_weighty_repository
from tests.support.raw_http import read_response
from tests.support.server import ServerProcess, failures, wait_for


def _simple(module: object) -> list:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),  # type: ignore[attr-defined]
        module.InferInput("INPUT1", [1, 16], "INT32"),  # type: ignore[attr-defined]
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


#: ``_batched``'s request as a JSON body.
BATCHED_JSON = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
            {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["t"]},
        ]
    }
).encode()


def _batched(module: object) -> list:
    x = module.InferInput("INPUT0", [1, 4], "FP32")  # type: ignore[attr-defined]
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    text = module.InferInput("TEXT", [1, 1], "BYTES")  # type: ignore[attr-defined]
    text.set_data_from_numpy(np.array([[b"t"]], dtype=object))
    return [x, text]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """Deadline 1 s by default; a heartbeat timeout long enough not to interfere."""
    proc = ServerProcess(
        args=["--infer-timeout", "1", "--worker-heartbeat-timeout", "60"]
    ).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _stopped(server: ServerProcess) -> int:
    (worker,) = server.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    return worker


def test_a_stalled_worker_fails_requests_at_their_deadline(server: ServerProcess) -> None:
    # NOTE: closed by the with, not by garbage collection: `info` holds this frame in a
    #   cycle, so the clients lived on until a collector pass, which could run in another
    #   test's thread, where tritonclient's HTTP client fails to close (gevent).
    with (
        httpclient.InferenceServerClient(server.host_port, network_timeout=30) as client,
        grpcclient.InferenceServerClient(server.grpc_url) as grpc,
    ):
        worker = _stopped(server)
        try:
            started = time.monotonic()
            with pytest.raises(InferenceServerException, match="deadline") as info:
                client.infer("simple", _simple(httpclient))
            assert info.value.status() == "503"
            assert 0.9 < time.monotonic() - started < 5  # --infer-timeout 1
            started = time.monotonic()  # the request's own, shorter timeout (µs)
            with pytest.raises(InferenceServerException, match="deadline"):
                client.infer("simple", _simple(httpclient), timeout=200_000)
            assert time.monotonic() - started < 0.9
            with pytest.raises(InferenceServerException, match="deadline") as info:
                grpc.infer("simple", _simple(grpcclient))
            assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            # A model with dynamic batching: the queued request leaves the queue at its deadline.
            with pytest.raises(InferenceServerException, match="deadline"):
                client.infer("batched", _batched(httpclient), timeout=200_000)
        finally:
            os.kill(worker, signal.SIGCONT)
        # The worker answers the stale requests; their answers are dropped and it serves on.
        result = client.infer("simple", _simple(httpclient))
        assert result.as_numpy("OUTPUT0").tolist() == [list(range(0, 32, 2))]
        assert client.infer("batched", _batched(httpclient)).as_numpy("ROWS").tolist() == [[1]]
        stats = client.get_inference_statistics("simple")["model_stats"][0]
        assert stats["inference_stats"]["fail"]["count"] >= 3


def test_a_grpc_client_deadline_withdraws_its_request(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    worker = _stopped(server)
    try:
        # Holds the only instance (and fails at the server's 1 s deadline).
        with hold_the_instance(server, "batched", BATCHED_JSON) as held:
            with pytest.raises(InferenceServerException) as info:
                grpc.infer("batched", _batched(grpcclient), client_timeout=0.3)  # queued
            assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            status, _, answer = read_response(held)
            assert status == 503 and b"deadline" in answer, (status, answer)
    finally:
        os.kill(worker, signal.SIGCONT)
    assert grpc.infer("batched", _batched(grpcclient)).as_numpy("ROWS").tolist() == [[1]]
    # The server saw the call end: the queued request was withdrawn, never run.
    assert failures(server, "CANCELED") == 1


def test_a_hung_worker_is_declared_unhealthy_and_replaced() -> None:
    proc = ServerProcess(
        args=["--worker-heartbeat-interval", "0.2", "--worker-heartbeat-timeout", "1"]
    ).wait_ready()
    try:
        client = httpclient.InferenceServerClient(proc.host_port, network_timeout=30)
        sender = httpclient.InferenceServerClient(proc.host_port, network_timeout=30)
        worker = _stopped(proc)
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(sender.infer, "simple", _simple(httpclient))
            # Not ready while the worker is being replaced, then ready with a new one.
            assert wait_for(lambda: not client.is_server_ready(), 10), proc.log
            with pytest.raises(InferenceServerException) as info:
                stuck.result(10)  # the request on the hung worker: a clean 503, no hang
            assert info.value.status() == "503"
            # NOTE: closed in the thread that used it (tritonclient's gevent pool).
            pool.submit(sender.close).result(10)
        assert wait_for(lambda: proc.worker_pids() and worker not in proc.worker_pids(), 30)
        assert wait_for(client.is_server_ready, 60), proc.log
        assert client.infer("simple", _simple(httpclient)).as_numpy("OUTPUT1").shape == (1, 16)
        assert not os.path.exists(f"/proc/{worker}") or "Z" in open(f"/proc/{worker}/stat").read()
        client.close()
    finally:
        assert proc.stop() == 0, proc.log
    assert "stopped answering its heartbeat" in proc.log


@pytest.fixture(scope="module")
def weighty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One worker of ``WEIGHTY`` (~0.3-3 s a run here) for the two tests below, which read
    its statistics as differences from before each test."""
    root = tmp_path_factory.mktemp("weighty")
    write_weighty_repository(root, layers=32)  # [512, 1024] in
    proc = ServerProcess(root, ["--instances-per-device", "1"]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _since(before: tuple[int, int, int], now: tuple[int, int, int]) -> tuple[int, ...]:
    return tuple(n - b for n, b in zip(now, before, strict=True))


def test_a_run_past_its_requests_deadline_counts_as_an_execution(weighty: ServerProcess) -> None:
    """The request fails at its deadline while its worker runs it (503, REJECTED); the run
    counts as an execution all the same, as a batched one's does (Triton counts every model
    run). A model without dynamic batching did not count it (found by fuzzing)."""
    proc = weighty
    with httpclient.InferenceServerClient(proc.host_port, network_timeout=60) as client:

        def counts() -> tuple[int, int, int]:
            (stats,) = client.get_inference_statistics(WEIGHTY)["model_stats"]
            inference = stats["inference_stats"]
            return (
                inference["success"]["count"], inference["fail"]["count"],
                stats["execution_count"],
            )  # fmt: skip

        before = counts()
        given = httpclient.InferInput("INPUT0", [512, 1024], "FP32")
        given.set_data_from_numpy(np.ones((512, 1024), np.float32))
        with pytest.raises(InferenceServerException, match="deadline") as info:
            client.infer(WEIGHTY, [given], timeout=20_000)  # 20 ms: it is running then
        assert info.value.status() == "503"
        assert wait_for(lambda: _since(before, counts())[2] == 1, 60)  # once the run ends
        assert _since(before, counts()) == (0, 1, 1)


def test_a_cancelled_request_its_worker_runs_counts_as_an_execution(weighty: ServerProcess) -> None:
    """A gRPC call cancelled once its worker has it (it is pending from its send on): the
    run the worker makes all the same counts as an execution when it ends, as one past its
    deadline does (Triton counts every model run); the call is a CANCELED failure. It went
    uncounted, so the average batch size and the executions read wrong (found by fuzzing)."""
    proc = weighty
    client = grpcclient.InferenceServerClient(proc.grpc_url)

    def counts() -> tuple[int, int, int]:
        stats = client.get_inference_statistics(WEIGHTY, as_json=True)["model_stats"][0]
        inference = stats["inference_stats"]
        return (
            int(inference["success"].get("count", 0)),
            int(inference["fail"].get("count", 0)),
            int(stats.get("execution_count", 0)),
        )

    def pending() -> float:
        page = scrape(proc.metrics_url)
        return page.value("nv_inference_pending_request_count", WEIGHTY)

    before = counts()
    given = grpcclient.InferInput("INPUT0", [512, 1024], "FP32")
    given.set_data_from_numpy(np.ones((512, 1024), np.float32))
    ended: list[object] = []
    call = client.async_infer(WEIGHTY, [given], lambda result, error: ended.append(error))
    assert wait_for(lambda: pending() == 1, 60)  # sent to the worker
    call.cancel()
    assert wait_for(lambda: ended, 30)
    # once the run ends
    assert wait_for(lambda: pending() == 0 and _since(before, counts())[2] == 1, 60)
    assert _since(before, counts()) == (0, 1, 1)
    client.close()
