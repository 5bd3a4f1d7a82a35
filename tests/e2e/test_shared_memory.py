"""The system shared-memory extension, driven by tritonclient's own shared-memory helpers.

A server with ``--allow-client-shm true`` (module fixture); the session server (flag
off) for the refusals. Regions are real POSIX shared memory created by
``tritonclient.utils.shared_memory``; the workers read and write them in place.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.support.http import post
from tests.support.server import (
    ServerProcess,
    pending,
    shm_entries,
    steadily,
    stopped_worker,
    wait_for,
)

SHM = "/dev/shm"


@pytest.fixture
def http(shm_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(shm_server.host_port)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def grpc_client(shm_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(shm_server.grpc_url)
    yield client
    client.unregister_system_shared_memory()
    client.close()


class Region:
    """A client's POSIX shared-memory object, made and removed by tritonclient's helpers."""

    def __init__(self, size: int) -> None:
        self.name = f"r{uuid.uuid4().hex[:8]}"
        self.key = f"/oipserve-test-{uuid.uuid4().hex[:12]}"
        self.size = size
        self.handle = shm.create_shared_memory_region(self.name, self.key, size)

    @property
    def path(self) -> str:
        return os.path.join(SHM, self.key[1:])

    def destroy(self) -> None:
        try:
            shm.destroy_shared_memory_region(self.handle)
        except FileNotFoundError:
            pass


@pytest.fixture
def regions() -> Iterator[list[Region]]:
    made: list[Region] = []
    yield made
    for region in made:
        region.destroy()


def _region(regions: list[Region], size: int) -> Region:
    region = Region(size)
    regions.append(region)
    return region


def _http_fail(call: object, status: int, match: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()  # type: ignore[operator]
    assert info.value.status() == str(status), info.value
    assert match in info.value.message(), info.value.message()
    return info.value.message()


def _grpc_fail(call: object, code: grpc.StatusCode, match: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()  # type: ignore[operator]
    assert info.value.status() == str(code), info.value
    assert match in info.value.message(), info.value.message()
    return info.value.message()


SIMPLE_IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_IN1 = np.full((1, 16), 3, dtype=np.int32)


def _simple_regions(regions: list[Region]) -> tuple[Region, Region]:
    """Inputs (both, one after the other) and outputs regions for model ``simple``."""
    inputs = _region(regions, 128)
    outputs = _region(regions, 128)
    shm.set_shared_memory_region(inputs.handle, [SIMPLE_IN0, SIMPLE_IN1])
    return inputs, outputs


def _check_simple_outputs(outputs: Region) -> None:
    out0 = shm.get_contents_as_numpy(outputs.handle, np.int32, [1, 16])
    out1 = shm.get_contents_as_numpy(outputs.handle, np.int32, [1, 16], offset=64)
    assert (out0 == SIMPLE_IN0 + SIMPLE_IN1).all()
    assert (out1 == SIMPLE_IN0 - SIMPLE_IN1).all()


# ---- the happy paths ---------------------------------------------------------------


def test_http_simple_inputs_and_outputs_in_regions(
    http: httpclient.InferenceServerClient, regions: list[Region]
) -> None:
    inputs, outputs = _simple_regions(regions)
    http.register_system_shared_memory(inputs.name, inputs.key, 128)
    http.register_system_shared_memory(outputs.name, outputs.key, 128)
    ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_shared_memory(inputs.name, 64)
    ins[1].set_shared_memory(inputs.name, 64, offset=64)
    outs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    outs[0].set_shared_memory(outputs.name, 64)
    outs[1].set_shared_memory(outputs.name, 64, offset=64)
    result = http.infer("simple", ins, outputs=outs)
    _check_simple_outputs(outputs)
    response = result.get_response()
    assert response["outputs"][0] == {
        "name": "OUTPUT0",
        "datatype": "INT32",
        "shape": [1, 16],
        "parameters": {"shared_memory_region": outputs.name, "shared_memory_byte_size": 64},
    }
    assert response["outputs"][1]["parameters"]["shared_memory_offset"] == 64
    assert "data" not in response["outputs"][1]
    http.unregister_system_shared_memory(inputs.name)
    http.unregister_system_shared_memory(outputs.name)
    assert http.get_system_shared_memory_status() == []


def test_grpc_simple_inputs_and_outputs_in_regions(
    grpc_client: grpcclient.InferenceServerClient, regions: list[Region]
) -> None:
    inputs, outputs = _simple_regions(regions)
    grpc_client.register_system_shared_memory(inputs.name, inputs.key, 128)
    grpc_client.register_system_shared_memory(outputs.name, outputs.key, 128)
    ins = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_shared_memory(inputs.name, 64)
    ins[1].set_shared_memory(inputs.name, 64, offset=64)
    outs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    outs[0].set_shared_memory(outputs.name, 64)
    outs[1].set_shared_memory(outputs.name, 64, offset=64)
    result = grpc_client.infer("simple", ins, outputs=outs)
    _check_simple_outputs(outputs)
    output = result.get_output("OUTPUT1")
    assert output.parameters["shared_memory_region"].string_param == outputs.name
    assert output.parameters["shared_memory_byte_size"].int64_param == 64
    assert output.parameters["shared_memory_offset"].int64_param == 64
    assert list(result.get_response().raw_output_contents) == [b"", b""]
    status = grpc_client.get_system_shared_memory_status()
    assert set(status.regions) == {inputs.name, outputs.name}
    grpc_client.unregister_system_shared_memory(inputs.name)
    grpc_client.unregister_system_shared_memory(outputs.name)
    assert not grpc_client.get_system_shared_memory_status().regions


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_tensors_in_regions(
    shm_server: ServerProcess, regions: list[Region], protocol: str
) -> None:
    words = np.array([b"hello", b"shared", b"memory!"], dtype=np.object_)
    serialized = serialize_byte_tensor(words)
    size = len(serialized.item())
    inputs = _region(regions, size)
    outputs = _region(regions, size)
    shm.set_shared_memory_region(inputs.handle, [serialized])
    module = httpclient if protocol == "http" else grpcclient
    url = shm_server.host_port if protocol == "http" else shm_server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        client.register_system_shared_memory(inputs.name, inputs.key, size)
        client.register_system_shared_memory(outputs.name, outputs.key, size)
        inp = module.InferInput("INPUT0", [3], "BYTES")
        inp.set_shared_memory(inputs.name, size)
        out = module.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(outputs.name, size)
        client.infer("string_upper", [inp], outputs=[out])
        got = shm.get_contents_as_numpy(outputs.handle, np.object_, [3])
        assert list(got) == [b"HELLO", b"SHARED", b"MEMORY!"]
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_http_regions_mixed_with_ordinary_tensors(
    http: httpclient.InferenceServerClient, regions: list[Region]
) -> None:
    inputs = _region(regions, 64)
    outputs = _region(regions, 64)
    shm.set_shared_memory_region(inputs.handle, [SIMPLE_IN0])
    http.register_system_shared_memory(inputs.name, inputs.key, 64)
    http.register_system_shared_memory(outputs.name, outputs.key, 64)
    for binary in (True, False):
        in0 = httpclient.InferInput("INPUT0", [1, 16], "INT32")
        in0.set_shared_memory(inputs.name, 64)
        in1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
        in1.set_data_from_numpy(SIMPLE_IN1, binary_data=binary)
        out0 = httpclient.InferRequestedOutput("OUTPUT0")
        out0.set_shared_memory(outputs.name, 64)
        out1 = httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)
        result = http.infer("simple", [in0, in1], outputs=[out0, out1])
        assert (result.as_numpy("OUTPUT1") == SIMPLE_IN0 - SIMPLE_IN1).all()
        got = shm.get_contents_as_numpy(outputs.handle, np.int32, [1, 16])
        assert (got == SIMPLE_IN0 + SIMPLE_IN1).all()
        shm.set_shared_memory_region(outputs.handle, [np.zeros((1, 16), np.int32)])


def test_grpc_regions_mixed_with_ordinary_tensors(
    grpc_client: grpcclient.InferenceServerClient, regions: list[Region]
) -> None:
    inputs = _region(regions, 64)
    outputs = _region(regions, 64)
    shm.set_shared_memory_region(inputs.handle, [SIMPLE_IN1])
    grpc_client.register_system_shared_memory(inputs.name, inputs.key, 64)
    grpc_client.register_system_shared_memory(outputs.name, outputs.key, 64)
    in0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    in0.set_data_from_numpy(SIMPLE_IN0)  # a raw entry for this one only
    in1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    in1.set_shared_memory(inputs.name, 64)
    out0 = grpcclient.InferRequestedOutput("OUTPUT0")
    out0.set_shared_memory(outputs.name, 64)
    out1 = grpcclient.InferRequestedOutput("OUTPUT1")
    result = grpc_client.infer("simple", [in0, in1], outputs=[out0, out1])
    # OUTPUT0 went into the region; tritonclient still finds OUTPUT1 by position.
    assert (result.as_numpy("OUTPUT1") == SIMPLE_IN0 - SIMPLE_IN1).all()
    got = shm.get_contents_as_numpy(outputs.handle, np.int32, [1, 16])
    assert (got == SIMPLE_IN0 + SIMPLE_IN1).all()


def test_identity_output_of_dynamic_dims_goes_into_the_region(
    http: httpclient.InferenceServerClient, regions: list[Region]
) -> None:
    """identity's dims are [batch, n] in and out: ONNX Runtime writes into the region
    (tests/unit/test_client_regions.py checks that no copy is made)."""
    data = np.random.default_rng(1).random((3, 1000), dtype=np.float32)
    inputs = _region(regions, data.nbytes)
    outputs = _region(regions, data.nbytes + 100)
    shm.set_shared_memory_region(inputs.handle, [data])
    http.register_system_shared_memory(inputs.name, inputs.key, data.nbytes)
    http.register_system_shared_memory(outputs.name, outputs.key, data.nbytes + 100)
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_shared_memory(inputs.name, data.nbytes)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(outputs.name, data.nbytes + 100)
    result = http.infer("identity_fp32", [inp], outputs=[out])
    entry = result.get_response()["outputs"][0]
    assert entry["parameters"]["shared_memory_byte_size"] == data.nbytes
    got = shm.get_contents_as_numpy(outputs.handle, np.float32, list(data.shape))
    assert (got == data).all()


def test_output_whose_dims_do_not_resolve_is_copied_into_the_region(
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    regions: list[Region],
) -> None:
    """reshape's OUTPUT0 is [rows, cols]: its shape is known only after the run."""
    data = np.arange(12, dtype=np.float32)
    inputs = _region(regions, 64)
    outputs = _region(regions, 64)
    shm.set_shared_memory_region(inputs.handle, [data, np.array([3, 4], dtype=np.int64)])
    http.register_system_shared_memory(inputs.name, inputs.key, 64)
    http.register_system_shared_memory(outputs.name, outputs.key, 64)
    for module, client in ((httpclient, http), (grpcclient, grpc_client)):
        shm.set_shared_memory_region(outputs.handle, [np.zeros(16, dtype=np.float32)])
        ins = [module.InferInput("DATA", [12], "FP32"), module.InferInput("SHAPE", [2], "INT64")]
        ins[0].set_shared_memory(inputs.name, 48)
        ins[1].set_shared_memory(inputs.name, 16, offset=48)
        out = module.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(outputs.name, 64)
        result = client.infer("reshape", ins, outputs=[out])
        assert result.get_output("OUTPUT0") is not None
        got = shm.get_contents_as_numpy(outputs.handle, np.float32, [3, 4])
        assert (got == data.reshape(3, 4)).all()


# ---- status, register, unregister ----------------------------------------------------


def test_status_shapes(
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    regions: list[Region],
) -> None:
    region = _region(regions, 256)
    http.register_system_shared_memory(region.name, region.key, 100, offset=16)
    one = {"name": region.name, "key": region.key, "offset": 16, "byte_size": 100}
    assert http.get_system_shared_memory_status() == [one]
    assert http.get_system_shared_memory_status(region.name) == [one]
    status = grpc_client.get_system_shared_memory_status(region.name)
    entry = status.regions[region.name]
    assert (entry.name, entry.key, entry.offset, entry.byte_size) == (
        region.name,
        region.key,
        16,
        100,
    )
    _http_fail(
        lambda: http.get_system_shared_memory_status("nope"),
        404,
        "Unable to find system shared memory region: 'nope'",
    )
    _grpc_fail(
        lambda: grpc_client.get_system_shared_memory_status("nope"),
        grpc.StatusCode.NOT_FOUND,
        "'nope'",
    )


def test_register_errors(
    shm_server: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    regions: list[Region],
) -> None:
    region = _region(regions, 64)
    for key in ("/a/b", "../x", "/..", "", "/"):
        _http_fail(
            lambda key=key: http.register_system_shared_memory("bad", key, 8),
            400,
            "not a POSIX shared-memory name",
        )
    _http_fail(
        lambda: http.register_system_shared_memory("bad", "/no-such-object-xyz", 8),
        400,
        "'/no-such-object-xyz'",
    )
    _http_fail(
        lambda: http.register_system_shared_memory("bad", region.key, 60, offset=8),
        400,
        "past the end",
    )
    _grpc_fail(
        lambda: grpc_client.register_system_shared_memory("bad", region.key, 65),
        grpc.StatusCode.INVALID_ARGUMENT,
        "past the end",
    )
    http.register_system_shared_memory(region.name, region.key, 64)
    _http_fail(
        lambda: http.register_system_shared_memory(region.name, region.key, 64),
        400,
        "already in manager",
    )
    _grpc_fail(
        lambda: grpc_client.register_system_shared_memory(region.name, region.key, 64),
        grpc.StatusCode.ALREADY_EXISTS,
        "already in manager",
    )
    # A symbolic link in /dev/shm is not followed.
    link = f"/dev/shm/oipserve-test-link-{uuid.uuid4().hex[:8]}"
    os.symlink(region.path, link)
    try:
        _http_fail(
            lambda: http.register_system_shared_memory("link", "/" + Path(link).name, 8),
            400,
            "Unable to open",
        )
    finally:
        os.unlink(link)
    # Missing fields, as Triton words them.
    status, body = _post(shm_server, "/v2/systemsharedmemory/region/x/register", {"key": "/k"})
    assert status == 400 and "no 'byte_size' field" in body


def _post(server: ServerProcess, path: str, body: object) -> tuple[int, str]:
    import http.client

    connection = http.client.HTTPConnection(server.host_port)
    try:
        connection.request("POST", path, json.dumps(body))
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def _own_segment(server: ServerProcess) -> str:
    """The name of one of the server's own shared-memory segments."""
    names = shm_entries(server.process.pid)
    assert names, "the server has no segment yet"
    return max(names, key=lambda n: os.stat(os.path.join(SHM, n)).st_mtime)


def test_the_servers_own_segments_are_refused_whatever_their_name(
    shm_server: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    # A large binary request makes sure the front has an input segment.
    inp = httpclient.InferInput("INPUT0", [1, 100_000], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 100_000), np.float32), binary_data=True)
    http.infer("identity_fp32", [inp])
    own = _own_segment(shm_server)
    for client, fail, code in (
        (http, _http_fail, 400),
        (grpc_client, _grpc_fail, grpc.StatusCode.INVALID_ARGUMENT),
    ):
        fail(
            lambda client=client: client.register_system_shared_memory("own", "/" + own, 64),
            code,
            "this server's own segments",
        )
    # Under another name (a hard link): the same object, still refused.
    alias = f"oipserve-test-alias-{uuid.uuid4().hex[:8]}"
    os.link(os.path.join(SHM, own), os.path.join(SHM, alias))
    try:
        _http_fail(
            lambda: http.register_system_shared_memory("own", alias, 64),
            400,
            "this server's own segments",
        )
    finally:
        os.unlink(os.path.join(SHM, alias))
    assert http.get_system_shared_memory_status() == []


def test_flag_off_refuses_register_and_unregister(
    server: ServerProcess, regions: list[Region]
) -> None:
    """With the flag off, register AND unregister (one region, all, CUDA too: the flag is
    checked before CUDA's "no GPU") are refused,
    as Triton refuses them (L0_shared_memory test_client_shm_disabled_by_default); status
    still answers. A deliberate change: unregister used to succeed with the flag off.
    Triton answers 501 / UNIMPLEMENTED; we keep 403 / PERMISSION_DENIED (docs/protocol.md)."""
    region = _region(regions, 64)
    http = httpclient.InferenceServerClient(server.host_port)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    denied = grpc.StatusCode.PERMISSION_DENIED
    try:
        # Triton's phrase first (its QA tests match it), then how to turn the flag on.
        for message in (
            _http_fail(
                lambda: http.register_system_shared_memory(region.name, region.key, 64),
                403,
                "--allow-client-shm",
            ),
            _grpc_fail(
                lambda: client.register_system_shared_memory(region.name, region.key, 64),
                denied,
                "--allow-client-shm",
            ),
            _http_fail(http.unregister_system_shared_memory, 403, "--allow-client-shm"),
            _http_fail(lambda: http.unregister_system_shared_memory("x"), 403, "--allow"),
            _grpc_fail(client.unregister_system_shared_memory, denied, "--allow-client-shm"),
            _grpc_fail(lambda: client.unregister_system_shared_memory("x"), denied, "--allow"),
            _http_fail(http.unregister_cuda_shared_memory, 403, "--allow-client-shm"),
            _grpc_fail(lambda: client.unregister_cuda_shared_memory("x"), denied, "--allow"),
            # CUDA register too: the flag's refusal before "no GPU" (Triton's order).
            _http_fail(
                lambda: http.register_cuda_shared_memory("r", b"0" * 64, 0, 64), 403, "--allow"
            ),
            _grpc_fail(
                lambda: client.register_cuda_shared_memory("r", b"0" * 64, 0, 64), denied, "--allow"
            ),
        ):
            assert message.startswith("Client shared memory is disabled"), message
        assert http.get_system_shared_memory_status() == []
        assert not client.get_system_shared_memory_status().regions
    finally:
        http.close()
        client.close()


def test_cuda_shared_memory_answers_no_gpu(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """Registering is refused with the reason; status and unregister answer as for a server
    with no CUDA region, so clients that clean up first (Triton's shm examples call
    ``unregister_cuda_shared_memory()`` before anything else) work without a GPU."""
    message = "CUDA shared memory is not available: no GPU"
    _http_fail(lambda: http.register_cuda_shared_memory("r", b"0" * 64, 0, 64), 400, message)
    _grpc_fail(
        lambda: grpc_client.register_cuda_shared_memory("r", b"0" * 64, 0, 64),
        grpc.StatusCode.INVALID_ARGUMENT,
        message,
    )
    assert http.get_cuda_shared_memory_status() == []
    assert not grpc_client.get_cuda_shared_memory_status().regions
    http.unregister_cuda_shared_memory()
    http.unregister_cuda_shared_memory("x")
    grpc_client.unregister_cuda_shared_memory()
    grpc_client.unregister_cuda_shared_memory("x")
    found = "Unable to find cuda shared memory region: 'x'"
    assert message in _http_fail(lambda: http.get_cuda_shared_memory_status("x"), 404, found)
    assert message in _grpc_fail(
        lambda: grpc_client.get_cuda_shared_memory_status("x"), grpc.StatusCode.NOT_FOUND, found
    )


def test_unregister_unknown_and_all(
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    regions: list[Region],
) -> None:
    http.unregister_system_shared_memory("never-registered")
    grpc_client.unregister_system_shared_memory("never-registered")
    made = [_region(regions, 64) for _ in range(3)]
    for region in made:
        http.register_system_shared_memory(region.name, region.key, 64)
    assert len(http.get_system_shared_memory_status()) == 3
    grpc_client.unregister_system_shared_memory()
    assert http.get_system_shared_memory_status() == []


# ---- inference errors ----------------------------------------------------------------


def test_inference_errors(
    shm_server: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    regions: list[Region],
) -> None:
    inputs, outputs = _simple_regions(regions)
    http.register_system_shared_memory(inputs.name, inputs.key, 128)
    http.register_system_shared_memory(outputs.name, outputs.key, 128)

    def request(
        module: object, in_size: int = 64, in_offset: int = 0, out_size: int = 64, region: str = ""
    ) -> tuple[list, list]:
        ins = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
        ins[0].set_shared_memory(region or inputs.name, in_size, offset=in_offset)
        ins[1].set_data_from_numpy(SIMPLE_IN1)
        out = module.InferRequestedOutput("OUTPUT0")  # type: ignore[attr-defined]
        out.set_shared_memory(outputs.name, out_size)
        return ins, [out]

    cases = [
        ({"region": "unknown"}, "Unable to find shared memory region: 'unknown'"),
        ({"in_offset": 96}, "Invalid offset + byte size"),
        ({"in_size": 60}, "shared_memory_byte_size is 60"),
        ({"out_size": 32}, "needs 64 bytes but its shared memory region"),
    ]
    for kwargs, match in cases:
        ins, outs = request(httpclient, **kwargs)
        _http_fail(lambda ins=ins, outs=outs: http.infer("simple", ins, outputs=outs), 400, match)
        ins, outs = request(grpcclient, **kwargs)
        _grpc_fail(
            lambda ins=ins, outs=outs: grpc_client.infer("simple", ins, outputs=outs),
            grpc.StatusCode.INVALID_ARGUMENT,
            match,
        )
    # An output of dynamic dims named after the input's (identity: [batch, n]): its
    # shape is known before the run, so is the missing room.
    inp = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    inp.set_shared_memory(inputs.name, 64)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(outputs.name, 32)
    text = _http_fail(
        lambda: http.infer("identity_int32", [inp], outputs=[out]), 400, "needs 64 bytes"
    )
    assert "the model ran" not in text
    # An output whose shape is known only after the run (reshape: [rows, cols]).
    data = httpclient.InferInput("DATA", [16], "FP32")
    data.set_shared_memory(inputs.name, 64)
    target = httpclient.InferInput("SHAPE", [2], "INT64")
    target.set_data_from_numpy(np.array([4, 4], dtype=np.int64))
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(outputs.name, 32)
    _http_fail(lambda: http.infer("reshape", [data, target], outputs=[out]), 400, "the model ran")
    # Data and a region at once.
    body = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "INT32",
                "data": list(range(16)),
                "parameters": {"shared_memory_region": inputs.name, "shared_memory_byte_size": 64},
            }
        ]
    }
    status, text = _post(shm_server, "/v2/models/identity_int32/infer", body)
    assert status == 400 and "must not carry data" in text, text
    body["inputs"][0].pop("data")
    body["inputs"][0]["parameters"] = {"shared_memory_region": inputs.name}
    status, text = _post(shm_server, "/v2/models/identity_int32/infer", body)
    assert status == 400 and "shared_memory_byte_size" in text, text
    # Nothing is left in use: the regions unregister at once.
    http.unregister_system_shared_memory()


def _listed(client: httpclient.InferenceServerClient, name: str) -> bool:
    """Whether the server lists the system shared-memory region ``name``."""
    return any(region["name"] == name for region in client.get_system_shared_memory_status())


def _worker_pid(server: ServerProcess) -> int:
    pids = server.worker_pids()
    assert len(pids) == 1, pids
    return pids[0]


def _identity_request(name: str, nbytes: int) -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("INPUT0", [1, nbytes // 4], "INT32")
    inp.set_shared_memory(name, nbytes)
    return [inp]


def test_truncated_region_fails_that_request_only(
    shm_server: ServerProcess, http: httpclient.InferenceServerClient, regions: list[Region]
) -> None:
    region = _region(regions, 1 << 20)
    shm.set_shared_memory_region(region.handle, [np.arange(1 << 18, dtype=np.int32)])
    http.register_system_shared_memory(region.name, region.key, 1 << 20)
    result = http.infer("identity_int32", _identity_request(region.name, 1 << 20))
    assert (result.as_numpy("OUTPUT0") == np.arange(1 << 18)).all()
    worker = _worker_pid(shm_server)
    os.truncate(region.path, 4096)  # the client shrinks its object behind our back
    for _ in range(2):  # the worker has the object mapped by now: still no SIGBUS
        _http_fail(
            lambda: http.infer("identity_int32", _identity_request(region.name, 1 << 20)),
            400,
            "truncated",
        )
    assert _worker_pid(shm_server) == worker
    small = http.infer("identity_int32", _identity_request(region.name, 4096))
    assert (small.as_numpy("OUTPUT0") == np.arange(1024)).all()
    # An output into the truncated part: refused too.
    inp = _identity_request(region.name, 4096)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(region.name, 4096, offset=8192)
    _http_fail(lambda: http.infer("identity_int32", inp, outputs=[out]), 400, "truncated")
    assert _worker_pid(shm_server) == worker


def test_unlinked_region_is_an_error_not_a_crash(
    shm_server: ServerProcess, http: httpclient.InferenceServerClient, regions: list[Region]
) -> None:
    region = _region(regions, 4096)
    http.register_system_shared_memory(region.name, region.key, 4096)
    http.infer("identity_int32", _identity_request(region.name, 4096))
    worker = _worker_pid(shm_server)
    os.unlink(region.path)
    _http_fail(
        lambda: http.infer("identity_int32", _identity_request(region.name, 4096)),
        400,
        "no longer exists",
    )
    # Created again under the same name: another object, refused until registered again.
    again = shm.create_shared_memory_region("again", region.key, 4096)
    try:
        _http_fail(
            lambda: http.infer("identity_int32", _identity_request(region.name, 4096)),
            400,
            "not the one registered",
        )
    finally:
        shm.destroy_shared_memory_region(again)
    assert _worker_pid(shm_server) == worker
    assert http.is_server_ready()


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _open_files(pid: int) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    out = []
    for fd in fds.iterdir():
        try:
            out.append(os.readlink(fd))
        except OSError:
            pass
    return out


def test_unregister_during_a_request_is_deferred_then_unmaps(
    shm_server: ServerProcess, http: httpclient.InferenceServerClient, regions: list[Region]
) -> None:
    region = _region(regions, 4096)
    shm.set_shared_memory_region(region.handle, [np.arange(1024, dtype=np.int32)])
    http.register_system_shared_memory(region.name, region.key, 4096)
    http.infer("identity_int32", _identity_request(region.name, 4096))
    worker = _worker_pid(shm_server)
    front = shm_server.process.pid
    assert region.path in _maps(worker)
    # NOTE: the front holds no descriptor per registered region (row 8 of issue #35).
    assert region.path not in _open_files(front)
    outcome: dict[str, object] = {}

    def infer() -> None:
        client = httpclient.InferenceServerClient(shm_server.host_port)
        try:
            result = client.infer("identity_int32", _identity_request(region.name, 4096))
            outcome["infer"] = result.as_numpy("OUTPUT0")
        except Exception as exc:  # noqa: BLE001 (reported by the assertion below)
            outcome["infer"] = exc
        client.close()

    def unregister() -> None:
        client = httpclient.InferenceServerClient(shm_server.host_port)
        client.unregister_system_shared_memory(region.name)
        outcome["unregistered"] = time.monotonic()
        client.close()

    with stopped_worker(shm_server):  # the request waits for the worker
        first = threading.Thread(target=infer)
        first.start()
        # Without dynamic batching a request is pending from dispatch to its answer.
        assert wait_for(lambda: pending(shm_server, "identity_int32") == 1, 10)
        second = threading.Thread(target=unregister)
        second.start()
        # Triton's rule (2.53 on): the call answers at once; the region stays listed until
        # the request that uses it ends (tests/e2e/test_shm_deferred_unregister.py).
        second.join(10)
        assert "unregistered" in outcome and "infer" not in outcome, outcome
        assert _listed(http, region.name)
    first.join(30)
    answer = outcome["infer"]
    assert isinstance(answer, np.ndarray) and (answer == np.arange(1024)).all(), answer
    assert not _listed(http, region.name)
    # Nothing of the region is left: not mapped by the worker, not open in the front.
    assert wait_for(lambda: region.path not in _maps(worker), 10), _maps(worker)
    assert region.path not in _open_files(front)
    _http_fail(
        lambda: http.infer("identity_int32", _identity_request(region.name, 4096)),
        400,
        "Unable to find shared memory region",
    )


def test_regions_with_dynamic_batching(shm_server: ServerProcess, regions: list[Region]) -> None:
    """Requests of a batched model, each with its own regions, joined into batches."""
    count = 8
    rows = np.arange(count * 4, dtype=np.float32).reshape(count, 1, 4)
    inputs = [_region(regions, 16) for _ in range(count)]
    outputs = [_region(regions, 16) for _ in range(count)]
    client = httpclient.InferenceServerClient(shm_server.host_port, concurrency=count)
    try:
        for index in range(count):
            shm.set_shared_memory_region(inputs[index].handle, [rows[index]])
            client.register_system_shared_memory(inputs[index].name, inputs[index].key, 16)
            client.register_system_shared_memory(outputs[index].name, outputs[index].key, 16)
        sent = []
        with stopped_worker(shm_server):  # the first batch holds the instance; the rest queue
            for index in range(count):
                inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
                inp.set_shared_memory(inputs[index].name, 16)
                text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
                text.set_data_from_numpy(np.array([[b"t%d" % index]], dtype=np.object_))
                out = httpclient.InferRequestedOutput("OUTPUT0")
                out.set_shared_memory(outputs[index].name, 16)
                wanted = [out, httpclient.InferRequestedOutput("ROWS")]
                sent.append(client.async_infer("batched", [inp, text], outputs=wanted))
            # Two queued behind the held instance leave in one batch when the worker goes on.
            assert wait_for(steadily(lambda: pending(shm_server) >= 2), 10), pending(shm_server)
        sizes = [int(p.get_result().as_numpy("ROWS")[0, 0]) for p in sent]
        for index in range(count):
            got = shm.get_contents_as_numpy(outputs[index].handle, np.float32, [1, 4])
            assert (got == rows[index] + 1).all(), (index, got)
        assert max(sizes) > 1, sizes  # some requests really ran together
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_an_echo_endpoint_refuses_regions_and_lets_them_go(
    shm_server: ServerProcess, http: httpclient.InferenceServerClient, regions: list[Region]
) -> None:
    """The front answers an echo endpoint itself and takes no regions: the request is
    refused, and the region it named is let go at once (unregistering it waits for no one)."""
    status, body = post(shm_server, "/v2/workers/echo/load", {})
    assert status == 200, body
    endpoint = body.decode()
    region = _region(regions, 64)
    shm.set_shared_memory_region(region.handle, [SIMPLE_IN0])
    http.register_system_shared_memory(region.name, region.key, 64)
    # NOTE: a request still holding the region would keep this call waiting: it times out.
    client = httpclient.InferenceServerClient(shm_server.host_port, network_timeout=10.0)
    try:
        inp = httpclient.InferInput("INPUT0", [1, 16], "INT32")
        inp.set_shared_memory(region.name, 64)
        _http_fail(lambda: client.infer(endpoint, [inp]), 400, "takes no shared memory regions")
        client.unregister_system_shared_memory(region.name)
        assert not _listed(http, region.name)
    finally:
        client.close()
        assert post(shm_server, f"/v2/workers/{endpoint}/unload") == (200, b"")
