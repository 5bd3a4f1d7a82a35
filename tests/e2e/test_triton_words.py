"""Refusals that Triton words differently: ours lead with (or contain) Triton's exact phrase.

Triton's clients and its QA tests (qa/L0_http, qa/L0_shared_memory, qa/L0_infer; run by
scripts/triton_qa.py) match these phrases; our own detail follows them. The table is in
docs/protocol.md ("Error texts").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from http import client as http_client

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess

IN = np.arange(16, dtype=np.int32).reshape(1, 16)


@pytest.fixture
def clients(
    shm_server: ServerProcess,
) -> Iterator[tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient]]:
    http = httpclient.InferenceServerClient(shm_server.host_port)
    rpc = grpcclient.InferenceServerClient(shm_server.grpc_url)
    yield http, rpc
    http.unregister_system_shared_memory()
    http.close()
    rpc.close()


@pytest.fixture
def region() -> Iterator[tuple[str, str]]:
    """A client's 64-byte object: (region name, key)."""
    name, key = f"r{uuid.uuid4().hex[:8]}", f"/oipserve-words-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(name, key, 64)
    yield name, key
    shm.destroy_shared_memory_region(handle)


def _message(call: Callable[[], object], status: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == status, info.value
    return str(info.value.message())


def _inputs(module: object) -> list:
    ins = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for tensor in ins:
        tensor.set_data_from_numpy(IN)
    return ins


def test_unknown_version(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
) -> None:
    http, rpc = clients
    phrase = "Request for unknown model: 'simple' version 7 is not found"
    text = _message(lambda: http.infer("simple", _inputs(httpclient), model_version="7"), "404")
    assert text.startswith(phrase), text
    code = str(grpc.StatusCode.NOT_FOUND)
    text = _message(lambda: rpc.infer("simple", _inputs(grpcclient), model_version="7"), code)
    assert text.startswith(phrase), text


def test_output_requested_twice(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
    region: tuple[str, str],
) -> None:
    """Both ways to ask twice: by name (the common check) and into shared memory (each
    front's own check of the regions it holds)."""
    http, rpc = clients
    name, key = region
    http.register_system_shared_memory(name, key, 64)
    phrase = "output 'OUTPUT0' already exists in request"
    bad = str(grpc.StatusCode.INVALID_ARGUMENT)
    for into_shm in (False, True):
        for module, client, status in ((httpclient, http, "400"), (grpcclient, rpc, bad)):
            outs = [module.InferRequestedOutput("OUTPUT0") for _ in range(2)]
            if into_shm:
                for out in outs:
                    out.set_shared_memory(name, 64)
            text = _message(
                lambda client=client, module=module, outs=outs: client.infer(
                    "simple", _inputs(module), outputs=outs
                ),
                status,
            )
            assert text.startswith(f"[request id: <id_unknown>] {phrase}"), text


def test_an_input_twice_is_named_before_an_output_twice_in_shared_memory(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
    region: tuple[str, str],
) -> None:
    """Triton's fronts add every input to the request before any output: an input given
    twice is refused before an output asked twice into shared memory, as before one asked
    twice by name. Until 2026-11-30 the front refused the output, which it reads with its
    region, first."""
    http, rpc = clients
    name, key = region
    http.register_system_shared_memory(name, key, 64)
    bad = str(grpc.StatusCode.INVALID_ARGUMENT)
    for module, client, status in ((httpclient, http, "400"), (grpcclient, rpc, bad)):
        ins = _inputs(module)
        outs = [module.InferRequestedOutput("OUTPUT0") for _ in range(2)]
        for out in outs:
            out.set_shared_memory(name, 64)
        text = _message(
            lambda client=client, ins=ins, outs=outs: client.infer(
                "simple", [*ins, ins[0]], outputs=outs, request_id="twice"
            ),
            status,
        )
        assert text.startswith("[request id: twice] input 'INPUT0' already exists in request"), text


def test_region_offsets(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
    region: tuple[str, str],
) -> None:
    """An offset past the region, an offset + size past it, and a sum past 2**64 (HTTP
    only: gRPC's int64 parameters cannot carry it): Triton's three phrases."""
    http, _ = clients
    name, key = region
    http.register_system_shared_memory(name, key, 64)
    cases = [
        (64, 64, "Invalid offset for shared memory region: "),
        (32, 64, "Invalid offset + byte size for shared memory region: "),
        (32, 2**64 - 32, "Integer overflow detected: byte_size "),
    ]
    for offset, size, phrase in cases:
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, size, offset=offset)
        text = _message(
            lambda out=out: http.infer("simple", _inputs(httpclient), outputs=[out]), "400"
        )
        assert f"output 'OUTPUT0': {phrase}" in text, text


def test_register_past_the_end(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
    region: tuple[str, str],
) -> None:
    http, rpc = clients
    name, key = region
    phrase = f"failed to register shared memory region '{name}': invalid args"
    text = _message(lambda: http.register_system_shared_memory(name, key, 65), "400")
    assert text.startswith(phrase) and "past the end" in text, text
    bad = str(grpc.StatusCode.INVALID_ARGUMENT)
    text = _message(lambda: rpc.register_system_shared_memory(name, key, 1, offset=64), bad)
    assert text.startswith(phrase) and "past the end" in text, text


def test_input_region_of_the_wrong_size(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
) -> None:
    http, rpc = clients
    name, key = f"r{uuid.uuid4().hex[:8]}", f"/oipserve-words-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(name, key, 128)
    try:
        http.register_system_shared_memory(name, key, 128)
        phrase = (
            "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128"
        )
        bad = str(grpc.StatusCode.INVALID_ARGUMENT)
        for module, client, status in ((httpclient, http, "400"), (grpcclient, rpc, bad)):
            ins = _inputs(module)
            ins[1].set_shared_memory(name, 128)
            text = _message(lambda client=client, ins=ins: client.infer("simple", ins), status)
            assert phrase in text and "shared_memory_byte_size is 128" in text, text
    finally:
        http.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)


#: (model, datatype, data, the shape claimed, Triton's words): qa/L0_input_validation's
#: "compromised input shape" cases, binary data over both protocols (until 2026-11-30 our
#: words alone: "input 'INPUT0' should have 64 bytes of data ...", "... its BYTES data has 2").
SIZES = [
    (
        "simple",
        np.arange(15, dtype=np.int32).reshape(1, 15),
        [1, 16],
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
    ),
    (
        "identity_bytes",
        np.array([["a", "b"]], dtype=object),
        [1, 3],
        "expected 3 string elements for inference input 'INPUT0' for model 'identity_bytes', got 2",
    ),
    (
        "identity_bytes",
        np.array([["a", "b", "c", "d"]], dtype=object),
        [1, 3],
        "unexpected number of string elements 4 for inference input 'INPUT0' for model "
        "'identity_bytes', expecting 3",
    ),
]


@pytest.mark.parametrize(("model", "data", "shape", "phrase"), SIZES)
def test_data_of_another_size_than_its_shape(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
    model: str,
    data: np.ndarray,
    shape: list[int],
    phrase: str,
) -> None:
    http, rpc = clients
    bad = str(grpc.StatusCode.INVALID_ARGUMENT)
    datatype = "BYTES" if data.dtype == object else "INT32"
    for module, client, status in ((httpclient, http, "400"), (grpcclient, rpc, bad)):
        inputs = [module.InferInput("INPUT0", list(data.shape), datatype)]
        inputs[0].set_data_from_numpy(data)
        inputs[0].set_shape(shape)  # (the data kept: another size than the shape holds)
        if model == "simple":
            inputs.append(_inputs(module)[1])
        text = _message(lambda client=client, inputs=inputs: client.infer(model, inputs), status)
        assert phrase in text, text


def test_register_an_invalid_key(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
) -> None:
    http, rpc = clients
    bad = str(grpc.StatusCode.INVALID_ARGUMENT)
    for key in ("/", "///", "/a/b"):
        phrase = f"cannot register shared memory region 'r' - invalid shm key '{key}'"
        for client, status in ((http, "400"), (rpc, bad)):
            text = _message(
                lambda client=client, key=key: client.register_system_shared_memory("r", key, 8),
                status,
            )
            assert text.startswith(phrase) and "not a POSIX shared-memory name" in text, text


def test_register_a_reserved_key(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
) -> None:
    """Keys of Triton's Python backend (its prefix after any leading '/') are refused by
    name before anything else is checked, as L0_shared_memory test_register_reserved_names
    expects; the object need not exist."""
    http, rpc = clients
    prefix = "triton_python_backend_shm_region_"
    bad = str(grpc.StatusCode.INVALID_ARGUMENT)
    for key in (f"{prefix}_k", f"/{prefix}_k", f"///{prefix}_k", f"/{prefix}"):
        phrase = (
            f"cannot register shared memory region 'r' with key '{key}' as the key contains "
            f"the reserved prefix '{prefix}'"
        )
        for client, status in ((http, "400"), (rpc, bad)):
            text = _message(
                lambda client=client, key=key: client.register_system_shared_memory("r", key, 8),
                status,
            )
            assert text == phrase, text
    assert http.get_system_shared_memory_status() == []


def _refusal_of(server: ServerProcess, path: str, headers: dict[str, str]) -> tuple[int, str]:
    """The answer to a request whose head only is sent (the body is never written)."""
    conn = http_client.HTTPConnection(server.host_port, timeout=10)
    try:
        conn.putrequest("POST", path)
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())["error"]
    finally:
        conn.close()


def test_a_json_body_over_the_limit(shm_server: ServerProcess) -> None:
    """Triton's phrase first for a JSON body (L0_http test_loading_large_invalid_model
    matches it), then ours; the status stays 413 (Triton: 400; its test asks only for
    not 200). A binary-extension body keeps our words alone: it is not all JSON."""
    limit = 256 * 1024 * 1024  # the default --max-request-bytes
    size = limit + 1
    json_head = {"Content-Type": "application/json", "Content-Length": str(size)}
    status, text = _refusal_of(shm_server, "/v2/repository/models/m/load", json_head)
    assert status == 413, text
    assert text.startswith(
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of "
        f"{limit} bytes: the request body has {size} bytes, more than the limit of {limit}"
    ), text
    binary_head = {"Content-Length": str(size), "Inference-Header-Content-Length": "20"}
    status, text = _refusal_of(shm_server, "/v2/models/simple/infer", binary_head)
    assert status == 413, text
    assert text == f"the request body has {size} bytes, more than the limit of {limit} bytes"


#: (model, datatype, shape, Triton's phrase): L0_http test_buffer_size_overflow's shapes.
#: simple_identity batches (max_batch_size 8): the count is refused before the batch size.
OVERFLOWS = [
    ("simple_identity", "BYTES", [16, 2**60 + 2], "causes total element count to exceed"),
    ("identity_fp32", "FP32", [16, 2**60 + 2], "causes total element count to exceed"),
    ("identity_fp32", "FP32", [4, 2**60 + 2], "byte size overflow for input 'INPUT0'"),
]


@pytest.mark.parametrize(("model", "datatype", "shape", "phrase"), OVERFLOWS)
def test_an_overflowing_shape(
    shm_server: ServerProcess, model: str, datatype: str, shape: list[int], phrase: str
) -> None:
    """A shape whose element count (or byte size) passes int64 is refused in Triton's
    words before any other check of the shape (batch size included), REST and gRPC."""
    data: list[object] = ["a"] if datatype == "BYTES" else [1.0]
    tensor = {"name": "INPUT0", "shape": shape, "datatype": datatype, "data": data}
    body = json.dumps({"inputs": [tensor]})
    conn = http_client.HTTPConnection(shm_server.host_port, timeout=10)
    try:
        conn.request(
            "POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        status, text = resp.status, json.loads(resp.read())["error"]
    finally:
        conn.close()
    assert status == 400, text
    assert phrase in text, text
    request = service_pb2.ModelInferRequest(model_name=model)
    given = request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    if datatype == "BYTES":
        given.contents.bytes_contents.append(b"a")
    else:
        given.contents.fp32_contents.append(1.0)
    with grpc.insecure_channel(shm_server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert phrase in str(info.value.details()), info.value.details()


def _binary_refusal(server: ServerProcess, model: str, tensor: dict, blob: bytes) -> str:
    """The 400's message for one binary-extension request: ``tensor``'s header, ``blob``."""
    header = json.dumps({"id": "cut", "inputs": [tensor]}).encode()
    head = {"Inference-Header-Content-Length": str(len(header))}
    conn = http_client.HTTPConnection(server.host_port, timeout=10)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", header + blob, head)
        resp = conn.getresponse()
        status, text = resp.status, json.loads(resp.read())["error"]
    finally:
        conn.close()
    assert status == 400, text
    return str(text)


def _raw_refusal(server: ServerProcess, model: str, shape: list[int], blob: bytes) -> str:
    """The INVALID_ARGUMENT's details for one gRPC request of a BYTES input in raw bytes."""
    request = service_pb2.ModelInferRequest(model_name=model, id="cut")
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=shape)
    request.raw_input_contents.append(blob)
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return str(info.value.details())


#: (elements, bytes after them, the shape's count, Triton's words): core's walk over BYTES
#: data (ValidateBytesInputs) meets a length prefix cut off before it counts the element.
CUT_OFF = [
    (
        [b"ab"],
        b"\x01\x00",
        2,
        "[request id: cut] incomplete string length indicator for inference input 'INPUT0' for "
        "model 'identity_bytes', expecting 4 bytes but only 2 bytes available. Please make sure "
        "the string length indicator is in one buffer. (BYTES data of input 'INPUT0': the "
        "length prefix of element 1 is cut off: 2 of 4 bytes at offset 6)",
    ),
    (  # within the count, too: the prefix first
        [b"ab"],
        b"\x01",
        1,
        "[request id: cut] incomplete string length indicator for inference input 'INPUT0' for "
        "model 'identity_bytes', expecting 4 bytes but only 1 bytes available.",
    ),
    (  # an element past the count before the cut-off prefix after it
        [b"ab", b"c"],
        b"\x01",
        1,
        "[request id: cut] unexpected number of string elements 2 for inference input "
        "'INPUT0' for model 'identity_bytes', expecting 1",
    ),
]


@pytest.mark.parametrize(("elements", "tail", "count", "phrase"), CUT_OFF)
def test_a_bytes_length_prefix_cut_off(
    shm_server: ServerProcess, elements: list[bytes], tail: bytes, count: int, phrase: str
) -> None:
    """Triton's words (with the request's id), then ours, REST binary and gRPC raw. Until
    2026-11-30 ours alone: "BYTES data of input 'INPUT0' is malformed: ..."."""
    blob = b"".join(len(e).to_bytes(4, "little") + e for e in elements) + tail
    shape = [1, count]
    tensor = {
        "name": "INPUT0",
        "shape": shape,
        "datatype": "BYTES",
        "parameters": {"binary_data_size": len(blob)},
    }
    for text in (
        _binary_refusal(shm_server, "identity_bytes", tensor, blob),
        _raw_refusal(shm_server, "identity_bytes", shape, blob),
    ):
        assert text.startswith(phrase), text


def test_a_negative_size_in_bytes_shape(shm_server: ServerProcess) -> None:
    """Core's GetElementCount words for BYTES (another phrase than for fixed-size types)."""
    request = service_pb2.ModelInferRequest(model_name="identity_bytes")
    given = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, -2])
    given.contents.bytes_contents.append(b"a")
    with grpc.insecure_channel(shm_server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert str(info.value.details()).startswith(
        "tensor 'INPUT0' contains an invalid dimension in shape [1,-2]: "
    ), info.value.details()


#: (datatype, values sent, the shape's count, Triton's gRPC words): typed contents of another
#: count than the shape reach core as bytes (its byte size, or BYTES element, check).
CONTENTS_COUNT = [
    (
        "FP32",
        [1.0] * 3,
        2,
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
        "'identity_fp32'. Expected 8, got 12: input 'INPUT0': its shape holds 2 elements but "
        "its contents have 3",
    ),
    (
        "BYTES",
        [b"a"],
        2,
        "[request id: <id_unknown>] expected 2 string elements for inference input 'INPUT0' "
        "for model 'identity_bytes', got 1",
    ),
]


@pytest.mark.parametrize(("datatype", "values", "count", "phrase"), CONTENTS_COUNT)
def test_typed_contents_of_another_count(
    shm_server: ServerProcess, datatype: str, values: list[object], count: int, phrase: str
) -> None:
    model = "identity_bytes" if datatype == "BYTES" else "identity_fp32"
    request = service_pb2.ModelInferRequest(model_name=model)
    given = request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, count])
    field = "bytes_contents" if datatype == "BYTES" else "fp32_contents"
    getattr(given.contents, field).extend(values)
    with grpc.insecure_channel(shm_server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert str(info.value.details()).startswith(phrase), info.value.details()


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        (["a", "b"], "expected 3 string elements for inference input 'INPUT0' for model "),
        (["a"] * 4, "unexpected number of string elements 4 for inference input 'INPUT0' for "),
    ],
)
def test_json_bytes_of_another_count(
    shm_server: ServerProcess, data: list[str], phrase: str
) -> None:
    """Triton's HTTP front sizes BYTES JSON by the data itself: its core counts the elements
    (with the request's id), then ours. Until 2026-11-30 ours alone."""
    tensor = {"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES", "data": data}
    body = json.dumps({"inputs": [tensor]})
    conn = http_client.HTTPConnection(shm_server.host_port, timeout=10)
    try:
        conn.request(
            "POST", "/v2/models/identity_bytes/infer", body, {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        status, text = resp.status, json.loads(resp.read())["error"]
    finally:
        conn.close()
    assert status == 400, text
    assert text.startswith(f"[request id: <id_unknown>] {phrase}"), text
    assert f"its shape holds 3 elements but 'data' has {len(data)}" in text, text


def test_a_bytes_length_prefix_cut_off_in_a_region(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
) -> None:
    """A client's region is read by the worker, which checks it the same way, in Triton's
    words, then ours; the front puts the request's id first, as core does (the worker does
    not know it: the id was missing until 2026-11-30). Until then too, ours alone: "BYTES
    data of input 'INPUT0' in shared memory is malformed"."""
    http, rpc = clients
    name, key = f"r{uuid.uuid4().hex[:8]}", f"/oipserve-words-{uuid.uuid4().hex[:12]}"
    blob = (2).to_bytes(4, "little") + b"ab" + b"\x01\x00"
    handle = shm.create_shared_memory_region(name, key, len(blob))
    try:
        shm.set_shared_memory_region(handle, [np.frombuffer(blob, np.uint8)])
        http.register_system_shared_memory(name, key, len(blob))
        phrase = (
            "incomplete string length indicator for inference input 'INPUT0' for model "
            "'identity_bytes', expecting 4 bytes but only 2 bytes available."
        )
        bad = str(grpc.StatusCode.INVALID_ARGUMENT)
        for module, client, status, rid in (
            (httpclient, http, "400", "words-7"),
            (grpcclient, rpc, bad, "words-8"),
            (httpclient, http, "400", ""),
            (grpcclient, rpc, bad, ""),
        ):
            given = module.InferInput("INPUT0", [1, 2], "BYTES")
            given.set_shared_memory(name, len(blob))
            text = _message(
                lambda client=client, given=given, rid=rid: client.infer(
                    "identity_bytes", [given], request_id=rid
                ),
                status,
            )
            assert text.startswith(f"[request id: {rid or '<id_unknown>'}] {phrase}"), text
            assert text.endswith("(a client's shared memory region)"), text
    finally:
        http.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)


#: (elements before, the last element's declared length and the bytes sent of it, the
#: element's index): an element that runs past the data's end while the element count is
#: right passes Triton's core; its ONNX Runtime backend refuses it (backend_common's
#: ValidateStringBuffer), without the model's name or the request's id.
OVERRUNS = [([], 10, b"abc", 0), ([b"ab"], 5, b"xy", 1)]


def _overrun(elements: list[bytes], length: int, tail: bytes) -> bytes:
    blob = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    return blob + length.to_bytes(4, "little") + tail


def _overrun_words(length: int, left: int, index: int) -> str:
    return (
        f"incomplete string data for inference input 'INPUT0', expecting string of length "
        f"{length} but only {left} bytes available (BYTES data of input 'INPUT0': element "
        f"{index} declares {length} bytes but only {left} remain)"
    )


@pytest.mark.parametrize(("elements", "length", "tail", "index"), OVERRUNS)
def test_a_bytes_element_past_the_end(
    shm_server: ServerProcess, elements: list[bytes], length: int, tail: bytes, index: int
) -> None:
    """Triton's backend's words, then ours, REST binary and gRPC raw (until 2026-11-30
    ours alone: "BYTES data of input 'INPUT0' is malformed: element 0 declares ...")."""
    blob = _overrun(elements, length, tail)
    shape = [1, len(elements) + 1]
    tensor = {
        "name": "INPUT0",
        "shape": shape,
        "datatype": "BYTES",
        "parameters": {"binary_data_size": len(blob)},
    }
    words = _overrun_words(length, len(tail), index)
    for text in (
        _binary_refusal(shm_server, "identity_bytes", tensor, blob),
        _raw_refusal(shm_server, "identity_bytes", shape, blob),
    ):
        assert text == words, text


def test_a_bytes_element_past_the_end_of_a_region(
    clients: tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient],
) -> None:
    """The worker reading a client's region refuses it in the same words, then says where;
    no request id (Triton's backend puts none)."""
    http, rpc = clients
    name, key = f"r{uuid.uuid4().hex[:8]}", f"/oipserve-words-{uuid.uuid4().hex[:12]}"
    blob = _overrun([], 10, b"abc")
    handle = shm.create_shared_memory_region(name, key, len(blob))
    try:
        shm.set_shared_memory_region(handle, [np.frombuffer(blob, np.uint8)])
        http.register_system_shared_memory(name, key, len(blob))
        words = _overrun_words(10, 3, 0) + " (a client's shared memory region)"
        bad = str(grpc.StatusCode.INVALID_ARGUMENT)
        for module, client, status in ((httpclient, http, "400"), (grpcclient, rpc, bad)):
            given = module.InferInput("INPUT0", [1, 1], "BYTES")
            given.set_shared_memory(name, len(blob))
            text = _message(
                lambda client=client, given=given: client.infer(
                    "identity_bytes", [given], request_id="words-9"
                ),
                status,
            )
            assert text == words, text
    finally:
        http.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)
