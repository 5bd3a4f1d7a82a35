"""One refused inference request sent over REST (JSON) and over gRPC (ModelInfer), for the
tests of what a request is refused for: the message of each, both checked to be a 400 /
INVALID_ARGUMENT."""

from __future__ import annotations

import http.client
import json
from collections.abc import Sequence

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.raw_http import post_json
from tests.support.server import ServerProcess

#: Where a gRPC tensor's values go, by datatype (the ones these tests send).
CONTENTS = {
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "BYTES": "bytes_contents",
}


def tensor(name: str, datatype: str, shape: list[int], data: list[object]) -> dict[str, object]:
    """An input as a JSON request gives it (``data`` flat)."""
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def refusals(
    server: ServerProcess,
    model: str,
    inputs: Sequence[dict[str, object]],
    outputs: Sequence[str] = (),
    request_id: str | None = None,
) -> tuple[str, str]:
    """The messages refusing one request over REST and over gRPC (AssertionError unless
    both are a 400 / INVALID_ARGUMENT); ``request_id``: the request's ``id``."""
    body: dict[str, object] = {"inputs": list(inputs)}
    if outputs:
        body["outputs"] = [{"name": name} for name in outputs]
    if request_id is not None:
        body["id"] = request_id
    status, answer = post_json(server, model, json.dumps(body).encode())
    assert status == 400, answer
    message = service_pb2.ModelInferRequest(model_name=model, id=request_id or "")
    for given in inputs:
        added = message.inputs.add(
            name=given["name"], datatype=given["datatype"], shape=given["shape"]
        )
        values = list(given["data"])  # type: ignore[call-overload]
        if given["datatype"] == "BYTES":
            values = [str(value).encode() for value in values]
        getattr(added.contents, CONTENTS[str(given["datatype"])]).extend(values)
    for name in outputs:
        message.outputs.add(name=name)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(message, timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
            return str(answer["error"]), str(exc.details())
    raise AssertionError(f"gRPC served the request REST refused: {answer}")


def binary_refusal(
    server: ServerProcess, model: str, inputs: Sequence[dict[str, object]], blob: bytes
) -> str:
    """The message refusing one binary-extension REST request (``inputs``' JSON header,
    then ``blob``), checked to be a 400."""
    header = json.dumps({"inputs": list(inputs)}).encode()
    conn = http.client.HTTPConnection(server.host_port, timeout=30)
    try:
        conn.request(
            "POST",
            f"/v2/models/{model}/infer",
            header + blob,
            {"Inference-Header-Content-Length": str(len(header))},
        )
        response = conn.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        conn.close()
    assert status == 400, answer
    return str(answer["error"])
