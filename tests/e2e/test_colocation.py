"""With ``--low-load-colocation true``, at low load a CPU worker and its front run on one CPU;
under load they have every CPU again (``workers.colocation``, ``runtime.colocation``).

One client sending one request at a time is low load: the worker pins itself to the CPU
its front last ran on, and the front's loop follows. Eight clients at once give both back
every CPU they started with. By default nothing is pinned. Needs two usable CPUs (skipped
on one).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, wait_for

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="co-location needs two usable CPUs"
)


def _inputs() -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for given in inputs:
        given.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    return inputs


def _requests(url: str) -> Callable[[], None]:
    """One tiny request on one keep-alive connection, each call."""
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    inputs = _inputs()

    def send() -> None:
        client.infer("simple", inputs)

    return send


def _worker_cpus(server: ServerProcess) -> set[int]:
    (pid,) = server.worker_pids()
    return os.sched_getaffinity(pid)


def _front_cpus(server: ServerProcess) -> set[int]:
    """Where the front's loop thread (its main thread) may run."""
    return os.sched_getaffinity(server.process.pid)


@pytest.fixture(scope="module")
def colocating() -> Iterator[ServerProcess]:
    proc = ServerProcess(args=["--low-load-colocation", "true"]).wait_ready()
    yield proc
    proc.stop()


def test_one_client_at_a_time_puts_the_worker_on_its_fronts_cpu_and_load_spreads_it(
    colocating: ServerProcess,
) -> None:
    every = _worker_cpus(colocating)
    assert len(every) >= 2
    send = _requests(colocating.url)

    def pinned() -> bool:
        send()
        return len(_worker_cpus(colocating)) == 1

    assert wait_for(pinned, timeout=60, interval=0), "one client at a time: never pinned"
    send()  # the next reply tells the front where its worker is
    assert _front_cpus(colocating) == _worker_cpus(colocating)

    stop = threading.Event()

    def client() -> None:
        more = _requests(colocating.url)
        while not stop.is_set():
            more()

    clients = [threading.Thread(target=client) for _ in range(8)]
    for thread in clients:
        thread.start()
    try:
        spread = wait_for(
            lambda: _worker_cpus(colocating) == every == _front_cpus(colocating), timeout=60
        )
    finally:
        stop.set()
        for thread in clients:
            thread.join(30)
    assert spread, "eight clients at once: the worker or its front stayed on one CPU"
    send()  # and it still answers


def test_by_default_nothing_is_pinned(server: ServerProcess) -> None:
    every = _worker_cpus(server)
    send = _requests(server.url)
    for _ in range(300):  # ~10x the light turns that pin when on
        send()
    assert _worker_cpus(server) == every == _front_cpus(server)
