"""``--grpc-processes N``: gRPC served by N child processes that forward every call to the front.

One server with two gRPC processes serves the read-only and the recoverable tests (the
one that kills a gRPC process comes last); the restricted protocol and the ends of the
front (SIGTERM, SIGKILL) get servers of their own; bad settings never start one.

A call is known to have reached the front, without timing, by the model ``batched``
(one instance, dynamic batching): while its worker is SIGSTOPped, one request holds the
instance and later ones stay queued, which ``nv_inference_pending_request_count`` shows.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e.test_lifecycle import run_serve
from tests.server import (
    ServerProcess,
    alive,
    cmdline,
    shm_entries,
    tcp_links,
    wait_for,
    worst_probe_during_large_grpc_calls,
)
from tests.tensors import simple_inputs, simple_region

PROCESSES = 2
GRPC_PROCESS = "oipserve.grpc_process"
#: Channel arguments for a connection of the channel's own: grpc shares one connection
#: between the channels of a process to the same target (its global subchannel pool).
OWN_CONNECTION = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """Two gRPC processes; a heartbeat timeout that outlasts a stopped worker."""
    args = ["--grpc-processes", str(PROCESSES), "--worker-heartbeat-timeout", "60"]
    proc = ServerProcess(args=[*args, "--allow-client-shm", "true"]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


# ---- processes, sockets, metrics ------------------------------------------------------


def pending(proc: ServerProcess, model: str = "batched") -> int:
    """Requests of ``model`` queued in the front (Triton's pending request count)."""
    with urllib.request.urlopen(proc.metrics_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    key = f'nv_inference_pending_request_count{{model="{model}",version="1"}} '
    (line,) = [ln for ln in text.splitlines() if ln.startswith(key)]
    return int(float(line.split()[-1]))


def steadily(predicate: Callable[[], bool], times: int = 3) -> Callable[[], bool]:
    """True once ``predicate`` held on ``times`` polls in a row (a lone request is queued
    for the batcher's 2 ms delay: that must not count)."""
    hits = 0

    def check() -> bool:
        nonlocal hits
        hits = hits + 1 if predicate() else 0
        return hits >= times

    return check


# ---- requests -------------------------------------------------------------------------


def check_simple(client: grpcclient.InferenceServerClient, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
    result = client.infer("simple", simple_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def batched_inputs(module: object, value: float) -> list:
    x = module.InferInput("INPUT0", [1, 4], "FP32")  # type: ignore[attr-defined]
    x.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
    text = module.InferInput("TEXT", [1, 1], "BYTES")  # type: ignore[attr-defined]
    text.set_data_from_numpy(np.array([[b"t"]], dtype=object))
    return [x, text]


def batched_answer(result: object, value: float) -> bool:
    got = result.as_numpy("OUTPUT0")  # type: ignore[attr-defined]
    return got.tolist() == [[value + 1] * 4]


def _hold(proc: ServerProcess, value: float) -> object:
    client = httpclient.InferenceServerClient(proc.host_port, network_timeout=120)
    try:
        return client.infer("batched", batched_inputs(httpclient, value))
    finally:
        client.close()


@contextmanager
def instance_held(proc: ServerProcess, pool: ThreadPoolExecutor) -> Iterator[int]:
    """The worker SIGSTOPped, ``batched``'s instance busy, requests after it queued.

    HTTP requests are sent until one stays queued; yields how many are queued. On exit
    the worker goes on and every one of them must be answered.
    """
    (worker,) = proc.worker_pids()
    holders: list[Future[object]] = []
    os.kill(worker, signal.SIGSTOP)
    try:
        for attempt in range(20):
            holders.append(pool.submit(_hold, proc, float(attempt)))
            if wait_for(steadily(lambda: pending(proc) >= 1), 0.5):
                break
        else:
            raise AssertionError(f"no request stayed queued behind the stopped worker:\n{proc.log}")
        yield pending(proc)
    finally:
        os.kill(worker, signal.SIGCONT)
    for value, holder in enumerate(holders):
        assert batched_answer(holder.result(60), float(value))


# ---- the processes serve ----------------------------------------------------------------


def test_the_grpc_processes_are_children_of_the_front(server: ServerProcess) -> None:
    pids = server.grpc_process_pids()
    assert len(pids) == PROCESSES, (pids, server.log)
    for pid in pids:
        assert "-P -m oipserve.grpc_process" in cmdline(pid), cmdline(pid)
    assert "grpc=" in server.ready_line and server.grpc_port


def test_concurrent_clients_are_spread_and_answered(server: ServerProcess) -> None:
    """Sixteen connections: SO_REUSEPORT gives every gRPC process some of them."""
    clients = 16
    errors: list[BaseException] = []
    finished: list[int] = []
    release = threading.Event()

    def work(seed: int) -> None:
        with grpcclient.InferenceServerClient(server.grpc_url, channel_args=OWN_CONNECTION) as own:
            try:
                for call in range(10):
                    check_simple(own, seed * 100 + call)
            except BaseException as exc:
                errors.append(exc)
            finished.append(seed)
            release.wait(60)  # the connection stays open until it is counted

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(clients)]
    for thread in threads:
        thread.start()
    try:
        assert wait_for(lambda: len(finished) == clients, 120)
        assert not errors, errors[0]
        per_process = {
            pid: sum(local == server.grpc_port for local, _ in tcp_links(pid))
            for pid in server.grpc_process_pids()
        }
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert sum(per_process.values()) >= clients, per_process
    assert all(per_process.values()), per_process


def test_large_message_round_trips(server: ServerProcess) -> None:
    data = np.random.default_rng(5).random((1, 10 * 1024 * 1024), dtype=np.float32)  # 40 MiB
    inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(server.grpc_url) as own:
        result = own.infer("identity_fp32", [inp])
    assert result.as_numpy("OUTPUT0").tobytes() == data.tobytes()


def test_large_grpc_messages_leave_the_fronts_loop_free(server: ServerProcess) -> None:
    """Issue #18: a 64 MiB gRPC message held the front's loop ~0.25-0.5 s when grpc.aio
    ran there (REST probes waited that long); the front now only copies off the loop."""
    worst = worst_probe_during_large_grpc_calls(server)
    if worst >= 0.1:
        # NOTE: measured once more. On this shared 2-core machine one probe of a run now
        #   and then took 128-140 ms (two fresh-clone runs of 2026-11-27, with and without
        #   the workers' polling; the probe competes with the two senders for the cores).
        #   The regression this guards against held the loop on every large message, so
        #   it fails both runs.
        worst = min(worst, worst_probe_during_large_grpc_calls(server))
    # NOTE: the front's own stalls are 5-20 ms here (benchmarks/loop_stalls.py); the bound
    #   leaves room for this shared 2-core machine, as test_json_offload's does.
    assert worst < 0.1, f"/v2/health/live took {worst * 1e3:.0f} ms during 64 MiB gRPC calls"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_round_trips(server: ServerProcess, algorithm: str) -> None:
    data = np.repeat(np.arange(64, dtype=np.float32), 4096).reshape(1, -1)
    inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(server.grpc_url) as own:
        result = own.infer("identity_fp32", [inp], compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_statistics_count_calls_through_the_processes(server: ServerProcess) -> None:
    calls = 7
    with grpcclient.InferenceServerClient(server.grpc_url) as own:
        (before,) = own.get_inference_statistics("simple").model_stats
        for seed in range(calls):
            check_simple(own, seed)
        (after,) = own.get_inference_statistics("simple").model_stats
    assert after.inference_count - before.inference_count == calls
    success = after.inference_stats.success.count - before.inference_stats.success.count
    assert success == calls
    rest = httpclient.InferenceServerClient(server.host_port)
    (same,) = rest.get_inference_statistics("simple")["model_stats"]
    assert same["inference_count"] == after.inference_count


def test_system_shared_memory_through_the_processes(server: ServerProcess) -> None:
    """Regions registered through one call are used and listed by later ones."""
    with simple_region() as region:
        a, b, name, key = region.a, region.b, region.name, region.key
        with grpcclient.InferenceServerClient(server.grpc_url) as own:
            own.register_system_shared_memory(name, key, 256)
            try:
                ins = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
                outs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
                for index, tensor in enumerate(ins + outs):
                    tensor.set_shared_memory(name, 64, offset=64 * index)
                result = own.infer("simple", ins, outputs=outs)
                assert list(result.get_response().raw_output_contents) == [b"", b""]
                got = shm.get_contents_as_numpy(region.handle, np.int32, [2, 16], offset=128)
                np.testing.assert_array_equal(got, np.concatenate([a + b, a - b]))
                assert list(own.get_system_shared_memory_status().regions) == [name]
            finally:
                own.unregister_system_shared_memory(name)
            assert not own.get_system_shared_memory_status().regions


def test_a_client_deadline_reaches_the_front(server: ServerProcess) -> None:
    """The call ends at its deadline, and its queued request leaves the front's queue."""
    with ThreadPoolExecutor(24) as pool, grpcclient.InferenceServerClient(server.grpc_url) as own:
        with instance_held(server, pool) as queued:
            with pytest.raises(InferenceServerException) as info:
                own.infer("batched", batched_inputs(grpcclient, 7), client_timeout=0.5)
            assert info.value.status() == str(grpc.StatusCode.DEADLINE_EXCEEDED), info.value
            assert wait_for(lambda: pending(server) == queued, 10), pending(server)
        assert batched_answer(own.infer("batched", batched_inputs(grpcclient, 8)), 8)
        check_simple(own, 1)


def test_a_cancelled_call_leaves_the_front(server: ServerProcess) -> None:
    """The client's cancellation is forwarded: the queued request is withdrawn."""
    outcomes: queue.Queue[tuple[object, object]] = queue.Queue()
    with ThreadPoolExecutor(24) as pool, grpcclient.InferenceServerClient(server.grpc_url) as own:
        with instance_held(server, pool) as queued:
            call = own.async_infer(
                "batched",
                batched_inputs(grpcclient, 6),
                callback=lambda result, error: outcomes.put((result, error)),
            )
            assert wait_for(steadily(lambda: pending(server) == queued + 1), 10)
            call.cancel()
            result, error = outcomes.get(timeout=30)
            assert result is None and isinstance(error, InferenceServerException), result
            assert error.status() == str(grpc.StatusCode.CANCELLED), error
            assert wait_for(lambda: pending(server) == queued, 10), pending(server)
        check_simple(own, 3)


def _server_side(proc: ServerProcess, client: grpcclient.InferenceServerClient) -> int:
    """The gRPC process that holds ``client``'s (this test process's only) connection."""
    assert client.is_server_live()  # connected
    (ours,) = [local for local, remote in tcp_links(os.getpid()) if remote == proc.grpc_port]
    (pid,) = [p for p in proc.grpc_process_pids() if (proc.grpc_port, ours) in tcp_links(p)]
    return pid


def test_a_grpc_process_stopped_with_sigterm_is_replaced_quietly(server: ServerProcess) -> None:
    """SIGTERM to one gRPC process alone (an operator's stop): it drains and exits 0, the
    front logs that at INFO (not as a death) and starts another."""
    victim = server.grpc_process_pids()[0]
    os.kill(victim, signal.SIGTERM)
    stopped = f"gRPC process {victim} was stopped"
    assert wait_for(lambda: any(stopped in line for line in server.lines), 20), server.log
    assert not any(stopped in line and " ERROR " in line for line in server.lines)
    assert wait_for(lambda: _replaced(server, victim), 30), server.log
    assert wait_for(lambda: _answers(server), 30), server.log


def test_a_killed_grpc_process_is_replaced(server: ServerProcess) -> None:
    """Its calls fail (UNAVAILABLE) and leave the front; new ones work again."""
    before = server.grpc_process_pids()
    with ThreadPoolExecutor(24) as pool:
        own = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            victim = _server_side(server, own)
            with instance_held(server, pool) as queued:
                call = pool.submit(own.infer, "batched", batched_inputs(grpcclient, 9))
                assert wait_for(steadily(lambda: pending(server) == queued + 1), 10)
                os.kill(victim, signal.SIGKILL)
                with pytest.raises(InferenceServerException) as info:
                    call.result(30)
                assert info.value.status() == str(grpc.StatusCode.UNAVAILABLE), info.value
                # The front saw the call end: its request left the queue.
                assert wait_for(lambda: pending(server) == queued, 10), pending(server)
        finally:
            own.close()
    assert wait_for(lambda: _died_logged(server), 10), server.log
    assert wait_for(lambda: _replaced(server, victim), 30), (
        before,
        server.grpc_process_pids(),
        server.log,
    )
    assert not alive(victim)
    assert wait_for(lambda: _answers(server), 30), server.log


def _replaced(proc: ServerProcess, victim: int) -> bool:
    """``victim`` is gone and another gRPC process has taken its place."""
    pids = proc.grpc_process_pids()
    return len(pids) == PROCESSES and victim not in pids


def _died_logged(proc: ServerProcess) -> bool:
    return any(
        " ERROR " in line and "gRPC process" in line and "died" in line for line in proc.lines
    )


def _answers(proc: ServerProcess) -> bool:
    """One call on a fresh channel succeeds."""
    try:
        with grpcclient.InferenceServerClient(proc.grpc_url) as fresh:
            check_simple(fresh, 2)
    except InferenceServerException:
        return False
    return True


# ---- servers of their own ----------------------------------------------------------------


def test_restricted_protocol_through_a_process() -> None:
    proc = ServerProcess(
        args=["--grpc-processes", "1", "--grpc-restricted-protocol", "inference:secret=xyz"]
    ).wait_ready()
    try:
        assert len(proc.grpc_process_pids()) == 1
        with grpcclient.InferenceServerClient(proc.grpc_url) as own:
            assert own.is_server_live()  # health is not restricted
            for headers in ({}, {"triton-grpc-protocol-secret": "wrong"}):
                with pytest.raises(InferenceServerException) as info:
                    check_simple_with(own, headers)
                assert info.value.status() == str(grpc.StatusCode.PERMISSION_DENIED)
                assert "triton-grpc-protocol-secret" in info.value.message()
            check_simple_with(own, {"triton-grpc-protocol-secret": "xyz"})
    finally:
        assert proc.stop() == 0, proc.log


def check_simple_with(client: grpcclient.InferenceServerClient, headers: dict[str, str]) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer("simple", simple_inputs(a, a), headers=headers)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_sigterm_answers_the_call_in_flight_and_leaves_nothing() -> None:
    proc = ServerProcess(
        args=["--grpc-processes", str(PROCESSES), "--worker-heartbeat-timeout", "60"]
    ).wait_ready()
    front = proc.process.pid
    children = proc.grpc_process_pids() + proc.worker_pids()
    try:
        assert len(proc.grpc_process_pids()) == PROCESSES, proc.log
        with ThreadPoolExecutor(24) as pool:
            own = grpcclient.InferenceServerClient(proc.grpc_url)
            try:
                with instance_held(proc, pool) as queued:
                    call = pool.submit(own.infer, "batched", batched_inputs(grpcclient, 5))
                    assert wait_for(steadily(lambda: pending(proc) == queued + 1), 10)
                    proc.process.send_signal(signal.SIGTERM)
                    assert wait_for(lambda: "received SIGTERM" in proc.log, 10), proc.log
                assert batched_answer(call.result(60), 5)
            finally:
                own.close()
        assert proc.stop() == 0, proc.log
    finally:
        proc.kill()
    # The front waited for its children: none is left running once it has exited.
    assert [pid for pid in children if alive(pid)] == [], proc.log
    assert shm_entries(front) == []


def test_grpc_processes_exit_when_the_front_is_killed() -> None:
    """Through the environment this time: OIPSERVE_GRPC_PROCESSES."""
    proc = ServerProcess(env={"OIPSERVE_GRPC_PROCESSES": str(PROCESSES)}).wait_ready()
    front = proc.process.pid
    children = proc.grpc_process_pids()
    workers = proc.worker_pids()
    try:
        assert len(children) == PROCESSES, proc.log
        proc.kill()
        assert wait_for(lambda: not any(alive(pid) for pid in children), 10), [
            (pid, cmdline(pid)) for pid in children if alive(pid)
        ]
    finally:
        proc.kill()
        for pid in children + workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for name in shm_entries(front):
            Path("/dev/shm", name).unlink(missing_ok=True)


# ---- settings refused -----------------------------------------------------------------


def _serve(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = run_serve(
        *args,
        timeout=30,
        env=env,
    )
    return result.returncode, result.stderr


def test_grpc_processes_without_grpc_is_refused() -> None:
    code, stderr = _serve("--grpc-processes", "2", "--allow-grpc", "false")
    assert code != 0 and "--grpc-processes" in stderr, stderr
    assert "unrecognized arguments" not in stderr, stderr


@pytest.mark.parametrize(
    "given", [("--grpc-processes", "65"), ("--grpc-processes", "-1")], ids=["65", "-1"]
)
def test_grpc_processes_out_of_range(given: tuple[str, str]) -> None:
    code, stderr = _serve(*given)
    assert code == 2 and "--grpc-processes" in stderr, stderr
    assert "unrecognized arguments" not in stderr, stderr


def test_grpc_processes_out_of_range_in_the_environment() -> None:
    code, stderr = _serve(env={"OIPSERVE_GRPC_PROCESSES": "65"})
    assert code == 2 and "OIPSERVE_GRPC_PROCESSES" in stderr, stderr


def test_auto_serves_grpc_in_the_front() -> None:
    """`--grpc-processes auto` (the default) starts no gRPC process, on any node."""
    proc = ServerProcess(args=["--grpc-processes", "auto"]).wait_ready()
    try:
        assert proc.grpc_process_pids() == [], proc.log
        with grpcclient.InferenceServerClient(proc.grpc_url) as client:
            check_simple(client, seed=7)
    finally:
        assert proc.stop() == 0, proc.log
