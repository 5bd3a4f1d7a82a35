"""Raw binary requests (``Inference-Header-Content-Length: 0``) to BYTES models, as Triton.

Triton's ``test_byte`` (qa/L0_http/http_test.py) posts the text "427" with that header to a
batching model whose one BYTES input has dims [1] and reads "427" back after the output's
4-byte length. Triton takes the whole body as the one element (it prepends the length),
puts a batch of 1 in front when ``max_batch_size > 0`` and refuses a model whose dims do
not hold exactly one element ("For BYTE datatype raw input ..., the model must have input
shape [1]", its ``test_byte_too_many_elements``). One server over identity models made from
the sample ``identity_bytes`` graph (dims [batch, n]) with configs of each kind.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.http import request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

RAW = {"Inference-Header-Content-Length": "0"}
TRITON_WORDS = "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"
#: model -> (max_batch_size, dims, more config)
CONFIGS = {
    "bytes_batched": (8, "[ 1 ]", ""),
    "bytes_dynamic": (8, "[ 1 ]", "dynamic_batching { max_queue_delay_microseconds: 20000 }"),
    "bytes_unbatched": (0, "[ 1, 1 ]", ""),
    "bytes_variable": (8, "[ -1 ]", ""),
    "bytes_two": (0, "[ 1, 2 ]", ""),
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    graph = SAMPLE_REPOSITORY / "identity_bytes" / "1" / "model.onnx"
    for name, (batch, dims, more) in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        shutil.copy(graph, root / name / "1" / "model.onnx")
        tensor = '{ name: "%s" data_type: TYPE_STRING dims: %s }'
        # NOTE: the output's dims are the graph's ([batch, n]) exactly, as Triton's
        #   backend requires of an output; the input's dims are what the test is about.
        variable = "[ " + ", ".join(["-1"] * (dims.count(",") + 1)) + " ]"
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {batch}\n'
            f"input [ {tensor % ('INPUT0', dims)} ]\noutput [ {tensor % ('OUTPUT0', variable)} ]\n"
            f"{more}\n"
        )
    proc = ServerProcess(root, ["--devices", "cpu"]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def raw_infer(srv: ServerProcess, model: str, body: bytes) -> tuple[int, dict, bytes]:
    """(status, the JSON header of the answer, its binary part)."""
    status, headers, answer = request(srv, "POST", f"/v2/models/{model}/infer", body, RAW)
    if status != 200:
        return status, json.loads(answer), b""
    size = int(headers["inference-header-content-length"])
    return status, json.loads(answer[:size]), answer[size:]


@pytest.mark.parametrize("model", ["bytes_batched", "bytes_dynamic", "bytes_unbatched"])
def test_the_body_is_the_one_element(srv: ServerProcess, model: str) -> None:
    # Triton's test_byte: the text comes back after the output's 4-byte length.
    status, header, data = raw_infer(srv, model, b"427")
    assert status == 200, header
    assert data == struct.pack("<I", 3) + b"427"
    (output,) = header["outputs"]
    assert output["shape"] == [1, 1] and output["datatype"] == "BYTES"


@pytest.mark.parametrize("body", [b"", b"\x05\0\0\0ab", "ünïcødé \n\0".encode() * 8000])
def test_any_bytes_are_one_element(srv: ServerProcess, body: bytes) -> None:
    # Empty, what looks like a length prefix, 112 KB of UTF-8 (ORT's strings need it).
    status, header, data = raw_infer(srv, "bytes_batched", body)
    assert status == 200, header
    assert data == struct.pack("<I", len(body)) + body


def test_concurrent_raw_requests_batch_and_each_gets_its_own(srv: ServerProcess) -> None:
    bodies = [f"request {i}".encode() * (i + 1) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: raw_infer(srv, "bytes_dynamic", b), bodies))
    for body, (status, header, data) in zip(bodies, answers, strict=True):
        assert status == 200, header
        assert data == struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("model", ["bytes_variable", "bytes_two"])
def test_dims_not_holding_one_element_are_refused(srv: ServerProcess, model: str) -> None:
    # Triton's test_byte_too_many_elements.
    status, answer, _ = raw_infer(srv, model, b"427")
    assert status == 400, answer
    assert TRITON_WORDS in answer["error"], answer
    assert raw_infer(srv, "bytes_batched", b"still serving")[0] == 200
