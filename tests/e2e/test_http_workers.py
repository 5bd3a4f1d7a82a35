"""``--http-workers N``: N processes serve the HTTP port over one worker pool.

The primary front starts N-1 others (``oipserve.scaleout``); the kernel spreads new
connections across all of them (``SO_REUSEPORT``). A replica answers inference of
unbatched repository models itself, straight to the workers, and forwards everything
else to the primary. These tests hold many keep-alive connections (``Fronts``), see in
``/proc`` which process holds each one, and check that every connection, whichever
front it landed on, sees one server: the same answers, statistics, regions and
models.

Knowing without timing that a replica answered by itself: while the primary is
SIGSTOPped, the connections a replica holds are still answered.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from oipserve.config.settings import GRPC_PROCESSES_DEPRECATED
from tests.support.cli import run_serve
from tests.support.server import (
    ServerProcess,
    alive,
    pending,
    shm_entries,
    stays,
    steadily,
    tcp_links,
    wait_for,
)
from tests.support.tensors import SimpleRegion, simple_inputs, simple_region

FRONTS = 2
#: Enough connections that each front gets some (all on one: 2**-15 with two fronts).
CONNECTIONS = 16


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """Two HTTP fronts; a heartbeat timeout that outlasts a stopped primary."""
    args = ["--http-workers", str(FRONTS), "--worker-heartbeat-timeout", "60"]
    proc = ServerProcess(args=[*args, "--allow-client-shm", "true"]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


class Fronts:
    """``CONNECTIONS`` keep-alive connections and, for each, the pid of the front holding it."""

    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        self.connections = [
            http.client.HTTPConnection("127.0.0.1", proc.port, timeout=30)
            for _ in range(CONNECTIONS)
        ]
        for connection in self.connections:
            assert get(connection, "/v2/health/live")[0] == 200
        self.holder = self._holders()

    def _holders(self) -> list[int]:
        fronts = [self.proc.process.pid, *self.proc.http_front_pids()]
        by_port = {}
        for pid in fronts:
            for local, remote in tcp_links(pid):
                if local == self.proc.port:
                    by_port[remote] = pid
        return [by_port[c.sock.getsockname()[1]] for c in self.connections]  # type: ignore[union-attr]

    def on(self, pid: int) -> list[http.client.HTTPConnection]:
        return [c for c, holder in zip(self.connections, self.holder, strict=True) if holder == pid]

    def close(self) -> None:
        for connection in self.connections:
            connection.close()


@contextmanager
def fronts(proc: ServerProcess) -> Iterator[Fronts]:
    held = Fronts(proc)
    try:
        yield held
    finally:
        held.close()


def get(connection: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, response.read()


def post(connection: http.client.HTTPConnection, path: str, body: object) -> tuple[int, dict]:
    connection.request(
        "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    data = response.read()
    return response.status, json.loads(data) if data else {}


def simple_body(seed: int, **parameters: object) -> tuple[dict, list[int], list[int]]:
    a = [(seed * 7 + i) % 1000 for i in range(16)]
    b = [(seed * 3 + i) % 100 for i in range(16)]
    body: dict = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b},
        ]
    }
    if parameters:
        body["parameters"] = parameters
    pairs = list(zip(a, b, strict=True))
    return body, [x + y for x, y in pairs], [x - y for x, y in pairs]


#: One row for the model ``batched`` (dynamic batching).
BATCHED_BODY = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4},
        {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]},
    ]
}


def infer_simple(connection: http.client.HTTPConnection, seed: int) -> None:
    body, total, difference = simple_body(seed)
    status, answer = post(connection, "/v2/models/simple/infer", body)
    assert status == 200, answer
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    assert outputs == {"OUTPUT0": total, "OUTPUT1": difference}


def stats_of(proc: ServerProcess, model: str) -> dict:
    with urllib.request.urlopen(f"{proc.url}/v2/models/{model}/stats", timeout=30) as resp:
        (entry,) = json.load(resp)["model_stats"]
    return entry


def metric(proc: ServerProcess, name: str, model: str) -> float:
    with urllib.request.urlopen(proc.metrics_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    key = f'{name}{{model="{model}",version="1"}} '
    (line,) = [ln for ln in text.splitlines() if ln.startswith(key)]
    return float(line.split()[-1])


# ---- processes and connections --------------------------------------------------------


def test_the_other_fronts_are_children_and_connect_to_every_worker(server: ServerProcess) -> None:
    replicas = server.http_front_pids()
    assert len(replicas) == FRONTS - 1, server.log
    for pid in replicas:
        assert wait_for(lambda pid=pid: f"front pid {pid} connected" in server.log, 10)


def test_connections_are_spread_and_every_answer_is_right(server: ServerProcess) -> None:
    with fronts(server) as held:
        assert set(held.holder) == {server.process.pid, *server.http_front_pids()}, held.holder
        for round_ in range(5):
            for index, connection in enumerate(held.connections):
                infer_simple(connection, round_ * 100 + index)


def test_a_replica_answers_inference_while_the_primary_is_stopped(server: ServerProcess) -> None:
    primary = server.process.pid
    with fronts(server) as held:
        (replica,) = server.http_front_pids()
        theirs = held.on(replica)
        assert theirs, held.holder
        os.kill(primary, signal.SIGSTOP)
        try:
            for seed, connection in enumerate(theirs):
                infer_simple(connection, seed)
        finally:
            os.kill(primary, signal.SIGCONT)
        # And the primary's connections are answered again once it runs.
        for seed, connection in enumerate(held.on(primary)):
            infer_simple(connection, seed)


# ---- one server, whichever front answers ----------------------------------------------


def test_statistics_and_metrics_count_the_requests_of_every_front(server: ServerProcess) -> None:
    before = stats_of(server, "simple")
    metric_before = metric(server, "nv_inference_request_success", "simple")
    with fronts(server) as held:
        for round_ in range(3):
            for index, connection in enumerate(held.connections):
                infer_simple(connection, round_ * 50 + index)
        # A failure on each connection too (a wrong datatype: counted, reason OTHER).
        bad, _, _ = simple_body(1)
        bad["inputs"][0]["datatype"] = "FP32"
        for connection in held.connections:
            assert post(connection, "/v2/models/simple/infer", bad)[0] == 400
    after = stats_of(server, "simple")
    sent = 3 * CONNECTIONS
    assert after["inference_count"] - before["inference_count"] == sent
    assert after["execution_count"] - before["execution_count"] == sent
    success = after["inference_stats"]["success"]
    assert success["count"] - before["inference_stats"]["success"]["count"] == sent
    assert success["ns"] > before["inference_stats"]["success"]["ns"]
    fail = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    assert fail == CONNECTIONS
    assert metric(server, "nv_inference_request_success", "simple") - metric_before == sent


def test_every_other_route_answers_alike_on_every_connection(server: ServerProcess) -> None:
    """Forwarded to the primary: metadata, readiness, config, repository, errors; and a
    batched model's inference (answered by each front's own batcher)."""
    with fronts(server) as held:
        first: dict[str, tuple[int, bytes]] = {}
        for connection in held.connections:
            for path in (
                "/v2",
                "/v2/health/ready",
                "/v2/models/simple",
                "/v2/models/simple/ready",
                "/v2/models/simple/config",
                "/v2/models/no-such-model",
            ):
                got = get(connection, path)
                assert got == first.setdefault(path, got), (path, got, first[path])
            assert first["/v2/models/no-such-model"][0] == 404
            status, index = post(connection, "/v2/repository/index", {})
            assert status == 200 and any(m["name"] == "simple" for m in index)
            status, answer = post(connection, "/v2/models/batched/infer", BATCHED_BODY)
            assert status == 200, answer
            status, answer = post(connection, "/v2/models/no-such-model/infer", {})
            assert status == 404 and "no-such-model" in answer["error"]


def test_shared_memory_regions_reach_every_front(server: ServerProcess) -> None:
    with simple_region() as region:
        _regions_reach_every_front(server, region)


def _region_body(name: str) -> dict[str, object]:
    """``simple``'s inputs and outputs in region ``name``: inputs at 0 and 64, outputs at
    128 and 192."""
    return {
        "inputs": [
            {
                "name": n,
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {
                    "shared_memory_region": name,
                    "shared_memory_byte_size": 64,
                    "shared_memory_offset": 64 * i,
                },
            }
            for i, n in enumerate(("INPUT0", "INPUT1"))
        ],
        "outputs": [
            {
                "name": n,
                "parameters": {
                    "shared_memory_region": name,
                    "shared_memory_byte_size": 64,
                    "shared_memory_offset": 128 + 64 * i,
                },
            }
            for i, n in enumerate(("OUTPUT0", "OUTPUT1"))
        ],
    }


def _regions_reach_every_front(server: ServerProcess, region: SimpleRegion) -> None:
    a, b, name, key = region.a, region.b, region.name, region.key
    body = _region_body(name)
    with fronts(server) as held:
        register = {"key": key, "offset": 0, "byte_size": 256}
        status, _ = post(
            held.connections[0], f"/v2/systemsharedmemory/region/{name}/register", register
        )
        assert status == 200
        for connection in held.connections:
            status, answer = post(connection, "/v2/models/simple/infer", body)
            assert status == 200, answer
            got = shm.get_contents_as_numpy(region.handle, np.int32, [2, 16], offset=128)
            np.testing.assert_array_equal(got, np.concatenate([a + b, a - b]))
        status, _ = post(
            held.connections[-1], f"/v2/systemsharedmemory/region/{name}/unregister", {}
        )
        assert status == 200
        for connection in held.connections:
            status, answer = post(connection, "/v2/models/simple/infer", body)
            assert status == 400 and name in answer["error"], answer


def test_a_replica_stopped_with_sigterm_is_replaced_quietly(server: ServerProcess) -> None:
    """SIGTERM to another front alone: it drains and exits 0, the primary logs a stop (not
    a death) and starts another; serving goes on."""
    (victim,) = server.http_front_pids()
    os.kill(victim, signal.SIGTERM)
    assert wait_for(lambda: _replaced(server, victim), 30), server.log
    assert any("HTTP front" in line and "was stopped" in line for line in server.lines)
    assert not any(" ERROR " in line and "HTTP front" in line for line in server.lines)
    with fronts(server) as held:
        assert set(held.holder) == {server.process.pid, *server.http_front_pids()}
        for index, connection in enumerate(held.connections):
            infer_simple(connection, index)


def test_a_killed_replica_is_replaced_and_counts_stay(server: ServerProcess) -> None:
    (victim,) = server.http_front_pids()
    with fronts(server) as held:
        for index, connection in enumerate(held.connections):
            infer_simple(connection, index)
    before = stats_of(server, "simple")["inference_count"]
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: _replaced(server, victim), 30), server.log
    assert not alive(victim)
    assert any(" ERROR " in line and "HTTP front 1" in line for line in server.lines)
    # Counters never go back: what the dead front counted stays counted.
    assert stats_of(server, "simple")["inference_count"] >= before
    with fronts(server) as held:
        assert set(held.holder) == {server.process.pid, *server.http_front_pids()}
        for index, connection in enumerate(held.connections):
            infer_simple(connection, index)


def test_a_front_replacing_a_killed_one_knows_the_regions_registered_before(
    server: ServerProcess,
) -> None:
    """A region registered, then the other front killed: its replacement uses the region
    as every front does (it knew only the regions registered after it started, and
    refused the others with "Unable to find shared memory region", found by fuzzing)."""
    with simple_region() as region:
        with fronts(server) as held:
            register = {"key": region.key, "offset": 0, "byte_size": 256}
            path = f"/v2/systemsharedmemory/region/{region.name}/register"
            assert post(held.connections[0], path, register)[0] == 200
        (victim,) = server.http_front_pids()
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: _replaced(server, victim), 30), server.log
        body = _region_body(region.name)
        with fronts(server) as held:
            assert set(held.holder) == {server.process.pid, *server.http_front_pids()}
            for connection in held.connections:
                status, answer = post(connection, "/v2/models/simple/infer", body)
                assert status == 200, answer
            path = f"/v2/systemsharedmemory/region/{region.name}/unregister"
            assert post(held.connections[0], path, {})[0] == 200


def _replaced(proc: ServerProcess, victim: int) -> bool:
    """``victim`` is gone and another front serves the port in its place."""
    pids = proc.http_front_pids()
    if len(pids) != FRONTS - 1 or victim in pids:
        return False
    return all(f"(pid {pid}) serves port" in proc.log for pid in pids)


def test_a_killed_worker_comes_back_on_every_front(server: ServerProcess) -> None:
    (worker,) = server.worker_pids()
    os.kill(worker, signal.SIGKILL)
    assert wait_for(lambda: len(server.worker_pids()) == 1 and worker not in server.worker_pids())

    def serves_everywhere() -> bool:
        with fronts(server) as held:
            try:
                for index, connection in enumerate(held.connections):
                    infer_simple(connection, index)
            except AssertionError:
                return False
        return True

    assert wait_for(serves_everywhere, 60), server.log


# ---- models loaded and unloaded -------------------------------------------------------


@pytest.fixture
def explicit() -> Iterator[ServerProcess]:
    args = [
        "--http-workers",
        str(FRONTS),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "simple,batched",
        "--worker-heartbeat-timeout",
        "60",
    ]
    proc = ServerProcess(args=args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def test_unload_and_load_reach_every_front(explicit: ServerProcess) -> None:
    with fronts(explicit) as held, httpclient.InferenceServerClient(explicit.host_port) as client:
        for index, connection in enumerate(held.connections):
            infer_simple(connection, index)
        client.unload_model("simple")
        body, _, _ = simple_body(3)
        for connection in held.connections:
            status, answer = post(connection, "/v2/models/simple/infer", body)
            assert status == 404 and "unloaded" in answer["error"], answer
        client.load_model("simple")
        for index, connection in enumerate(held.connections):
            infer_simple(connection, index)
        # A reload with a new config: the new versions answer on every front at once.
        config = json.dumps({"max_batch_size": 4})
        client.load_model("simple", config=config)
        too_big = {
            "inputs": [
                {"name": n, "datatype": "INT32", "shape": [8, 16], "data": [1] * 128}
                for n in ("INPUT0", "INPUT1")
            ]
        }
        for connection in held.connections:
            status, answer = post(connection, "/v2/models/simple/infer", too_big)
            assert status == 400, answer


def test_unload_waits_for_a_replicas_request_in_flight(explicit: ServerProcess) -> None:
    """A request a replica already sent to the worker is answered, then the unload ends."""
    (worker,) = explicit.worker_pids()
    body, total, _ = simple_body(5)
    with fronts(explicit) as held, ThreadPoolExecutor(2) as pool:
        (replica,) = explicit.http_front_pids()
        (connection, *_) = held.on(replica)
        infer_simple(connection, 1)
        os.kill(worker, signal.SIGSTOP)
        try:
            in_flight = pool.submit(post, connection, "/v2/models/simple/infer", body)
            # Sent to the (stopped) worker: counted pending until it answers.
            assert wait_for(steadily(lambda: pending(explicit, "simple") == 1), 10)
            with httpclient.InferenceServerClient(explicit.host_port) as client:
                unloading = pool.submit(client.unload_model, "simple")
                # The unload waits for the replica's request.
                assert stays(lambda: not unloading.done(), 1)
                os.kill(worker, signal.SIGCONT)
                status, answer = in_flight.result(30)
                unloading.result(30)
        finally:
            os.kill(worker, signal.SIGCONT)
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == total


def test_a_replicas_own_batcher_answers_what_it_ran_and_refuses_what_it_queued(
    explicit: ServerProcess,
) -> None:
    """``batched`` on a replica: the request its batcher sent to the (stopped) worker holds
    the instance; the next one waits in the queue (the merged pending count shows it). An
    unload then answers the queued one 503 at once, and waits for the running one."""
    (worker,) = explicit.worker_pids()
    with fronts(explicit) as held, ThreadPoolExecutor(3) as pool:
        (replica,) = explicit.http_front_pids()
        first, second, *_ = held.on(replica)
        assert post(first, "/v2/models/batched/infer", BATCHED_BODY)[0] == 200
        os.kill(worker, signal.SIGSTOP)
        try:
            running = pool.submit(post, first, "/v2/models/batched/infer", BATCHED_BODY)
            assert wait_for(steadily(lambda: pending(explicit) == 0), 10)
            queued = pool.submit(post, second, "/v2/models/batched/infer", BATCHED_BODY)
            assert wait_for(steadily(lambda: pending(explicit) == 1), 10)
            with httpclient.InferenceServerClient(explicit.host_port) as client:
                unloading = pool.submit(client.unload_model, "batched")
                status, answer = queued.result(30)
                assert status == 503 and "queued" in answer["error"], answer
                assert not unloading.done()  # the running batch is not answered yet
                os.kill(worker, signal.SIGCONT)
                status, answer = running.result(30)
                unloading.result(30)
        finally:
            os.kill(worker, signal.SIGCONT)
    assert status == 200, answer


def test_a_reload_answers_what_a_replicas_batcher_queued_at_once(explicit: ServerProcess) -> None:
    """A reload tells the other fronts of the new version before it retires the old one.
    A replica used to forget the old version at the first message, so the Retire found
    nothing, and a request queued in the old version's batcher waited for an instance
    until its deadline (--infer-timeout, 120 s)."""
    # A delay of 30 s: a request alone stays queued while the reload runs.
    waiting = json.dumps(
        {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 30_000_000}}
    )
    with fronts(explicit) as held, ThreadPoolExecutor(1) as pool:
        with httpclient.InferenceServerClient(explicit.host_port) as client:
            client.load_model("batched", config=waiting)
            (replica,) = explicit.http_front_pids()
            (connection, *_) = held.on(replica)
            queued = pool.submit(post, connection, "/v2/models/batched/infer", BATCHED_BODY)
            assert wait_for(steadily(lambda: pending(explicit) == 1), 10)
            started = time.monotonic()
            client.load_model("batched")  # a reload, with the repository's own config
            status, answer = queued.result(20)
            waited = time.monotonic() - started
            assert status == 503, answer
            assert "replaced by a reload while this request was queued" in answer["error"]
            assert waited < 20
            # The new version answers on that front, with the repository's 2 ms delay.
            assert post(connection, "/v2/models/batched/infer", BATCHED_BODY)[0] == 200


# ---- the server's ends ----------------------------------------------------------------


def test_sigterm_stops_every_front_and_leaves_nothing() -> None:
    proc = ServerProcess(args=["--http-workers", "3"]).wait_ready()
    front = proc.process.pid
    children = proc.http_front_pids() + proc.worker_pids()
    try:
        assert len(proc.http_front_pids()) == 2, proc.log
        with fronts(proc) as held:
            for index, connection in enumerate(held.connections):
                infer_simple(connection, index)
        assert proc.stop() == 0, proc.log
    finally:
        proc.kill()
    assert [pid for pid in children if alive(pid)] == [], proc.log
    assert shm_entries(front) == []


def test_the_other_fronts_exit_when_the_primary_is_killed() -> None:
    proc = ServerProcess(args=["--http-workers", str(FRONTS)]).wait_ready()
    front = proc.process.pid
    replicas = proc.http_front_pids()
    workers = proc.worker_pids()
    try:
        assert replicas, proc.log
        proc.kill()
        assert wait_for(lambda: not any(alive(pid) for pid in replicas), 10)
    finally:
        proc.kill()
        for pid in replicas + workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for name in shm_entries(front):
            Path("/dev/shm", name).unlink(missing_ok=True)


def test_http_workers_without_http_is_refused() -> None:
    result = run_serve("--http-workers", "2", "--allow-http", "false", timeout=30)
    assert result.returncode != 0 and "--http-workers" in result.stderr, result.stderr


@pytest.mark.parametrize("count", ["0", "65"])
def test_http_workers_out_of_range(count: str) -> None:
    result = run_serve("--http-workers", count, timeout=30)
    assert result.returncode == 2 and "--http-workers" in result.stderr, result.stderr


def test_a_forwarded_answer_has_one_date_and_one_server_header(server: ServerProcess) -> None:
    with fronts(server) as held:
        for connection in held.connections:
            connection.request("GET", "/v2/models/simple")
            response = connection.getresponse()
            response.read()
            names = [name.lower() for name, _ in response.getheaders()]
            assert response.status == 200
            assert names.count("date") == 1 and names.count("server") <= 1, names


def test_large_bodies_through_every_front(server: ServerProcess) -> None:
    """A 2 MiB JSON body (parsed and decoded by the worker, ``json_offload``) and an 8 MiB
    binary body (received straight into a segment) through every front: the worker reads
    each front's own segments."""
    values = np.arange(512 * 1024, dtype=np.float32)
    as_json = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, values.size],
                    "data": values.tolist(),
                }
            ]
        }
    ).encode()
    assert len(as_json) > 2 * 1024 * 1024
    big = np.random.default_rng(3).random((1, 2 * 1024 * 1024), dtype=np.float32)  # 8 MiB
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": list(big.shape),
                    "parameters": {"binary_data_size": big.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    with fronts(server) as held:
        # NOTE: one connection a front, each used at once: the others would idle through
        #   the large requests before them, past uvicorn's keep-alive time (5 s) on a
        #   loaded machine, and be closed by the server (a BrokenPipe here).
        assert len(set(held.holder)) == FRONTS, held.holder
        for pid in sorted(set(held.holder)):
            connection = held.on(pid)[0]
            connection.request(
                "POST",
                "/v2/models/identity_fp32/infer",
                as_json,
                {"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200, answer
            assert answer["outputs"][0]["data"][-1] == float(values[-1])
            connection.request(
                "POST",
                "/v2/models/identity_fp32/infer",
                header + big.tobytes(),
                {"Inference-Header-Content-Length": str(len(header))},
            )
            response = connection.getresponse()
            data = response.read()
            assert response.status == 200, data[:200]
            length = int(response.getheader("Inference-Header-Content-Length"))
            np.testing.assert_array_equal(np.frombuffer(data[length:], np.float32), big.ravel())


def test_restricted_inference_holds_on_every_front() -> None:
    proc = ServerProcess(
        args=["--http-workers", str(FRONTS), "--http-restricted-api", "inference:x-key=s3cret"]
    ).wait_ready()
    try:
        body, total, _ = simple_body(2)
        with fronts(proc) as held:
            assert len(set(held.holder)) == FRONTS, held.holder
            for connection in held.connections:
                status, answer = post(connection, "/v2/models/simple/infer", body)
                assert status == 403 and "x-key" in answer["error"], answer
                connection.request(
                    "POST",
                    "/v2/models/simple/infer",
                    json.dumps(body).encode(),
                    {"Content-Type": "application/json", "x-key": "s3cret"},
                )
                response = connection.getresponse()
                answer = json.loads(response.read())
                assert response.status == 200 and answer["outputs"][0]["data"] == total
    finally:
        assert proc.stop() == 0, proc.log


def test_deprecated_grpc_processes_warns_and_every_front_serves_both_ports() -> None:
    """``--grpc-processes`` (deprecated, docs/grpc.md "History") beside ``--http-workers``:
    accepted, one WARNING naming ``--http-workers``, and gRPC served by every front as
    REST is, statistics counting both (it used to keep gRPC off the other fronts)."""
    proc = ServerProcess(args=["--http-workers", str(FRONTS), "--grpc-processes", "1"])
    proc.wait_ready()
    try:
        warning = f"WARNING oipserve: {GRPC_PROCESSES_DEPRECATED}"
        assert proc.log.count(warning) == 1 and "--http-workers" in warning, proc.log
        assert len(proc.http_front_pids()) == FRONTS - 1
        before = stats_of(proc, "simple")["inference_count"]
        with fronts(proc) as held:
            assert len(set(held.holder)) == FRONTS, held.holder
            for index, connection in enumerate(held.connections):
                infer_simple(connection, index)
        with grpc_fronts(proc) as grpc_held:
            assert len(set(grpc_held.holder)) == FRONTS, grpc_held.holder
            for seed, client in enumerate(grpc_held.clients):
                grpc_infer_simple(client, seed)
        assert stats_of(proc, "simple")["inference_count"] - before == 2 * CONNECTIONS
    finally:
        assert proc.stop() == 0, proc.log


def test_sigterm_answers_every_fronts_requests_in_flight() -> None:
    """Requests on both fronts, held at a stopped worker when SIGTERM comes: every one is
    answered before the workers stop, and nothing is left."""
    proc = ServerProcess(
        args=["--http-workers", str(FRONTS), "--worker-heartbeat-timeout", "60"]
    ).wait_ready()
    front = proc.process.pid
    children = proc.http_front_pids() + proc.worker_pids()
    (worker,) = proc.worker_pids()
    try:
        with fronts(proc) as held, ThreadPoolExecutor(CONNECTIONS) as pool:
            assert len(set(held.holder)) == FRONTS, held.holder
            os.kill(worker, signal.SIGSTOP)
            try:
                bodies = [simple_body(i) for i in range(CONNECTIONS)]
                calls = [
                    pool.submit(post, connection, "/v2/models/simple/infer", body)
                    for connection, (body, _, _) in zip(held.connections, bodies, strict=True)
                ]
                assert wait_for(steadily(lambda: pending(proc, "simple") == CONNECTIONS), 10)
                proc.process.send_signal(signal.SIGTERM)
                assert wait_for(lambda: "received SIGTERM" in proc.log, 10), proc.log
            finally:
                os.kill(worker, signal.SIGCONT)
            for call, (_, total, _) in zip(calls, bodies, strict=True):
                status, answer = call.result(30)
                assert status == 200, answer
                assert answer["outputs"][0]["data"] == total
        assert proc.stop() == 0, proc.log
    finally:
        proc.kill()
    assert [pid for pid in children if alive(pid)] == [], proc.log
    assert shm_entries(front) == []


# ---- gRPC on every front --------------------------------------------------------------


class GrpcFronts:
    """``CONNECTIONS`` gRPC clients, each on a connection of its own, and the pid of the
    front holding each (found by opening them one at a time and looking in /proc)."""

    def __init__(self, proc: ServerProcess) -> None:
        port = int(proc.grpc_url.rsplit(":", 1)[1])
        pids = [proc.process.pid, *proc.http_front_pids()]

        def links() -> set[tuple[int, int]]:
            return {(pid, far) for pid in pids for near, far in tcp_links(pid) if near == port}

        self.clients: list[grpcclient.InferenceServerClient] = []
        self.holder: list[int] = []
        seen = links()
        for _ in range(CONNECTIONS):
            # NOTE: a local subchannel pool, or grpc shares one connection among clients.
            client = grpcclient.InferenceServerClient(
                proc.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
            )
            self.clients.append(client)
            assert client.is_server_live()
            now = links()
            (new,) = now - seen
            seen = now
            self.holder.append(new[0])

    def on(self, pid: int) -> list[grpcclient.InferenceServerClient]:
        return [c for c, holder in zip(self.clients, self.holder, strict=True) if holder == pid]

    def close(self) -> None:
        for client in self.clients:
            client.close()


@contextmanager
def grpc_fronts(proc: ServerProcess) -> Iterator[GrpcFronts]:
    held = GrpcFronts(proc)
    try:
        yield held
    finally:
        held.close()


def grpc_infer_simple(
    client: grpcclient.InferenceServerClient, seed: int, **kwargs: object
) -> None:
    a = (np.arange(16, dtype=np.int32) * seed % 1000).reshape(1, 16)
    b = np.full((1, 16), seed % 100, dtype=np.int32)
    result = client.infer("simple", simple_inputs(a, b), **kwargs)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_grpc_connections_are_spread_and_every_rpc_answers_alike(server: ServerProcess) -> None:
    with grpc_fronts(server) as held:
        assert set(held.holder) == {server.process.pid, *server.http_front_pids()}, held.holder
        config = held.clients[0].get_model_config("simple", as_json=True)
        index = held.clients[0].get_model_repository_index(as_json=True)
        for seed, client in enumerate(held.clients):
            grpc_infer_simple(client, seed)
            assert client.is_server_ready() and client.is_model_ready("simple")
            assert client.get_model_metadata("simple").name == "simple"
            assert client.get_model_config("simple", as_json=True) == config
            assert client.get_model_repository_index(as_json=True) == index
            with pytest.raises(InferenceServerException) as info:
                client.get_model_metadata("no_such_model")
            assert info.value.status() == "StatusCode.NOT_FOUND", info.value


def test_grpc_streams_run_on_every_front(server: ServerProcess) -> None:
    with grpc_fronts(server) as held:
        for seed, client in enumerate(held.clients):
            answers: list[object] = []

            def collect(result: object, error: object, answers: list[object] = answers) -> None:
                answers.append(error or result)

            client.start_stream(callback=collect)
            a = np.full((1, 16), seed, dtype=np.int32)
            for _ in range(3):
                client.async_stream_infer("simple", simple_inputs(a, a))
            client.stop_stream()
            assert len(answers) == 3, answers
            for result in answers:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)  # type: ignore[attr-defined]


def test_grpc_inference_of_a_model_only_the_primary_serves_works_on_every_front(
    server: ServerProcess,
) -> None:
    """An echo endpoint (the workers API) lives in the primary: another front forwards its
    ModelInfer calls and its stream requests there, with their metadata; a model nobody
    serves is NOT_FOUND on every front."""
    assert post_text(server, "/v2/workers/echo/load") == (200, "echo")
    try:
        with grpc_fronts(server) as held:
            (replica,) = server.http_front_pids()
            assert held.on(replica) and held.on(server.process.pid), held.holder
            for seed, client in enumerate(held.clients):
                x = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
                values = np.full((1, 3), seed, dtype=np.float32)
                x.set_data_from_numpy(values)
                result = client.infer("echo", [x])
                np.testing.assert_array_equal(result.as_numpy("INPUT0"), values)
                answers: list[object] = []

                def collect(result: object, error: object, answers: list[object] = answers) -> None:
                    answers.append(error or result)

                client.start_stream(callback=collect)
                for _ in range(2):
                    client.async_stream_infer("echo", [x])
                client.async_stream_infer("no_such_model", [x])
                client.stop_stream()
                assert len(answers) == 3, answers
                for answer in answers[:2]:
                    np.testing.assert_array_equal(answer.as_numpy("INPUT0"), values)  # type: ignore[attr-defined]
                assert "unknown model: 'no_such_model'" in str(answers[2]), answers[2]
                with pytest.raises(InferenceServerException) as info:
                    client.infer("no_such_model", [x])
                assert info.value.status() == "StatusCode.NOT_FOUND", info.value
                # a failed stream request's error names it, forwarded or not (it did not
                # when forwarded)
                assert _stream_error_ids(client) == ["", "nobody's"]
    finally:
        assert post_text(server, "/v2/workers/echo/unload")[0] == 200


def _stream_error_ids(client: grpcclient.InferenceServerClient) -> list[str]:
    """A raw ModelStreamInfer on ``client``'s connection: an echo request, then one for a
    model nobody serves; the ids its two responses carry."""
    requests = []
    for model, request_id in (("echo", ""), ("no_such_model", "nobody's")):
        request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.fp32_contents.append(
            1
        )
        requests.append(request.SerializeToString())
    stream = client._channel.stream_stream(  # noqa: SLF001 - the connection to this front
        "/inference.GRPCInferenceService/ModelStreamInfer"
    )
    replies = [service_pb2.ModelStreamInferResponse.FromString(r) for r in stream(iter(requests))]
    assert replies[0].error_message == "" and replies[1].error_message, replies
    return [reply.infer_response.id for reply in replies]


def post_text(proc: ServerProcess, path: str) -> tuple[int, str]:
    """A workers-API POST with an empty JSON body; its status and its text answer."""
    request = urllib.request.Request(proc.url + path, b"{}", {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read().decode()


def test_a_replica_answers_grpc_inference_while_the_primary_is_stopped(
    server: ServerProcess,
) -> None:
    primary = server.process.pid
    with grpc_fronts(server) as held:
        (replica,) = server.http_front_pids()
        theirs = held.on(replica)
        assert theirs and held.on(primary), held.holder
        os.kill(primary, signal.SIGSTOP)
        try:
            for seed, client in enumerate(theirs):
                grpc_infer_simple(client, seed, client_timeout=10)
                assert client.is_server_live()
        finally:
            os.kill(primary, signal.SIGCONT)
        for seed, client in enumerate(held.on(primary)):
            grpc_infer_simple(client, seed)


def test_grpc_statistics_count_the_calls_of_every_front(server: ServerProcess) -> None:
    with grpc_fronts(server) as held:
        before = stats_of(server, "simple")["inference_count"]
        for round_ in range(3):
            for seed, client in enumerate(held.clients):
                grpc_infer_simple(client, round_ * 50 + seed)
        for client in held.clients:
            (entry,) = client.get_inference_statistics("simple", as_json=True)["model_stats"]
            assert int(entry["inference_count"]) - before == 3 * CONNECTIONS


def test_grpc_shared_memory_regions_reach_every_front(server: ServerProcess) -> None:
    with simple_region() as region, grpc_fronts(server) as held:
        a, b, name = region.a, region.b, region.name
        (replica,) = server.http_front_pids()
        held.on(replica)[0].register_system_shared_memory(name, region.key, 256)
        for client in held.clients:
            inputs = simple_inputs(a, b)
            for i, tensor in enumerate(inputs):
                tensor.set_shared_memory(name, 64, offset=64 * i)
            outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            for i, output in enumerate(outputs):
                output.set_shared_memory(name, 64, offset=128 + 64 * i)
            client.infer("simple", inputs, outputs=outputs)
            got = shm.get_contents_as_numpy(region.handle, np.int32, [2, 16], offset=128)
            np.testing.assert_array_equal(got, np.concatenate([a + b, a - b]))
            zeros = np.zeros((2, 16), np.int32)
            shm.set_shared_memory_region(region.handle, [zeros], offset=128)
        status = held.clients[-1].get_system_shared_memory_status(as_json=True)
        assert name in status["regions"], status
        held.clients[-1].unregister_system_shared_memory(name)


def test_restricted_grpc_holds_on_every_front() -> None:
    proc = ServerProcess(
        args=[
            "--http-workers",
            str(FRONTS),
            "--grpc-restricted-protocol",
            "inference,metadata:x-key=s3cret",
        ]
    ).wait_ready()
    try:
        with grpc_fronts(proc) as held:
            assert len(set(held.holder)) == FRONTS, held.holder
            key = {"triton-grpc-protocol-x-key": "s3cret"}
            for seed, client in enumerate(held.clients):
                with pytest.raises(InferenceServerException) as info:
                    grpc_infer_simple(client, seed)  # answered here
                assert info.value.status() == "StatusCode.PERMISSION_DENIED", info.value
                with pytest.raises(InferenceServerException) as info:
                    client.get_model_metadata("simple")  # forwarded to the primary
                assert info.value.status() == "StatusCode.PERMISSION_DENIED", info.value
                grpc_infer_simple(client, seed, headers=key)
                assert client.get_model_metadata("simple", headers=key).name == "simple"
    finally:
        assert proc.stop() == 0, proc.log


def test_sigterm_while_the_other_front_starts_does_not_wait_for_it() -> None:
    """SIGTERM while the other front is starting (its process there, not yet serving):
    its start is cancelled and the server exits at once, well within --shutdown-timeout.
    The stop waited for that front to drain, which it never told: --shutdown-timeout
    and 5 s more, past Kubernetes' 30 s grace at the default (found by fuzzing)."""
    proc = ServerProcess(args=["--http-workers", "2", "--shutdown-timeout", "20"])
    try:
        assert wait_for(proc.http_front_pids, 60, interval=0.005), proc.log
        started = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)
        code = proc.process.wait(60)
        took = time.monotonic() - started
    finally:
        proc.kill()
    assert code == 0, proc.log
    assert took < 10, (took, proc.log)
    assert "Traceback" not in proc.log, proc.log
