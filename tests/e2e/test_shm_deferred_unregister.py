"""Unregistering a system shared-memory region that requests in flight use (Triton 2.53 on).

Triton's rule (``qa/L0_shared_memory`` ``test_unregister_shm_during_inference_*``; its
``SharedMemoryManager::UnregisterHelper``): the unregister call answers at once; the region
stays listed by status, its name taken and new requests may still name it, until the last
request that uses it ends; then it is gone without another call. The same over gRPC, for
unregister-all, and with ``--http-workers`` for a request another front runs.

A request is held in flight by stopping the server's only worker (SIGSTOP): the front has
sent it and counts it pending (``nv_inference_pending_request_count``) until it answers.
Regions are real POSIX shared memory made by ``tritonclient.utils.shared_memory``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support.raw_http import json_infer, read_response
from tests.support.server import (
    ServerProcess,
    pending,
    shm_entries,
    socket_to_front,
    steadily,
    stopped_worker,
    wait_for,
)
from tests.support.tensors import SimpleRegion, simple_region

#: Seconds an unregister may take while a request using the region is held: generous (a
#: noisy CI box); the request is held until the test lets it go, so waiting would show.
QUICK = 10.0


#: A stopped worker is not declared hung while a test holds it (the default is 5 s).
ARGS = ["--allow-client-shm", "true", "--worker-heartbeat-timeout", "60"]


@pytest.fixture(scope="module")
def shm_server() -> Iterator[ServerProcess]:
    """One front, client shared memory; nothing of it left in /dev/shm at its stop."""
    proc = ServerProcess(args=ARGS).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert shm_entries(proc.process.pid) == []


@pytest.fixture(scope="module")
def workers_server() -> Iterator[ServerProcess]:
    """Two HTTP fronts (``--http-workers 2``)."""
    proc = ServerProcess(args=["--http-workers", "2", *ARGS]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def returns_within(call: Callable[[], object], seconds: float) -> bool:
    """Whether ``call()`` returned (or raised) within ``seconds``; it runs in a thread (an
    HTTP client must be made in it: tritonclient.http's greenlets stay in their thread)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def http_request(
    region: SimpleRegion,
) -> tuple[list[httpclient.InferInput], list[httpclient.InferRequestedOutput]]:
    """``simple``'s inputs read from ``region`` (0, 64) and its outputs written there (128, 192)."""
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    for i, tensor in enumerate([*inputs, *outputs]):
        tensor.set_shared_memory(region.name, 64, offset=64 * i)
    return inputs, outputs


def grpc_request(
    region: SimpleRegion,
) -> tuple[list[grpcclient.InferInput], list[grpcclient.InferRequestedOutput]]:
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    for i, tensor in enumerate([*inputs, *outputs]):
        tensor.set_shared_memory(region.name, 64, offset=64 * i)
    return inputs, outputs


def json_request(region: SimpleRegion) -> bytes:
    """The same request as JSON (for a raw connection to one chosen front)."""
    names = ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    params = [
        {
            "shared_memory_region": region.name,
            "shared_memory_byte_size": 64,
            "shared_memory_offset": 64 * i,
        }
        for i in range(4)
    ]
    inputs = [
        {"name": n, "datatype": "INT32", "shape": [1, 16], "parameters": p}
        for n, p in zip(names[:2], params[:2], strict=True)
    ]
    outputs = [{"name": n, "parameters": p} for n, p in zip(names[2:], params[2:], strict=True)]
    return json.dumps({"inputs": inputs, "outputs": outputs}).encode()


def check_outputs(region: SimpleRegion) -> None:
    got = shm.get_contents_as_numpy(region.handle, np.int32, [2, 16], offset=128)
    np.testing.assert_array_equal(got, np.concatenate([region.a + region.b, region.a - region.b]))


def clear_outputs(region: SimpleRegion) -> None:
    shm.set_shared_memory_region(region.handle, [np.zeros((2, 16), np.int32)], offset=128)


def http_unregister(server: ServerProcess, name: str | None) -> Callable[[], None]:
    """A call that unregisters ``name`` (all when None) with a client of its own."""

    def call() -> None:
        with httpclient.InferenceServerClient(server.host_port) as client:
            client.unregister_system_shared_memory(name or "")

    return call


def http_listed(server: ServerProcess) -> set[str]:
    with httpclient.InferenceServerClient(server.host_port) as client:
        return {entry["name"] for entry in client.get_system_shared_memory_status()}


def http_refusal(call: Callable[[], object]) -> tuple[str, str]:
    """(status, message) of the error ``call()`` raises."""
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), info.value.message() or ""


# ---- one front ----------------------------------------------------------------------


@pytest.mark.parametrize("every", [False, True], ids=["named", "all"])
def test_http_unregister_during_inference_answers_at_once_and_defers(
    shm_server: ServerProcess, every: bool
) -> None:
    with (
        simple_region() as region,
        simple_region() as idle,
        httpclient.InferenceServerClient(shm_server.host_port, concurrency=2) as client,
    ):
        client.register_system_shared_memory(region.name, region.key, 256)
        client.register_system_shared_memory(idle.name, idle.key, 256)
        clear_outputs(region)
        inputs, outputs = http_request(region)
        with stopped_worker(shm_server):
            first = client.async_infer("simple", inputs, outputs=outputs)
            assert wait_for(steadily(lambda: pending(shm_server, "simple") == 1), 10)
            # Answered at once, although the request that uses it cannot end yet.
            with httpclient.InferenceServerClient(shm_server.host_port) as other:
                name = None if every else region.name
                assert returns_within(http_unregister(shm_server, name), QUICK)
                if not every:
                    other.unregister_system_shared_memory(idle.name)
                # Still listed (the idle one is gone at once), its name still taken.
                assert http_listed(shm_server) == {region.name}
                (entry,) = other.get_system_shared_memory_status(region.name)
                assert entry == {
                    "name": region.name,
                    "key": region.key,
                    "offset": 0,
                    "byte_size": 256,
                }
                status, message = http_refusal(
                    lambda: other.register_system_shared_memory(region.name, region.key, 256)
                )
                assert status == "400", message
                assert f"shared memory region '{region.name}' already in manager" in message
                # A new request may still name it (Triton accepts it); it holds it too.
                second = client.async_infer("simple", inputs, outputs=outputs)
                assert wait_for(steadily(lambda: pending(shm_server, "simple") == 2), 10)
                assert http_listed(shm_server) == {region.name}
        for answer in (first, second):
            result = answer.get_result()
            assert result.get_output("OUTPUT0")["parameters"]["shared_memory_region"] == region.name
        check_outputs(region)
        # Gone once both answered, without another call.
        assert http_listed(shm_server) == set()
        status, message = http_refusal(lambda: client.get_system_shared_memory_status(region.name))
        assert status == "404", message
        assert f"Unable to find system shared memory region: '{region.name}'" in message
        status, message = http_refusal(lambda: client.infer("simple", inputs, outputs=outputs))
        assert status == "400" and "Unable to find shared memory region" in message, message


@pytest.mark.parametrize("every", [False, True], ids=["named", "all"])
def test_grpc_unregister_during_inference_answers_at_once_and_defers(
    shm_server: ServerProcess, every: bool
) -> None:
    answers: list[object] = []
    done = threading.Condition()

    def callback(result: object, error: object) -> None:
        with done:
            answers.append(error if error is not None else result)
            done.notify_all()

    with simple_region() as region, grpcclient.InferenceServerClient(shm_server.grpc_url) as client:
        client.register_system_shared_memory(region.name, region.key, 256)
        clear_outputs(region)
        inputs, outputs = grpc_request(region)
        with stopped_worker(shm_server):
            client.async_infer("simple", inputs, callback, outputs=outputs)
            assert wait_for(steadily(lambda: pending(shm_server, "simple") == 1), 10)
            with grpcclient.InferenceServerClient(shm_server.grpc_url) as other:
                name = "" if every else region.name
                assert returns_within(lambda: other.unregister_system_shared_memory(name), QUICK)
                listed = other.get_system_shared_memory_status()
                assert set(listed.regions) == {region.name}
                assert listed.regions[region.name].key == region.key
                with pytest.raises(InferenceServerException) as info:
                    other.register_system_shared_memory(region.name, region.key, 256)
                assert info.value.status() == str(grpc.StatusCode.ALREADY_EXISTS)
                assert "already in manager" in (info.value.message() or "")
                client.async_infer("simple", inputs, callback, outputs=outputs)
                assert wait_for(steadily(lambda: pending(shm_server, "simple") == 2), 10)
        with done:
            assert done.wait_for(lambda: len(answers) == 2, 30), answers
        for answer in answers:
            assert isinstance(answer, grpcclient.InferResult), answer
        check_outputs(region)
        assert not client.get_system_shared_memory_status().regions
        with pytest.raises(InferenceServerException) as info:
            client.get_system_shared_memory_status(region.name)
        assert info.value.status() == str(grpc.StatusCode.NOT_FOUND)
        assert f"Unable to find system shared memory region: '{region.name}'" in (
            info.value.message() or ""
        )


def test_unregister_of_an_idle_region_is_immediate(shm_server: ServerProcess) -> None:
    """Triton's ``test_unregister_shm_after_inference``: gone as the call answers."""
    with simple_region() as region, httpclient.InferenceServerClient(shm_server.host_port) as c:
        c.register_system_shared_memory(region.name, region.key, 256)
        inputs, outputs = http_request(region)
        c.infer("simple", inputs, outputs=outputs)
        assert http_listed(shm_server) == {region.name}
        c.unregister_system_shared_memory()
        assert http_listed(shm_server) == set()


# ---- --http-workers: a request another front runs -----------------------------------


def test_a_replicas_request_keeps_the_region_listed(workers_server: ServerProcess) -> None:
    """The region is unregistered through the primary (status, register and unregister are
    its) while a request on the other front uses it: listed until that request ends."""
    (replica,) = workers_server.http_front_pids()
    with simple_region() as region, httpclient.InferenceServerClient(workers_server.host_port) as c:
        c.register_system_shared_memory(region.name, region.key, 256)
        clear_outputs(region)
        sock = socket_to_front(workers_server, replica)
        try:
            with stopped_worker(workers_server):
                sock.sendall(json_infer("simple", json_request(region)))
                assert wait_for(steadily(lambda: pending(workers_server, "simple") == 1), 10)
                assert returns_within(http_unregister(workers_server, None), QUICK)
                assert http_listed(workers_server) == {region.name}
                status, message = http_refusal(
                    lambda: c.register_system_shared_memory(region.name, region.key, 256)
                )
                assert status == "400" and "already in manager" in message, message
            code, _, body = read_response(sock)
        finally:
            sock.close()
        assert code == 200, body
        check_outputs(region)
        # The replica tells the primary once its request is done.
        assert wait_for(lambda: http_listed(workers_server) == set(), 10)
        c.register_system_shared_memory(region.name, region.key, 256)  # the name is free
        c.unregister_system_shared_memory(region.name)
        assert http_listed(workers_server) == set()
