"""Dynamic batching end to end: batches form, answers go to their own requests, the queue
policies answer 503, and a request whose client went away never runs.

The sample model ``batched`` answers OUTPUT0 = INPUT0 + 1, TEXT_OUT = TEXT and, in ROWS,
the row count of the execution it ran in: a request sees whether it ran alone. To keep
requests queued on purpose, the tests stop the one worker with SIGSTOP: the request
sent to it holds the only instance, and whatever comes next waits in the queue.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.batching import hold_the_instance
from tests.support.raw_http import json_infer, read_response
from tests.support.server import (
    SAMPLE_REPOSITORY,
    ServerProcess,
    pending,
    stays,
    steadily,
    wait_for,
)

POLICIES = {
    "batched": "max_queue_delay_microseconds: 2000",
    "small_queue": "default_queue_policy { max_queue_size: 2 }",
    "timeouts": (
        "default_queue_policy { default_timeout_microseconds: 400000 allow_timeout_override: true }"
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batching")
    source = SAMPLE_REPOSITORY / "batched"
    config = (source / "config.pbtxt").read_text()
    head = config[: config.index("dynamic_batching")]
    for name, policy in POLICIES.items():
        shutil.copytree(source / "1", root / name / "1")
        text = head.replace('name: "batched"', f'name: "{name}"')
        (root / name / "config.pbtxt").write_text(f"{text}dynamic_batching {{ {policy} }}\n")
    proc = ServerProcess(root).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _inputs(module: object, values: np.ndarray, texts: list[bytes], binary: bool) -> list:
    x = module.InferInput("INPUT0", list(values.shape), "FP32")  # type: ignore[attr-defined]
    t = module.InferInput("TEXT", [len(texts), 1], "BYTES")  # type: ignore[attr-defined]
    if module is httpclient:
        x.set_data_from_numpy(values, binary_data=binary)
        t.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1), binary_data=binary)
    else:
        x.set_data_from_numpy(values)
        t.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
    return [x, t]


def _request(seed: int) -> tuple[np.ndarray, list[bytes]]:
    rows = 1 + seed % 3
    values = (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + seed * 100).astype(
        np.float32
    )
    return values, [f"req-{seed}-row-{r}".encode() for r in range(rows)]


def _check(result: object, values: np.ndarray, texts: list[bytes]) -> int:
    """Assert the answer is this request's own; returns the rows of its execution."""
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values + 1)  # type: ignore[attr-defined]
    got = [t if isinstance(t, bytes) else t.encode() for t in result.as_numpy("TEXT_OUT").ravel()]  # type: ignore[attr-defined]
    assert got == texts
    rows = result.as_numpy("ROWS").ravel()  # type: ignore[attr-defined]
    assert len(rows) == len(values) and len(set(rows.tolist())) == 1
    return int(rows[0])


def test_concurrent_requests_are_batched_and_each_answer_is_its_own(
    server: ServerProcess,
) -> None:
    """Hundreds of requests over REST (JSON, binary) and gRPC, with distinct values."""
    local = threading.local()

    def one(seed: int) -> tuple[int, int]:
        if not hasattr(local, "http"):
            local.http = httpclient.InferenceServerClient(server.host_port)
            local.grpc = grpcclient.InferenceServerClient(server.grpc_url)
        values, texts = _request(seed)
        kind = seed % 3
        if kind == 2:
            result = local.grpc.infer("batched", _inputs(grpcclient, values, texts, True))
        else:
            inputs = _inputs(httpclient, values, texts, binary=kind == 1)
            result = local.http.infer("batched", inputs)
        return len(values), _check(result, values, texts)

    with ThreadPoolExecutor(24) as pool:
        outcomes = list(pool.map(one, range(360)))
    joined = [(own, ran) for own, ran in outcomes if ran > own]
    assert joined, "no request ever shared an execution with another"
    assert all(ran <= 16 for _, ran in outcomes)  # max_batch_size
    # The statistics say the same: fewer executions than inferences, batches above 1.
    (stats,) = httpclient.InferenceServerClient(server.host_port).get_inference_statistics(
        "batched"
    )["model_stats"]
    assert stats["inference_stats"]["success"]["count"] == 360
    assert stats["inference_count"] == sum(own for own, _ in outcomes)
    assert stats["execution_count"] < stats["inference_count"]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert max(sizes) > 3 and sum(sizes.values()) == stats["execution_count"]
    assert sum(size * count for size, count in sizes.items()) == stats["inference_count"]


@contextmanager
def _worker_stopped(server: ServerProcess) -> Iterator[None]:
    (worker,) = server.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(worker, signal.SIGCONT)


def _send(server: ServerProcess, pool: ThreadPoolExecutor, model: str, seed: int) -> Future:
    """Send a request in the background, on a connection of its own."""
    client = httpclient.InferenceServerClient(server.host_port, network_timeout=60)
    return pool.submit(client.infer, model, _inputs(httpclient, *_request(seed), True))


class _JsonAnswer:
    """A JSON inference answer read off a socket, with tritonclient's ``as_numpy``."""

    def __init__(self, sock: socket.socket) -> None:
        with sock:
            status, _, body = read_response(sock)
        assert status == 200, body
        self.outputs = {o["name"]: o for o in json.loads(body)["outputs"]}

    def as_numpy(self, name: str) -> np.ndarray:
        output = self.outputs[name]
        kind = object if output["datatype"] == "BYTES" else None
        return np.array(output["data"], dtype=kind).reshape(output["shape"])


def _holding_the_instance(server: ServerProcess, model: str, pool: ThreadPoolExecutor):  # noqa: ANN202
    """Send one request that the stopped worker takes: the only instance is then busy.

    The answer (read in ``pool``) comes once the worker goes on."""
    sock = hold_the_instance(server, model, _json_body(1))
    return (pool.submit(_JsonAnswer, sock), *_request(1))


def test_full_queue_answers_503(server: ServerProcess) -> None:
    with ThreadPoolExecutor(4) as pool:
        with _worker_stopped(server):
            running, values, texts = _holding_the_instance(server, "small_queue", pool)
            queued = [_send(server, pool, "small_queue", seed) for seed in (2, 3)]
            assert wait_for(steadily(lambda: pending(server, "small_queue") == 2), 10)
            # NOTE: closed by the with: `e` holds this frame in a cycle, and a client left to
            #   the collector may be closed in another thread, where tritonclient fails.
            with (
                httpclient.InferenceServerClient(server.host_port) as refused,
                pytest.raises(InferenceServerException, match="Exceeds maximum queue size") as e,
            ):
                refused.infer("small_queue", _inputs(httpclient, *_request(4), True))
            assert e.value.status() == "503"
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            with pytest.raises(InferenceServerException, match="Exceeds maximum queue size") as e:
                grpc.infer("small_queue", _inputs(grpcclient, *_request(5), True))
            assert e.value.status() == "StatusCode.UNAVAILABLE"
        _check(running.result(30), values, texts)
        for seed, future in zip((2, 3), queued, strict=True):
            assert _check(future.result(30), *_request(seed)) >= 1
    (stats,) = grpc.get_inference_statistics("small_queue").model_stats
    assert (stats.inference_stats.success.count, stats.inference_stats.fail.count) == (3, 2)
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert (
        'nv_inference_request_failure{model="small_queue",version="1",reason="REJECTED"} 2' in text
    )
    assert 'nv_inference_pending_request_count{model="small_queue",version="1"} 0' in text


def test_queue_timeout_answers_503_while_the_instance_is_still_busy(
    server: ServerProcess,
) -> None:
    with ThreadPoolExecutor(4) as pool:
        with _worker_stopped(server):
            running, values, texts = _holding_the_instance(server, "timeouts", pool)
            # NOTE: closed by the with (see test_full_queue_answers_503).
            with httpclient.InferenceServerClient(server.host_port) as client:
                started = time.monotonic()
                with pytest.raises(InferenceServerException, match="Request timeout expired") as e:
                    client.infer("timeouts", _inputs(httpclient, *_request(2), True))
                assert e.value.status() == "503"
                assert 0.35 < time.monotonic() - started < 5  # the config's 400 ms
                started = time.monotonic()  # a shorter timeout of the request's own
                with pytest.raises(InferenceServerException, match="Request timeout expired"):
                    client.infer(
                        "timeouts", _inputs(httpclient, *_request(3), True), timeout=50_000
                    )
                assert time.monotonic() - started < 0.35
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            with pytest.raises(InferenceServerException, match="Request timeout expired") as e:
                grpc.infer("timeouts", _inputs(grpcclient, *_request(4), True))
            assert e.value.status() == "StatusCode.UNAVAILABLE"
        _check(running.result(30), values, texts)


def _json_body(seed: int) -> bytes:
    """Request ``seed`` of ``_request`` as a JSON body."""
    values, texts = _request(seed)
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": list(values.shape), "datatype": "FP32",
                 "data": values.ravel().tolist()},
                {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES",
                 "data": [t.decode() for t in texts]},
            ]
        }
    ).encode()  # fmt: skip


def _raw_json_request(server: ServerProcess, seed: int) -> socket.socket:
    """Send a whole JSON request on a raw socket and return it unread."""
    host, port = server.host_port.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(json_infer("batched", _json_body(seed)))
    return sock


def test_a_request_whose_client_went_away_never_runs(server: ServerProcess) -> None:
    with ThreadPoolExecutor(4) as pool:
        with _worker_stopped(server):
            running, values, texts = _holding_the_instance(server, "batched", pool)
            gone = _raw_json_request(server, 7)  # queued behind the stopped worker
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            cancelled = grpc.async_infer(
                "batched", _inputs(grpcclient, *_request(8), True), callback=lambda *_: None
            )
            assert wait_for(steadily(lambda: pending(server) == 2), 10), pending(server)
            gone.close()  # the REST client goes away
            cancelled.cancel()  # the gRPC client cancels
            assert wait_for(lambda: pending(server) == 0, 10), pending(server)
            kept = _send(server, pool, "batched", 9)
            assert wait_for(steadily(lambda: pending(server) == 1), 10), pending(server)
        _check(running.result(30), values, texts)
        # Had either withdrawn request stayed queued, it would have run with this one.
        assert _check(kept.result(30), *_request(9)) == len(_request(9)[0])
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'nv_inference_request_failure{model="batched",version="1",reason="CANCELED"} 2' in text
    assert stays(lambda: "Traceback" not in server.log, 1), server.log


def test_a_request_of_no_rows_is_counted_as_a_batch_of_none(server: ServerProcess) -> None:
    """A [0, 4] request through the batcher: its execution is a batch of size 0, as an
    unbatched model's is. It was counted as size 1, so batch_stats summed to more rows than
    inference_count (found by fuzzing). Classification keeps its width: [0, k]."""
    client = httpclient.InferenceServerClient(server.host_port)

    def batches() -> dict[int, int]:
        (stats,) = client.get_inference_statistics("timeouts")["model_stats"]
        return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}

    before = batches()
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", class_count=2)]
    result = client.infer("timeouts", _inputs(httpclient, np.zeros((0, 4), np.float32), [], True))
    assert result.as_numpy("OUTPUT0").shape == (0, 4)
    inputs = _inputs(httpclient, np.zeros((0, 4), np.float32), [], True)
    classified = client.infer("timeouts", inputs, outputs=outputs)
    assert classified.as_numpy("OUTPUT0").shape == (0, 2)
    after = batches()
    assert after.get(0, 0) - before.get(0, 0) == 2 and after.get(1) == before.get(1), after
    client.close()


def test_a_request_failed_while_its_batch_ran_is_counted_once(server: ServerProcess) -> None:
    """A request whose deadline passes while its batch runs gets its 503 and is counted
    as that failure only. It was counted as a success as well once the batch ended, so
    the statistics had more answers than requests (found by fuzzing)."""
    client = httpclient.InferenceServerClient(server.host_port)

    def counts() -> tuple[int, int, int]:
        (stats,) = client.get_inference_statistics("batched")["model_stats"]
        inference = stats["inference_stats"]
        return inference["success"]["count"], inference["fail"]["count"], stats["execution_count"]

    before = counts()
    body = json.loads(_json_body(1))
    body["parameters"] = {"timeout": 100_000}  # 0.1 s, past while the worker is stopped
    with _worker_stopped(server):
        held = hold_the_instance(server, "batched", json.dumps(body).encode())
        with held:
            status, _, answer = read_response(held)
        assert status == 503, answer
    assert wait_for(lambda: counts()[2] == before[2] + 1, 10)  # the batch ran, then
    assert counts()[:2] == (before[0], before[1] + 1)
    client.close()
