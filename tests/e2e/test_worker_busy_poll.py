"""A worker polls for its next request for ``--worker-busy-poll-us`` after a reply, then sleeps.

Read from the workers' CPU time (``/proc/<pid>/schedstat``, in nanoseconds) right after
a run of requests: a polling worker spends the window's time on a core, a sleeping one
none. The window is the largest the setting allows (100 ms), so that the difference is
far above what a heartbeat or a busy machine adds.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.server import ServerProcess
from tests.support.tensors import simple_inputs

#: CPU time read off a shared machine: behind the `perf` marker (benchmarks/README.md).
pytestmark = pytest.mark.perf

WINDOW_US = 100_000


def _cpu_ns(pids: list[int]) -> int:
    """Nanoseconds the processes ``pids`` have run on a core."""
    return sum(int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) for pid in pids)


@pytest.mark.parametrize("window_us", [WINDOW_US, 0])
def test_a_worker_polls_for_the_window_after_its_replies_then_sleeps(window_us: int) -> None:
    server = ServerProcess(args=["--worker-busy-poll-us", str(window_us)]).wait_ready()
    try:
        workers = server.worker_pids()
        assert workers
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            # NOTE: several requests close together: a worker polls only while its
            #   recent requests came within the window of each other.
            for _ in range(10):
                client.infer("simple", simple_inputs(a, a))
            # NOTE: these sleeps are the measurement's own windows, not waits on the server.
            start = _cpu_ns(workers)
            time.sleep(WINDOW_US / 2e6)
            during = _cpu_ns(workers) - start
            time.sleep(WINDOW_US / 1e6)  # the window is over
            start = _cpu_ns(workers)
            time.sleep(WINDOW_US / 2e6)
            after = _cpu_ns(workers) - start
    finally:
        assert server.stop() == 0, server.log
    half_window_ns = WINDOW_US * 1000 // 2
    if window_us:
        # A core's worth for half the window, on a machine that may give it less.
        assert during > half_window_ns // 4, f"{during / 1e6:.1f} ms of CPU while polling"
    else:
        assert during < half_window_ns // 10, f"{during / 1e6:.1f} ms of CPU while asleep"
    assert after < half_window_ns // 10, f"{after / 1e6:.1f} ms of CPU after the window"
