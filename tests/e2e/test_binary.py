"""The binary tensor data extension end to end: tritonclient, raw bodies, errors, copies.

Every error case sends a hand-built body with ``http.client`` (tritonclient
never builds a malformed one) and then checks the server still answers.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import os
import socket
import struct
import zlib
from functools import partial
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from oipserve.config.settings import load_settings
from oipserve.dataplane.plane import DataPlane
from oipserve.front.rest.body import Body
from oipserve.front.rest.resources import ModelResource
from oipserve.models.registry import ModelRegistry
from oipserve.request.inference import InputTensor
from oipserve.request.placement import payload as _payload
from oipserve.wire.json_request import decode_request
from oipserve.wire.shm import BufferPool
from tests.support.raw_http import read_responses
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, wait_for
from tests.support.sockets import read_by_peer
from workers.runtime import ModelSession

SAMPLE_FP32 = SAMPLE_REPOSITORY / "identity_fp32" / "1" / "model.onnx"

DTYPES: dict[str, type] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
    "BYTES": np.object_,
}


def request(
    server: ServerProcess,
    path: str,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(server.host_port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def binary_body(header: dict[str, object], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    """A body in the extension's layout and the header that gives the JSON length."""
    text = json.dumps(header).encode()
    return text + b"".join(chunks), {"Inference-Header-Content-Length": str(len(text))}


def bytes_blob(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def split_response(headers: dict[str, str], body: bytes) -> tuple[dict[str, object], bytes]:
    length = int(headers["inference-header-content-length"])
    return json.loads(body[:length]), body[length:]


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if datatype == "BYTES":
        # ONNX Runtime's string tensors need UTF-8; lengths vary, including empty.
        alphabet = list("abcXYZ 019\u00e9\u20ac")  # multi-byte UTF-8 too
        words = [
            "".join(rng.choice(alphabet, int(rng.integers(0, 9)))).encode()
            for _ in range(int(np.prod(shape)))
        ]
        return np.array(words, dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        return (rng.standard_normal(shape) * 100).astype(DTYPES[datatype])
    info = np.iinfo(DTYPES[datatype])
    return rng.integers(info.min, info.max, shape, dtype=DTYPES[datatype], endpoint=True)


def assert_still_serving(server: ServerProcess) -> None:
    body, headers = binary_body(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [2],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 8},
                }
            ]
        },
        np.array([1.5, -2], dtype=np.float32).tobytes(),
    )
    status, _, answer = request(server, "/v2/models/versioned/versions/1/infer", body, headers)
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == [2.5, -1.0]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(
        server.host_port, network_timeout=120, connection_timeout=120
    )


# ---- round trips with tritonclient -----------------------------------------------------


@pytest.mark.parametrize("datatype", list(DTYPES))
def test_every_datatype_every_combination(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    data = sample(datatype, (3, 5), seed=len(datatype))
    for binary_in in (True, False):
        for binary_out in (True, False):
            if datatype == "BF16" and not binary_in:
                continue  # tritonclient sends BF16 only in binary form
            tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
            tensor.set_data_from_numpy(data, binary_data=binary_in)
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
            result = client.infer(f"identity_{datatype.lower()}", [tensor], outputs=[output])
            got = result.as_numpy("OUTPUT0")
            entry = result.get_output("OUTPUT0")
            assert ("data" not in entry) is binary_out, entry
            if binary_out:
                expected_size = (
                    sum(4 + len(e) for e in data.reshape(-1))
                    if datatype == "BYTES"
                    else data.nbytes
                )
                assert entry["parameters"]["binary_data_size"] == expected_size
            if datatype == "BYTES" and not binary_out:
                # JSON carries BYTES as strings; tritonclient hands back str elements.
                got = np.array(
                    [g.encode() if isinstance(g, str) else g for g in got.reshape(-1)],
                    dtype=np.object_,
                ).reshape(got.shape)
            assert got.shape == data.shape
            assert got.dtype == data.dtype or datatype == "BYTES"
            assert np.array_equal(got, data), (datatype, binary_in, binary_out)


def test_mixed_json_and_binary_inputs(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    for bin_a in (True, False):
        for bin_b in (True, False):
            inputs = [
                httpclient.InferInput("INPUT0", [2, 16], "INT32"),
                httpclient.InferInput("INPUT1", [2, 16], "INT32"),
            ]
            inputs[0].set_data_from_numpy(a, binary_data=bin_a)
            inputs[1].set_data_from_numpy(b, binary_data=bin_b)
            outputs = [
                httpclient.InferRequestedOutput("OUTPUT0", binary_data=bin_b),
                httpclient.InferRequestedOutput("OUTPUT1", binary_data=bin_a),
            ]
            result = client.infer("simple", inputs, outputs=outputs)
            assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
            assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert ("data" in result.get_output("OUTPUT0")) is not bin_b
            assert ("data" in result.get_output("OUTPUT1")) is not bin_a


def test_64mib_fp32_round_trip(client: httpclient.InferenceServerClient) -> None:
    data = np.random.default_rng(7).random((4096, 4096), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    result = client.infer(
        "identity_fp32", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")]
    )
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("request_encoding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_encoding", [None, "gzip", "deflate"])
def test_compression_both_ways(
    client: httpclient.InferenceServerClient,
    request_encoding: str | None,
    response_encoding: str | None,
) -> None:
    data = np.tile(np.arange(500, dtype=np.float32), (40, 1))  # 80 KB: above the join limit
    for as_binary in (True, False):
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=as_binary)
        result = client.infer(
            "identity_fp32",
            [tensor],
            outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=as_binary)],
            request_compression_algorithm=request_encoding,
            response_compression_algorithm=response_encoding,
        )
        assert np.array_equal(result.as_numpy("OUTPUT0"), data)


def test_compressed_response_on_the_wire(server: ServerProcess) -> None:
    data = np.arange(20000, dtype=np.float32)
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [2, 10000],
                "datatype": "FP32",
                "parameters": {"binary_data_size": data.nbytes},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_body(header, data.tobytes())
    for name, decompress in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
        status, got, answer = request(
            server, "/v2/models/identity_fp32/infer", body, {**headers, "Accept-Encoding": name}
        )
        assert status == 200 and got["content-encoding"] == name
        assert got["content-type"] == "application/octet-stream"
        meta, rest = split_response(got, decompress(answer))
        assert meta["outputs"][0]["parameters"] == {"binary_data_size": data.nbytes}
        assert rest == data.tobytes()
    # the request body compressed by hand, both ways
    for name, compress in (("gzip", gzip.compress), ("deflate", zlib.compress)):
        status, got, answer = request(
            server,
            "/v2/models/identity_fp32/infer",
            compress(body),
            {**headers, "Content-Encoding": name},
        )
        assert status == 200, answer
        assert split_response(got, answer)[1] == data.tobytes()
    status, got, answer = request(
        server, "/v2/models/identity_fp32/infer", body, {**headers, "Content-Encoding": "br"}
    )
    assert status == 501 and got["accept-encoding"] == "gzip, deflate"


def test_binary_data_output_and_per_output_override(server: ServerProcess) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "INT32",
                "parameters": {"binary_data_size": 64},
            },
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ],
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1", "parameters": {"binary_data": False}}],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_body(header, a.tobytes())
    status, got, answer = request(server, "/v2/models/simple/infer", body, headers)
    assert status == 200, answer
    assert got["content-type"] == "application/octet-stream"
    meta, rest = split_response(got, answer)
    out0, out1 = meta["outputs"]
    assert out0["parameters"] == {"binary_data_size": 64} and "data" not in out0
    assert out1["data"] == (a - 1).reshape(-1).tolist()
    assert np.array_equal(np.frombuffer(rest, dtype=np.int32), (a + 1).reshape(-1))
    # no binary output: plain JSON, no length header
    header["parameters"] = {}
    body, headers = binary_body(header, a.tobytes())
    status, got, answer = request(server, "/v2/models/simple/infer", body, headers)
    assert status == 200 and got["content-type"].startswith("application/json")
    assert "inference-header-content-length" not in got
    assert json.loads(answer)["outputs"][0]["data"] == (a + 1).reshape(-1).tolist()


def test_bytes_binary_with_prefixes(server: ServerProcess) -> None:
    blob = bytes_blob(b"abc", b"", b"Hello")
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [3],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(blob)},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    body, headers = binary_body(header, blob)
    status, got, answer = request(server, "/v2/models/string_upper/infer", body, headers)
    assert status == 200, answer
    meta, rest = split_response(got, answer)
    assert rest == bytes_blob(b"ABC", b"", b"HELLO")
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == len(rest)


def test_raw_binary_request(server: ServerProcess) -> None:
    data = np.array([1, 2, 3, 4.5], dtype=np.float32)
    status, got, answer = request(
        server,
        "/v2/models/versioned/versions/2/infer",
        data.tobytes(),
        {"Inference-Header-Content-Length": "0"},
    )
    assert status == 200, answer
    meta, rest = split_response(got, answer)
    assert meta["outputs"][0]["shape"] == [4]
    assert np.array_equal(np.frombuffer(rest, dtype=np.float32), data + 2)
    # (raw BYTES requests: tests/e2e/test_raw_bytes.py)


# ---- errors -----------------------------------------------------------------------------

FP32_4 = np.arange(4, dtype=np.float32).tobytes()


def fp32_input(name: str = "INPUT0", **params: object) -> dict[str, object]:
    return {"name": name, "shape": [4], "datatype": "FP32", "parameters": params}


ERRORS: dict[str, tuple[str, bytes, dict[str, str], str]] = {}


def _error(
    case: str,
    model: str,
    header: dict[str, object] | None,
    *chunks: bytes,
    expect: str,
    headers: dict[str, str] | None = None,
) -> None:
    if header is None:
        body, extra = b"".join(chunks), {}
    else:
        body, extra = binary_body(header, *chunks)
    ERRORS[case] = (model, body, {**extra, **(headers or {})}, expect)


_error(
    "size not the byte size",
    "versioned",
    {"inputs": [fp32_input(binary_data_size=12)]},
    FP32_4[:12],
    expect="INPUT0",
)
_error(
    "size larger than the tensor",
    "versioned",
    {"inputs": [fp32_input(binary_data_size=20)]},
    FP32_4 + b"\0" * 4,
    expect="INPUT0",
)
_error(
    "size runs past the body",
    "versioned",
    {"inputs": [fp32_input(binary_data_size=16)]},
    FP32_4[:8],
    expect="INPUT0",
)
_error(
    "bytes after the last chunk",
    "versioned",
    {"inputs": [fp32_input(binary_data_size=16)]},
    FP32_4 + b"xx",
    expect="INPUT0",
)
_error(
    "negative size",
    "versioned",
    {"inputs": [fp32_input(binary_data_size=-16)]},
    FP32_4,
    expect="INPUT0",
)
_error(
    "string size",
    "versioned",
    {"inputs": [fp32_input(binary_data_size="16")]},
    FP32_4,
    expect="INPUT0",
)
_error(
    "float size",
    "versioned",
    {"inputs": [fp32_input(binary_data_size=16.0)]},
    FP32_4,
    expect="INPUT0",
)
_error(
    "bool size",
    "versioned",
    {"inputs": [fp32_input(binary_data_size=True)]},
    FP32_4,
    expect="INPUT0",
)
_error(
    "data and size",
    "versioned",
    {"inputs": [{**fp32_input(binary_data_size=16), "data": [1, 2, 3, 4]}]},
    FP32_4,
    expect="INPUT0",
)
_error(
    "two unsized binary inputs",
    "simple",
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32"},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32"},
        ]
    },
    b"\0" * 128,
    expect="INPUT1",
)
_error(
    "second chunk runs past the body",
    "simple",
    {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "INT32",
                "parameters": {"binary_data_size": 64},
            },
            {
                "name": "INPUT1",
                "shape": [1, 16],
                "datatype": "INT32",
                "parameters": {"binary_data_size": 64},
            },
        ]
    },
    b"\0" * 100,
    expect="INPUT1",
)
_error(
    "BYTES prefixes do not tile",
    "string_upper",
    {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [2],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": 10},
            }
        ]
    },
    bytes_blob(b"ab") + b"\x09\0\0\0",
    expect="INPUT0",
)
_error(
    "BYTES element count differs",
    "string_upper",
    {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [3],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": 12},
            }
        ]
    },
    bytes_blob(b"ab", b"cd"),
    expect="INPUT0",
)
_error(
    "size without the header",
    "versioned",
    None,
    json.dumps({"inputs": [fp32_input(binary_data_size=16)]}).encode(),
    expect="INPUT0",
)
_error(
    "BF16 to an FP32 model",
    "versioned",
    {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [4],
                "datatype": "BF16",
                "parameters": {"binary_data_size": 8},
            }
        ]
    },
    b"\0" * 8,
    expect="INPUT0",
)
_error(
    "raw request, two-input model",
    "simple",
    None,
    b"\0" * 64,
    expect="[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
    "deduced but got 2 inputs in",
    headers={"Inference-Header-Content-Length": "0"},
)
_error(
    "raw request, shape not deducible",
    "identity_fp32",
    None,
    FP32_4,
    expect="[request id: <id_unknown>] The shape of the raw input 'INPUT0' can not be deduced "
    "because there are more than one variable-sized dimension",
    headers={"Inference-Header-Content-Length": "0"},
)
_error(
    "raw request, ragged rows",
    "versioned",
    None,
    FP32_4[:6],
    expect="INPUT0",
    headers={"Inference-Header-Content-Length": "0"},
)
_error(
    "raw request, BYTES model of variable shape",
    "string_upper",
    None,
    b"raw",
    expect="[request id: <id_unknown>] For BYTE datatype raw input 'INPUT0', the model must "
    "have input shape [1]",
    headers={"Inference-Header-Content-Length": "0"},
)


@pytest.mark.parametrize("case", list(ERRORS))
def test_binary_errors_are_400_naming_the_input(server: ServerProcess, case: str) -> None:
    model, body, headers, expect = ERRORS[case]
    status, got, answer = request(server, f"/v2/models/{model}/infer", body, headers)
    assert status == 400, (case, status, answer)
    assert got["content-type"].startswith("application/json")
    message = json.loads(answer)["error"]
    assert expect in message, message
    assert_still_serving(server)


@pytest.mark.parametrize(
    "value",
    # (5,000 digits: more than int() parses, once a 500)
    ["abc", "-1", "1.5", "", "\u00b2", "999", "99999999999999999999", "9" * 5000],
)
def test_bad_header_length(server: ServerProcess, value: str) -> None:
    body, _ = binary_body({"inputs": [fp32_input(binary_data_size=16)]}, FP32_4)
    status, _, answer = request(
        server, "/v2/models/versioned/infer", body, {"Inference-Header-Content-Length": value}
    )
    assert status == 400, answer
    assert "Inference-Header-Content-Length" in json.loads(answer)["error"]
    assert_still_serving(server)


def test_size_limit_answers_413_before_reading() -> None:
    proc = ServerProcess(args=["--max-request-bytes", "1048576"]).wait_ready()
    try:
        big = np.zeros(300_000, dtype=np.float32)
        body, headers = binary_body(
            {"inputs": [{**fp32_input(binary_data_size=big.nbytes), "shape": [big.size]}]},
            big.tobytes(),
        )
        conn = http.client.HTTPConnection(proc.host_port, timeout=10)
        # Only the headers go out: a 413 that arrives now was decided before the body.
        conn.putrequest("POST", "/v2/models/versioned/infer")
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(key, value)
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 413
        assert "1048576" in json.loads(resp.read())["error"]
        conn.close()
        # A client that sends the whole body still reads the 413, and the
        # connection stays usable: uvicorn drops the unread body as it arrives.
        conn = http.client.HTTPConnection(proc.host_port, timeout=10)
        conn.request("POST", "/v2/models/versioned/infer", body=body, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 413, resp.read()
        resp.read()
        small = np.ones(4, dtype=np.float32)
        ok_body, ok_headers = binary_body(
            {"inputs": [fp32_input(binary_data_size=16)]}, small.tobytes()
        )
        conn.request("POST", "/v2/models/versioned/infer", body=ok_body, headers=ok_headers)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert json.loads(resp.read())["outputs"][0]["data"] == [3.0] * 4  # version 2: +2
        conn.close()
        small = np.ones(1000, dtype=np.float32)
        body, headers = binary_body(
            {"inputs": [{**fp32_input(binary_data_size=small.nbytes), "shape": [small.size]}]},
            small.tobytes(),
        )
        status, _, answer = request(proc, "/v2/models/versioned/infer", body, headers)
        assert status == 200, answer
    finally:
        code = proc.stop()
    assert code == 0, proc.log


# ---- concurrency ------------------------------------------------------------------------


def test_24_concurrent_clients_random_sizes(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.host_port, concurrency=24, network_timeout=120)
    rng = np.random.default_rng(24)
    sent = []
    for index in range(96):
        rows, cols = int(rng.integers(1, 64)), int(rng.integers(1, 4096))
        data = rng.standard_normal((rows, cols)).astype(np.float32)
        tensor = httpclient.InferInput("INPUT0", [rows, cols], "FP32")
        binary_in = bool(index % 3)
        tensor.set_data_from_numpy(data, binary_data=binary_in)
        output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=bool(index % 2))
        sent.append(
            (
                data,
                client.async_infer(
                    "identity_fp32", [tensor], outputs=[output], request_id=str(index)
                ),
            )
        )
    for index, (data, pending) in enumerate(sent):
        result = pending.get_result()
        assert result.get_response()["id"] == str(index)
        assert np.array_equal(result.as_numpy("OUTPUT0"), data), index
    client.close()
    assert_still_serving(server)


# ---- copies -----------------------------------------------------------------------------


def _resource() -> ModelResource:
    """The infer route's resource over a data plane with no models and no workers."""

    async def made() -> ModelResource:
        pool = SimpleNamespace(prefix=f"oipserve-{os.getpid()}-binary-test-")
        _, settings = load_settings(["serve", "--model-repository", "."], {})
        return ModelResource(DataPlane(ModelRegistry(), pool, 1), settings)  # type: ignore[arg-type]

    return asyncio.run(made())


def test_binary_input_is_referenced_in_place_not_copied() -> None:
    """The front hands the worker the body's own segment: no second segment, same offset."""
    pool = BufferPool(f"oipserve-{os.getpid()}-binary-test-")
    try:
        data = np.arange(1024, dtype=np.float32)
        body, _ = binary_body(
            {"inputs": [fp32_input(binary_data_size=data.nbytes) | {"shape": [1024]}]},
            data.tobytes(),
        )
        header_length = len(body) - data.nbytes
        pad = (-header_length) % 64
        lease = pool.acquire(pad + len(body))
        lease.buf[pad : pad + len(body)] = body
        view = Body(lease.buf[pad : pad + len(body)], lease, pad)
        request_ = decode_request(view.data[:header_length])
        tensors = _resource()._inputs(request_.inputs, view, header_length)
        (tensor,) = tensors
        assert isinstance(tensor, InputTensor) and tensor.located is not None
        held, start, size = tensor.located
        assert held is lease and start == pad + header_length and size == data.nbytes
        assert start % 64 == 0  # aligned, so numpy and ONNX Runtime read it in place
        assert _payload(tensor) == (data.nbytes, None)  # nothing for the front to copy
        # the worker's view of those bytes is the segment itself, not a copy
        session = ModelSession(str(SAMPLE_FP32), 1, [("CPUExecutionProvider", {})])
        fed = session.feed("INPUT0", "FP32", [1024], held.buf[start : start + size])
        assert isinstance(fed, np.ndarray) and not fed.flags.owndata
        segment = np.frombuffer(held.buf, dtype=np.uint8)
        assert np.shares_memory(fed, segment)
        assert np.array_equal(fed, data)
    finally:
        pool.close()


def test_bf16_json_input_binary_output(server: ServerProcess) -> None:
    """tritonclient cannot send BF16 as JSON; the server rounds JSON numbers to bfloat16."""
    values = [1.0, 2.5, -3.0, 1e10]
    header = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "BF16", "data": values}],
        "parameters": {"binary_data_output": True},
    }
    body = json.dumps(header).encode()
    status, got, answer = request(server, "/v2/models/identity_bf16/infer", body)
    assert status == 200, answer
    meta, rest = split_response(got, answer)
    assert meta["outputs"][0]["parameters"] == {"binary_data_size": 8}
    expected = np.array(values, dtype=np.float32).astype(ml_dtypes.bfloat16)
    assert rest == expected.tobytes()


# ---- receiving large bodies straight from the socket ----------------------------------------


def _raw_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _read_response(stream: object) -> tuple[int, dict[str, str], bytes]:
    status = int(stream.readline().split()[1])  # type: ignore[attr-defined]
    headers = {}
    while (line := stream.readline().decode().strip()) != "":  # type: ignore[attr-defined]
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return status, headers, stream.read(int(headers["content-length"]))  # type: ignore[attr-defined]


def _identity_request(values: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, values.size],
                "datatype": "FP32",
                "parameters": {"binary_data_size": values.nbytes},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    return binary_body(header, values.tobytes())


def _assert_echoed(status: int, headers: dict[str, str], answer: bytes, values: np.ndarray) -> None:
    """An identity_fp32 answer (binary output) that carries ``values`` back."""
    assert status == 200, answer[:200]
    _, data = split_response(headers, answer)
    np.testing.assert_array_equal(np.frombuffer(data, dtype=np.float32), values)


def test_pipelined_large_bodies_are_each_answered(server: ServerProcess) -> None:
    # Both requests leave in one write: the first body is read past the HTTP parser,
    #   and exactly up to its end, so the second request must still parse.
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (300_000, 70_000, 5)]
    wire = b""
    for values in arrays:
        body, headers = _identity_request(values)
        wire += _raw_request("/v2/models/identity_fp32/infer", body, headers)
    host, port = server.host_port.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(wire)
        stream = sock.makefile("rb")
        for values in arrays:
            _assert_echoed(*_read_response(stream), values)


def test_large_body_over_chunked_transfer_encoding(server: ServerProcess) -> None:
    values = np.arange(200_000, dtype=np.float32)
    body, headers = _identity_request(values)
    chunks = b"".join(
        b"%x\r\n" % len(body[i : i + 50_000]) + body[i : i + 50_000] + b"\r\n"
        for i in range(0, len(body), 50_000)
    )
    head = [
        "POST /v2/models/identity_fp32/infer HTTP/1.1",
        "Host: test",
        "Transfer-Encoding: chunked",
    ] + [f"{k}: {v}" for k, v in headers.items()]
    host, port = server.host_port.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + chunks + b"0\r\n\r\n")
        status, headers_out, answer = _read_response(sock.makefile("rb"))
    _assert_echoed(status, headers_out, answer, values)


def test_client_leaving_mid_body_costs_nothing(server: ServerProcess) -> None:
    values = np.ones(1_000_000, dtype=np.float32)
    body, headers = _identity_request(values)
    wire = _raw_request("/v2/models/identity_fp32/infer", body, headers)
    host, port = server.host_port.split(":")
    for cut in (len(wire) - len(body) + 100_000, len(wire) - 1):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(wire[:cut])
            assert wait_for(partial(read_by_peer, sock), 10)  # mid-body at the server too
    # The server keeps serving, the same large bodies included.
    for _ in range(3):
        status, headers_out, answer = request(
            server, "/v2/models/identity_fp32/infer", body, headers
        )
        _assert_echoed(status, headers_out, answer, values)


def test_expect_100_continue_with_a_large_body(server: ServerProcess) -> None:
    values = np.arange(100_000, dtype=np.float32)
    body, headers = _identity_request(values)
    host, port = server.host_port.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = _raw_request("/v2/models/identity_fp32/infer", b"", {})
        head = head.replace(b"Content-Length: 0", b"Content-Length: %d" % len(body))
        extra = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Expect": "100-continue"}.items())
        sock.sendall(head[:-2] + extra.encode() + b"\r\n")
        stream = sock.makefile("rb")
        assert stream.readline().startswith(b"HTTP/1.1 100")
        assert stream.readline() == b"\r\n"
        sock.sendall(body)
        status, headers_out, answer = _read_response(stream)
    _assert_echoed(status, headers_out, answer, values)


def test_expect_100_continue_past_the_limit_is_a_413_and_a_close(server: ServerProcess) -> None:
    """The client waits for a 100 that never comes, and sends no body: the 413 closes the
    connection (RFC 9110, 10.1.1). It kept it open, and the next request on it was read as
    the refused body and never answered (found by fuzzing)."""
    host, port = server.host_port.split(":")
    head = (
        "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"
        f"Content-Length: {10**12}\r\nExpect: 100-continue\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        stream = sock.makefile("rb")
        status, headers_out, answer = _read_response(stream)
        assert status == 413 and b"exceeds the maximum" in answer, answer
        assert headers_out.get("connection") == "close", headers_out
        assert stream.read() == b""  # closed


def test_pipelined_requests_before_a_bad_one_are_answered_first(server: ServerProcess) -> None:
    """Two whole requests and a line the parser refuses, in one write: 200, 200, then the
    400 and the close. The 400 came at once, and the two were never answered (found by
    fuzzing)."""
    values = np.arange(4, dtype=np.float32)
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": values.tolist()}
            ]
        }
    ).encode()
    one = _raw_request("/v2/models/identity_fp32/infer", body, {})
    host, port = server.host_port.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(one + one + b"BAD\r\n\r\n")
        answers = read_responses(sock, 3)
    assert [status for status, _, _ in answers] == [200, 200, 400], answers
    assert json.loads(answers[1][2])["outputs"][0]["data"] == values.tolist()
    assert json.loads(answers[2][2]) == {"error": "Invalid HTTP request received."}
    # the one refused may be a request whose chunked body does not parse: it was queued,
    # then run, waiting for a body that never came (no 400, a reset at --body-timeout)
    chunked = b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"
    chunked += b"Transfer-Encoding: chunked\r\n\r\nZZ\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(one + chunked)
        answers = read_responses(sock, 2)
        assert [status for status, _, _ in answers] == [200, 400], answers
        assert sock.recv(1) == b""  # and closed
