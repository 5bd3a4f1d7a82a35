"""With ``--low-load-colocation true``, at low load a CPU worker and its front run on one CPU;
under load they have every CPU again (``workers.colocation``, ``runtime.colocation``).

One client sending one request at a time is low load: the worker pins itself to the CPU
its front last ran on, and the front's loop follows. Eight clients at once give both back
every CPU they started with. By default nothing is pinned. With two fronts, a front left
pinned by a client that went away does not keep the next client's front from its worker,
and a worker whose client went away gives its CPU back.
Needs two usable CPUs (skipped on one).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from tests.support.raw_http import json_infer, read_response
from tests.support.server import ServerProcess, front_pid, socket_to_front, wait_for
from tests.support.tensors import SIMPLE_JSON
from workers.colocation import ENTER_TURNS, IDLE_UNPIN

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


def _pinned_by_one_client(server: ServerProcess) -> Callable[[], None]:
    """One client's requests, one at a time, until the worker is pinned; its ``send``."""
    send = _requests(server.url)

    def pinned() -> bool:
        send()
        return len(_worker_cpus(server)) == 1

    assert wait_for(pinned, timeout=60, interval=0), "one client at a time: never pinned"
    return send


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
    send = _pinned_by_one_client(colocating)
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


def test_a_worker_whose_client_went_away_gives_its_cpu_back(colocating: ServerProcess) -> None:
    """Left pinned, an idle worker would keep its CPU from the next pair (another instance
    beside another front): after IDLE_UNPIN asleep it takes back every CPU."""
    every = _worker_cpus(colocating)
    send = _pinned_by_one_client(colocating)
    assert wait_for(lambda: _worker_cpus(colocating) == every, timeout=10 * IDLE_UNPIN), (
        "the client stopped, and the worker stayed on one CPU"
    )
    send()  # and it still answers


def test_by_default_nothing_is_pinned(server: ServerProcess) -> None:
    every = _worker_cpus(server)
    send = _requests(server.url)
    for _ in range(300):  # ~10x the light turns that pin when on
        send()
    assert _worker_cpus(server) == every == _front_cpus(server)


def _send_on(sock: socket.socket) -> None:
    """One tiny JSON request on a connection held by a chosen front."""
    sock.sendall(json_infer("simple", orjson.dumps(SIMPLE_JSON)))
    status, _, body = read_response(sock)
    assert status == 200, body


def _pinned_beside(server: ServerProcess, sock: socket.socket, front: int, tries: int) -> bool:
    """Up to ``tries`` requests on ``sock`` (held by ``front``) until the worker runs on the
    front's one CPU."""
    for _ in range(tries):
        _send_on(sock)
        worker = _worker_cpus(server)
        if len(worker) == 1 and worker == os.sched_getaffinity(front):
            return True
    return False


def test_a_front_left_pinned_does_not_keep_the_next_clients_front_from_its_worker() -> None:
    """The client of the other front co-locates with the worker and goes away: that front
    stays pinned (it hears from the worker only on a reply). The next client comes to the
    primary front, on the same CPU: the worker pins beside it. (It used to count every
    pinned process of the server as another pair, and never did.)"""
    server = ServerProcess(
        args=["--low-load-colocation", "true", "--http-workers", "2"]
    ).wait_ready()
    try:
        extra, primary = front_pid(server, "extra front"), front_pid(server, "primary")
        with socket_to_front(server, extra) as first:
            assert _pinned_beside(server, first, extra, 2000), "never pinned beside the front"
            _send_on(first)  # its reply tells the front where its worker is
            (cpu,) = os.sched_getaffinity(extra)
        with socket_to_front(server, primary) as second:

            def given_back() -> bool:
                _send_on(second)
                return len(_worker_cpus(server)) > 1

            # Another front's request: the worker first gives back every CPU.
            assert wait_for(given_back, timeout=30, interval=0)
            # The primary's loop on the other front's CPU (where the scheduler may put it).
            os.sched_setaffinity(primary, {cpu})
            # Within a first look (ENTER_TURNS), well before a second (LOOK_TURNS later).
            assert _pinned_beside(server, second, primary, 2 * ENTER_TURNS), (
                "the worker did not pin beside the primary: the other front's old pin "
                "counted as another pair"
            )
        assert os.sched_getaffinity(extra) == {cpu}  # still pinned: the case at hand
    finally:
        server.stop()
