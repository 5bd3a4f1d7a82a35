"""What Triton's Python example clients (triton-inference-server/client, src/python/examples)
check against the server, beyond the numbers: the models they call by name and the error
messages they match (docs/protocol.md, "Triton's example clients")."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess

UNKNOWN = "Request for unknown model: 'wrong_model_name' is not found"
BAD_VERSION = "failed to get model version from specified version string 'wrong_specification'"


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _message(call: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()  # type: ignore[operator]
    return info.value


def _simple_inputs(module: object, datatype: str = "INT32") -> list:
    dtype = np.int8 if datatype == "INT8" else np.int32
    values = [np.arange(16, dtype=dtype).reshape(1, 16), np.ones((1, 16), dtype=dtype)]
    inputs = []
    for name, value in zip(("INPUT0", "INPUT1"), values, strict=True):
        tensor = module.InferInput(name, [1, 16], datatype)  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def test_unknown_model_is_named_as_triton_does(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """simple_http_infer_client.py checks startswith("Request for unknown model"), the
    health_metadata examples check that it is in the message."""
    calls = [
        lambda: http.infer("wrong_model_name", _simple_inputs(httpclient)),
        lambda: http.get_model_metadata("wrong_model_name"),
        lambda: (
            http.is_model_ready("wrong_model_name") or http.get_model_config("wrong_model_name")
        ),
        lambda: http.get_inference_statistics("wrong_model_name"),
        lambda: grpc_client.infer("wrong_model_name", _simple_inputs(grpcclient)),
        lambda: grpc_client.get_model_metadata("wrong_model_name"),
        lambda: grpc_client.get_inference_statistics("wrong_model_name"),
    ]
    for call in calls:
        error = _message(call)
        assert error.message() == UNKNOWN
        assert error.status() in ("404", str(grpc.StatusCode.NOT_FOUND))


def test_version_that_is_not_a_number_is_invalid(
    http: httpclient.InferenceServerClient, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    """grpc_explicit_int8_content_client.py matches Triton's message for a bad version."""
    request = service_pb2.ModelInferRequest(
        model_name="simple", model_version="wrong_specification"
    )
    for name, value in (("INPUT0", range(16)), ("INPUT1", [1] * 16)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(value)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(BAD_VERSION)
    error = _message(
        lambda: http.infer(
            "simple", _simple_inputs(httpclient), model_version="wrong_specification"
        )
    )
    assert error.status() == "400" and error.message().startswith(BAD_VERSION)
    error = _message(lambda: http.get_model_metadata("simple", "wrong_specification"))
    assert error.status() == "400" and error.message().startswith(BAD_VERSION)


def test_contents_with_raw_names_input_and_model(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """grpc_explicit_int_content_client.py matches Triton's whole message."""
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(range(16))
    request.raw_input_contents.append(np.arange(8).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "contents field must not be specified when using raw_input_contents "
        "for 'INPUT0' for model 'simple'"
    )


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_simple_int8(
    module: object,
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    client = http if module is httpclient else grpc_client
    result = client.infer("simple_int8", _simple_inputs(module, "INT8"))
    assert result.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]
    assert result.as_numpy("OUTPUT1").tolist() == [list(range(-1, 15))]
    assert result.as_numpy("OUTPUT0").dtype == np.int8


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_simple_string_and_identity(
    module: object,
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """The calls of Triton's simple_{http,grpc}_string_infer_client.py."""
    client = http if module is httpclient else grpc_client
    inputs = []
    for name, values in (("INPUT0", range(16)), ("INPUT1", [1] * 16)):
        tensor = module.InferInput(name, [1, 16], "BYTES")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(np.array([[str(v).encode() for v in values]], dtype=object))
        inputs.append(tensor)
    result = client.infer("simple_string", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == [[str(i + 1).encode() for i in range(16)]]
    assert result.as_numpy("OUTPUT1").tolist() == [[str(i - 1).encode() for i in range(16)]]
    for values in ([b"he\x00llo"] * 16, [b"\x00\x01\x02\x03"] * 16):
        data = np.array([values], dtype=object)
        tensor = module.InferInput("INPUT0", [1, 16], "BYTES")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(data)
        echoed = client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0")
        assert echoed.tolist() == data.tolist()
