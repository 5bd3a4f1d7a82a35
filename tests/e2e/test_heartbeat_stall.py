"""A stalled front never kills its healthy worker (issue #37, item 2, last clause).

The probe's CONTINUATION flood held the front's event loop for 18-37 s. When the loop came
back, it ran its overdue heartbeat check before it read the worker's echo waiting in the
socket (libuv runs timers before it polls), took the worker's silence for a hang and
killed it: every model unavailable until the replacement. The front stopped with SIGSTOP
is the same stall, without the flood: it must find its worker's echo and carry on. A
stopped WORKER is still declared hung and replaced (test_deadlines.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, process_state, stays, wait_for

INTERVAL = 0.2
TIMEOUT = 1.0
#: Seconds the front is held stopped: two heartbeat timeouts (ten intervals).
STALL = 2 * TIMEOUT
#: Seconds after the front resumes within which a replacement would have shown (the
#: overdue check runs at once); watched for that long, with a wide margin (ten intervals).
WATCH = 2 * TIMEOUT


@pytest.fixture
def proc() -> Iterator[ServerProcess]:
    server = ServerProcess(
        args=[
            "--worker-heartbeat-interval",
            str(INTERVAL),
            "--worker-heartbeat-timeout",
            str(TIMEOUT),
        ]
    ).wait_ready()
    try:
        yield server
    finally:
        os.kill(server.process.pid, signal.SIGCONT)  # NOTE: never leave it stopped
        assert server.stop() == 0, server.log


def _sums(client: httpclient.InferenceServerClient) -> list[int]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    result = client.infer("simple", inputs)
    return result.as_numpy("OUTPUT0").tolist()[0]


def _trouble(server: ServerProcess) -> bool:
    """A hang was declared or a worker replaced (the log says either)."""
    log = server.log
    return "hung" in log or "died" in log or "replacement" in log


def test_a_stopped_front_keeps_its_healthy_worker(proc: ServerProcess) -> None:
    front = proc.process.pid
    (worker,) = proc.worker_pids()
    expected = list(range(0, 32, 2))
    with httpclient.InferenceServerClient(proc.host_port, network_timeout=30) as client:
        assert _sums(client) == expected
        # A few heartbeats were sent and answered: the worker is up to date.
        assert stays(lambda: not _trouble(proc), 3 * INTERVAL), proc.log
        os.kill(front, signal.SIGSTOP)
        try:
            assert wait_for(lambda: process_state(front) in ("T", "t"), 10), process_state(front)
            time.sleep(STALL)  # NOTE: the stall itself (the stimulus), not a check
        finally:
            os.kill(front, signal.SIGCONT)
        assert wait_for(lambda: process_state(front) not in ("T", "t"), 10)
        # The front's overdue checks ran as it resumed; nothing may come of them.
        assert stays(lambda: not _trouble(proc) and proc.worker_pids() == [worker], WATCH), proc.log
        assert _sums(client) == expected
        assert proc.worker_pids() == [worker]
    assert "hung" not in proc.log and "died" not in proc.log, proc.log
