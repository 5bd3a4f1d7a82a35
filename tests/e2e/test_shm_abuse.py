"""Clients' shared memory against a client that registers without end (issue #35, row 8).

The front used to keep one descriptor open per registered region, with no bound on the
regions: one 4 KB object registered under 20,000 names used up its descriptors, and every
other client's requests then failed with 500. Now registrations are bounded
(``--max-shm-regions``), the front holds no descriptor per region, and a front that does
run out of descriptors answers 503. Real POSIX shared memory from tritonclient's helpers.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import uuid
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, shm_entries

#: The bound this module's server runs with (the default, 1,024, is in docs/limits.md).
CAP = 48


@pytest.fixture(scope="module")
def capped() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        args=["--allow-client-shm", "true", "--max-shm-regions", str(CAP)]
    ).wait_ready()
    yield proc
    code = proc.stop()
    assert code == 0, proc.log
    assert shm_entries(proc.process.pid) == []


@pytest.fixture
def one_object() -> Iterator[tuple[str, object]]:
    """One 4 KB object (its key and tritonclient handle), holding 0..1023 as INT32."""
    key = f"/oipserve-abuse-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("abuse", key, 4096)
    shm.set_shared_memory_region(handle, [np.arange(1024, dtype=np.int32)])
    yield key, handle
    shm.destroy_shared_memory_region(handle)


@pytest.fixture
def clients(capped: ServerProcess) -> Iterator[tuple[object, object]]:
    rest = httpclient.InferenceServerClient(capped.host_port)
    rpc = grpcclient.InferenceServerClient(capped.grpc_url)
    yield rest, rpc
    rest.unregister_system_shared_memory()
    rest.close()
    rpc.close()


def _descriptors(pid: int) -> list[int]:
    return sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))


def _identity(region: str) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", [1, 1024], "INT32")
    tensor.set_shared_memory(region, 4096)
    return [tensor]


def _plain_infer_works(server: ServerProcess) -> None:
    """Another client, on new connections, is served over both protocols."""
    data = np.arange(8, dtype=np.int32).reshape(1, 8)
    rest = httpclient.InferenceServerClient(server.host_port)
    rpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 8], "INT32")
        tensor.set_data_from_numpy(data)
        assert (rest.infer("identity_int32", [tensor]).as_numpy("OUTPUT0") == data).all()
        tensor = grpcclient.InferInput("INPUT0", [1, 8], "INT32")
        tensor.set_data_from_numpy(data)
        assert (rpc.infer("identity_int32", [tensor]).as_numpy("OUTPUT0") == data).all()
    finally:
        rest.close()
        rpc.close()


def test_one_object_under_many_names_is_bounded_and_holds_no_descriptor(
    capped: ServerProcess, one_object: tuple[str, object], clients: tuple[object, object]
) -> None:
    key, _ = one_object
    rest, rpc = clients
    assert isinstance(rest, httpclient.InferenceServerClient)
    assert isinstance(rpc, grpcclient.InferenceServerClient)
    front = capped.process.pid
    rest.is_server_live()
    rpc.is_server_live()  # both clients' connections are open before counting
    before = len(_descriptors(front))
    for index in range(CAP):
        client = rest if index % 2 else rpc
        client.register_system_shared_memory(f"name{index}", key, 4096)
    # NOTE: was one more descriptor per registration (CAP more); a few may come and go.
    assert len(_descriptors(front)) - before < 8, (before, _descriptors(front))
    assert len(rest.get_system_shared_memory_status()) == CAP

    with pytest.raises(InferenceServerException) as refused:
        rest.register_system_shared_memory("one-more", key, 4096)
    assert refused.value.status() == "400", refused.value
    assert "--max-shm-regions" in refused.value.message(), refused.value.message()
    with pytest.raises(InferenceServerException) as refused:
        rpc.register_system_shared_memory("one-more", key, 4096)
    assert refused.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT), refused.value
    assert "--max-shm-regions" in refused.value.message(), refused.value.message()

    _plain_infer_works(capped)
    # Every name still reaches the object: an input from the first, an output into the last.
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(f"name{CAP - 1}", 4096)
    rest.infer("identity_int32", _identity("name0"), outputs=[out])
    # An unregistration frees a place, and only one.
    rest.unregister_system_shared_memory("name3")
    rpc.register_system_shared_memory("again", key, 4096)
    with pytest.raises(InferenceServerException, match="--max-shm-regions"):
        rest.register_system_shared_memory("and-again", key, 4096)


def _post(connection: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, str]:
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"{}").get("error", "")


def _binary_infer(nbytes: int) -> tuple[bytes, dict[str, str]]:
    """A binary-extension identity_fp32 request of ``nbytes`` of tensor data."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, nbytes // 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + bytes(nbytes)
    return body, {"Inference-Header-Content-Length": str(len(header))}


def test_a_front_out_of_descriptors_answers_503_not_500(
    capped: ServerProcess, one_object: tuple[str, object], clients: tuple[object, object]
) -> None:
    """Descriptor exhaustion (the front's soft RLIMIT_NOFILE lowered to its lowest free
    descriptor from outside, with ``prlimit``) is the server's condition: 503 with a
    message that says so, at registration and on the inference path; then it recovers."""
    key, _ = one_object
    front = capped.process.pid
    register = json.dumps({"key": key, "offset": 0, "byte_size": 4096}).encode()
    connection = http.client.HTTPConnection(capped.host_port, timeout=60)
    connection.request("GET", "/v2/health/live")  # connected before the limit is lowered
    connection.getresponse().read()
    limits = resource.prlimit(front, resource.RLIMIT_NOFILE)
    used = set(_descriptors(front))
    lowest_free = next(fd for fd in range(len(used) + 1) if fd not in used)
    resource.prlimit(front, resource.RLIMIT_NOFILE, (lowest_free, limits[1]))
    try:
        status, error = _post(
            connection, "/v2/systemsharedmemory/region/starved/register", register
        )
        assert status == 503, (status, error)
        assert "file descriptor" in error, error
        # A body of a size no request used before needs a new segment (a descriptor):
        # the pool's OSError(EMFILE) has no error kind of its own.
        body, headers = _binary_infer(24 * 1024 * 1024 + 4096)
        connection.request("POST", "/v2/models/identity_fp32/infer", body, headers)
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 503, (response.status, answer)  # was a 500
        assert b"file descriptor" in answer, answer
    finally:
        resource.prlimit(front, resource.RLIMIT_NOFILE, limits)
    connection.close()
    connection = http.client.HTTPConnection(capped.host_port, timeout=60)
    try:
        assert _post(connection, "/v2/systemsharedmemory/region/fed/register", register) == (
            200,
            "",
        )
    finally:
        connection.close()
    _plain_infer_works(capped)
