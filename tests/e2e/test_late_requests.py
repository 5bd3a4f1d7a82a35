"""A worker that comes to a request too late to end it by its deadline answers it without
running it (``workers/late.py``, ``Infer.expires``): a gRPC call's ``grpc-timeout`` and a
REST request's ``timeout`` parameter reach the worker that has the request.

One worker has about a second of work queued (calls of a chain of 16 1024 x 1024 MatMuls
on 1,024 rows, as many as that takes on this machine); calls with a deadline of 20 ms queue
behind them and are answered DEADLINE_EXCEEDED at their deadline; the worker then skips
them (a DEBUG line each) instead of running them, and a call after them is answered.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from queue import Queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import WEIGHTY, write_weighty_repository
from tests.support.server import ServerProcess, pending, wait_for

MODEL = WEIGHTY
LAYERS = 16
#: A long call's rows (34 GFLOP: 0.1 s on this project's 2-core machine); as many are queued
#: as take ``QUEUED_S`` there, and the calls behind them give up after ``DEADLINE_S``.
LONG_ROWS = 1024
QUEUED_S = 1.5
DEADLINE_S = 0.02
#: The DEBUG line of each request a worker skipped (and the INFO line that sums them).
SKIPPED = "ms left of its deadline"
SUMMED = "request(s) not run: too late to end by their deadline"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    write_weighty_repository(root, LAYERS, "instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    proc = ServerProcess(root, ["--devices", "cpu", "--log-level", "debug"]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log[-4000:]
    assert "Traceback" not in proc.log, proc.log[-4000:]


def _grpc(srv: ServerProcess, rows: int, timeout: float | None = None) -> np.ndarray:
    with grpcclient.InferenceServerClient(srv.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [rows, 1024], "FP32")
        tensor.set_data_from_numpy(np.ones((rows, 1024), np.float32))
        return client.infer(MODEL, [tensor], client_timeout=timeout).as_numpy("OUTPUT0")


def _rest(srv: ServerProcess, rows: int, timeout_us: int) -> np.ndarray:
    with httpclient.InferenceServerClient(srv.host_port, network_timeout=60) as client:
        tensor = httpclient.InferInput("INPUT0", [rows, 1024], "FP32")
        tensor.set_data_from_numpy(np.ones((rows, 1024), np.float32), binary_data=True)
        return client.infer(MODEL, [tensor], timeout=timeout_us).as_numpy("OUTPUT0")


def test_requests_past_their_deadline_in_a_workers_queue_are_not_run(
    srv: ServerProcess,
) -> None:
    started = time.monotonic()
    _grpc(srv, LONG_ROWS)
    count = min(64, max(2, math.ceil(QUEUED_S / (time.monotonic() - started))))
    done: Queue[object] = Queue()
    with grpcclient.InferenceServerClient(srv.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [LONG_ROWS, 1024], "FP32")
        tensor.set_data_from_numpy(np.ones((LONG_ROWS, 1024), np.float32))
        for _ in range(count):  # sent at once, queued in the worker one after another
            client.async_infer(MODEL, [tensor], lambda result, error: done.put(error or result))
        # Every long call reached the front (some may be answered already) before the
        # late ones, so they are behind them in the one worker's queue.
        assert wait_for(lambda: pending(srv, MODEL) + done.qsize() >= count), srv.log[-4000:]
        late = [lambda: _grpc(srv, 64, DEADLINE_S), lambda: _rest(srv, 64, int(DEADLINE_S * 1e6))]
        for send in late * 2:
            with pytest.raises(InferenceServerException, match="(?i)deadline"):
                send()
        assert done.qsize() < count, "the long calls ended before the others' deadlines"
        results = [done.get(timeout=120) for _ in range(count)]
    assert all(getattr(r, "as_numpy", None) for r in results), results
    assert _grpc(srv, 1).shape == (1, 1024)  # the worker went on past the four it skipped
    assert wait_for(lambda: srv.log.count(SKIPPED) == 4, timeout=10), srv.log[-4000:]
    assert SUMMED in srv.log
