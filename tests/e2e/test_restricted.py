"""Restricted APIs over real HTTP and gRPC (--http-restricted-api, --grpc-restricted-protocol).

Two servers. ``each`` restricts every API group, each behind its own header and
value, so a group is shown to open with its own header only (the others' do not
count). ``fenced`` is docs/security.md's recipe: the control plane behind one
admin header, everything else open without any.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from oipserve.config.access import API_GROUPS
from tests.support.cli import run_cli
from tests.support.grpc_health import health_check_on
from tests.support.http import request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

ADMIN = "s3cr3t:v=="


def _header(api: str) -> str:
    return f"x-{api}-key"


def _value(api: str) -> str:
    return f"{api}=value"


@pytest.fixture(scope="module")
def each() -> Iterator[ServerProcess]:
    # NOTE: --allow-client-shm: with it off, unregister answers 403 itself (Triton's rule).
    args = ["--devices", "cpu", "--model-control-mode", "explicit", "--load-model", "simple"]
    args += ["--allow-client-shm", "true"]
    for api in API_GROUPS:
        args += ["--http-restricted-api", f"{api}:{_header(api)}={_value(api)}"]
        args += ["--grpc-restricted-protocol", f"{api}:{api}-key={_value(api)}"]
    proc = ServerProcess(SAMPLE_REPOSITORY, args).wait_ready()
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def fenced() -> Iterator[ServerProcess]:
    args = [
        "--devices",
        "cpu",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "simple",
        "--http-restricted-api",
        f"model-repository,workers,hardware:X-Admin-Key={ADMIN}",
        "--grpc-restricted-protocol",
        f"model-repository:admin-key={ADMIN}",
        "--allow-client-shm",  # with it off, unregister answers 403 itself (Triton's rule)
        "true",
    ]
    proc = ServerProcess(SAMPLE_REPOSITORY, args).wait_ready()
    yield proc
    assert proc.stop() == 0


def _infer_body() -> str:
    data = list(range(16))
    inputs = [
        {"name": name, "datatype": "INT32", "shape": [1, 16], "data": data}
        for name in ("INPUT0", "INPUT1")
    ]
    return json.dumps({"inputs": inputs})


#: API group -> REST requests of that group, each with the status it gets when allowed.
HTTP_CALLS: dict[str, list[tuple[str, str, str | None, int]]] = {
    "health": [
        ("GET", "/v2/health/live", None, 200),
        ("GET", "/v2/health/ready", None, 200),
        ("GET", "/v2/models/simple/ready", None, 200),
        ("GET", "/v2/models/simple/versions/1/ready", None, 200),
    ],
    "metadata": [
        ("GET", "/v2", None, 200),
        ("GET", "/v2/models/simple", None, 200),
        ("GET", "/v2/models", None, 200),
    ],
    "inference": [
        ("POST", "/v2/models/simple/infer", _infer_body(), 200),
        ("POST", "/v2/models/simple/versions/1/infer", _infer_body(), 200),
    ],
    "model-config": [("GET", "/v2/models/simple/config", None, 200)],
    "statistics": [
        ("GET", "/v2/models/stats", None, 200),
        ("GET", "/v2/models/simple/stats", None, 200),
    ],
    "model-repository": [
        ("POST", "/v2/repository/index", None, 200),
        ("POST", "/v2/repository/models/nonexistent/unload", None, 200),
        ("POST", "/v2/models/nonexistent/unload", None, 200),
        ("POST", "/v2/repository/models/nonexistent/load", None, 400),
    ],
    "hardware": [("GET", "/v2/hardware", None, 200)],
    "workers": [("POST", "/v2/workers/nonexistent/unload", None, 200)],
    "shared-memory": [
        ("GET", "/v2/systemsharedmemory/status", None, 200),
        ("POST", "/v2/systemsharedmemory/unregister", None, 200),
        ("GET", "/v2/cudasharedmemory/status", None, 200),
        ("POST", "/v2/cudasharedmemory/region/r/register", "{}", 400),
    ],
}


@pytest.mark.parametrize("api", sorted(HTTP_CALLS))
def test_http_group_opens_with_its_own_header_only(each: ServerProcess, api: str) -> None:
    others = {_header(a): _value(a) for a in API_GROUPS if a != api}
    for method, path, body, allowed in HTTP_CALLS[api]:
        for headers in ({}, others, {_header(api): "wrong"}):
            status, _, answer = request(each, method, path, body, headers)
            assert status == 403, (path, headers, answer)
            message = json.loads(answer)["error"]
            assert message == f"This API is restricted, expecting header '{_header(api)}' ({api})"
        status, _, answer = request(each, method, path, body, {_header(api): _value(api)})
        assert status == allowed, (path, answer)


def test_tritonclient_http_sends_the_header(each: ServerProcess) -> None:
    # NOTE: closed by the with: `caught` holds this frame in a cycle, and a client left to
    #   the collector may be closed in another thread, where tritonclient fails (gevent).
    with httpclient.InferenceServerClient(each.host_port) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata("simple")
        assert caught.value.status() == "403"
        assert _value("metadata") not in str(caught.value)
        metadata = client.get_model_metadata(
            "simple", headers={_header("metadata"): _value("metadata")}
        )
        assert metadata["name"] == "simple"
        inputs = _http_inputs()
        with pytest.raises(InferenceServerException, match="restricted"):
            client.infer("simple", inputs)
        result = client.infer("simple", inputs, headers={_header("inference"): _value("inference")})
        assert (result.as_numpy("OUTPUT0") == 2 * np.arange(16)).all()


def test_refused_binary_upload_leaves_the_connection_usable(each: ServerProcess) -> None:
    """The 403 comes before the body is read; the next request on the connection still works."""
    header = b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],'
    header += b'"parameters":{"binary_data_size":64}}]}'
    body = header + bytes(64) + bytes(1 << 20)
    conn = http.client.HTTPConnection(each.host_port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v2/models/simple/infer",
            body=body,
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        response = conn.getresponse()
        assert response.status == 403
        response.read()
        conn.request("GET", "/v2/health/live", headers={_header("health"): _value("health")})
        response = conn.getresponse()
        assert (response.status, json.loads(response.read())) == (200, {"live": True})
    finally:
        conn.close()


def _http_inputs() -> list[httpclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    return inputs


def _grpc_inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    return inputs


GrpcCall = Callable[[grpcclient.InferenceServerClient, dict[str, str]], object]

#: API group -> gRPC calls of that group, each with the status it gets when allowed.
GRPC_CALLS: dict[str, list[tuple[GrpcCall, str | None]]] = {
    "health": [
        (lambda c, h: c.is_server_live(headers=h), None),
        (lambda c, h: c.is_server_ready(headers=h), None),
        (lambda c, h: c.is_model_ready("simple", headers=h), None),
        (lambda c, h: _health_check(c, h), None),
    ],
    "metadata": [
        (lambda c, h: c.get_server_metadata(headers=h), None),
        (lambda c, h: c.get_model_metadata("simple", headers=h), None),
    ],
    "inference": [(lambda c, h: c.infer("simple", _grpc_inputs(), headers=h), None)],
    "model-config": [(lambda c, h: c.get_model_config("simple", headers=h), None)],
    "statistics": [(lambda c, h: c.get_inference_statistics(headers=h), None)],
    "model-repository": [
        (lambda c, h: c.get_model_repository_index(headers=h), None),
        (lambda c, h: c.unload_model("nonexistent", headers=h), None),
    ],
    # CUDA shared memory: the restriction is checked first, then registering answers 400 (no GPU).
    "shared-memory": [
        (lambda c, h: c.get_system_shared_memory_status(headers=h), None),
        (lambda c, h: c.get_cuda_shared_memory_status(headers=h), None),
        (
            lambda c, h: c.register_cuda_shared_memory("r", b"0" * 64, 0, 64, headers=h),
            "StatusCode.INVALID_ARGUMENT",
        ),
    ],
    # Not served: the restriction is checked first, then the RPC answers UNIMPLEMENTED.
    "trace": [(lambda c, h: c.get_trace_settings(headers=h), "StatusCode.UNIMPLEMENTED")],
    "logging": [(lambda c, h: c.get_log_settings(headers=h), "StatusCode.UNIMPLEMENTED")],
}


def _health_check(client: grpcclient.InferenceServerClient, headers: dict) -> None:
    """gRPC's standard health check, in the health group as in Triton."""
    try:
        health_check_on(client._channel, tuple(headers.items()))  # noqa: SLF001
    except grpc.RpcError as exc:
        raise InferenceServerException(exc.details(), status=str(exc.code())) from None


def _grpc_status(call: GrpcCall, client: grpcclient.InferenceServerClient, headers: dict) -> str:
    try:
        call(client, headers)
    except InferenceServerException as exc:
        return f"{exc.status()} {exc.message()}"
    return "OK"


@pytest.mark.parametrize("api", sorted(GRPC_CALLS))
def test_grpc_group_opens_with_its_own_key_only(each: ServerProcess, api: str) -> None:
    client = grpcclient.InferenceServerClient(each.grpc_url)
    key = f"triton-grpc-protocol-{api}-key"
    others = {f"triton-grpc-protocol-{a}-key": _value(a) for a in API_GROUPS if a != api}
    denied = f"StatusCode.PERMISSION_DENIED This protocol is restricted, expecting header '{key}'"
    try:
        for call, allowed in GRPC_CALLS[api]:
            for headers in ({}, others, {key: "wrong"}):
                assert _grpc_status(call, client, headers) == f"{denied} ({api})"
            outcome = _grpc_status(call, client, {key: _value(api)})
            assert outcome.split(" ")[0] == (allowed or "OK"), outcome
    finally:
        client.close()


def test_a_grpc_key_sent_twice_is_refused_in_either_order(each: ServerProcess) -> None:
    """As a REST header sent twice (found by fuzzing: gRPC judged the first value only, so
    the right key then a wrong one opened the call, a wrong one first did not)."""
    key = "triton-grpc-protocol-health-key"
    request = service_pb2.ServerLiveRequest()
    with grpc.insecure_channel(each.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for values in ((_value("health"), "wrong"), ("wrong", _value("health"))):
            with pytest.raises(grpc.RpcError) as caught:
                stub.ServerLive(request, metadata=[(key, value) for value in values])
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, values
        assert stub.ServerLive(request, metadata=[(key, _value("health"))]).live


def test_grpc_stream_is_refused_without_the_key(each: ServerProcess) -> None:
    key = "triton-grpc-protocol-inference-key"
    assert _stream_outcomes(each, {}) == ["StatusCode.PERMISSION_DENIED"]
    assert _stream_outcomes(each, {key: _value("inference")}) == ["OK"]


def _stream_outcomes(server: ServerProcess, headers: dict[str, str]) -> list[str]:
    """What the stream callback reports for one ModelStreamInfer request."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcomes: list[str] = []

    def callback(result: object, error: InferenceServerException | None) -> None:
        outcomes.append("OK" if error is None else str(error.status()))

    client.start_stream(callback, headers=headers)
    try:
        client.async_stream_infer("simple", _grpc_inputs())
    except InferenceServerException:
        pass  # a refusal may end the stream before the request is queued; the callback has it
    client.stop_stream()
    client.close()
    return outcomes


def test_fenced_control_plane_leaves_inference_open(fenced: ServerProcess) -> None:
    admin = {"X-Admin-Key": ADMIN}
    for method, path in (
        ("GET", "/v2/hardware"),
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/workers/nonexistent/unload"),
        ("POST", "/v2/models/nonexistent/unload"),
    ):
        status, _, body = request(fenced, method, path)
        assert status == 403, path
        assert ADMIN not in body.decode()
        assert request(fenced, method, path, headers=admin)[0] == 200, path
    for api, calls in HTTP_CALLS.items():
        if api not in ("model-repository", "workers", "hardware"):
            for method, path, body, allowed in calls:
                assert request(fenced, method, path, body)[0] == allowed, path
    client = grpcclient.InferenceServerClient(fenced.grpc_url)
    try:
        assert _grpc_status(lambda c, h: c.get_model_repository_index(headers=h), client, {}) == (
            "StatusCode.PERMISSION_DENIED This protocol is restricted, expecting header "
            "'triton-grpc-protocol-admin-key' (model-repository)"
        )
        index = client.get_model_repository_index(headers={"triton-grpc-protocol-admin-key": ADMIN})
        assert any(model.name == "simple" for model in index.models)
        result = client.infer("simple", _grpc_inputs())
        assert (result.as_numpy("OUTPUT1") == 0).all()
        assert client.is_server_ready() and client.get_model_config("simple")
    finally:
        client.close()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--http-restricted-api", "inference:x-key"], "is not of the form"),
        (
            ["--grpc-restricted-protocol", "everything:key=hunter2"],
            "unknown restricted api 'everything'",
        ),
        (
            [
                "--http-restricted-api",
                "health,inference:a=hunter2",
                "--http-restricted-api",
                "health:b=2",
            ],
            "api 'health' can not be specified in multiple config groups",
        ),
        (
            [
                "--grpc-restricted-protocol",
                "model-repository:a=1",
                "--grpc-restricted-protocol",
                "statistics,model-repository:a=1",
            ],
            "api 'model-repository' can not be specified in multiple config groups",
        ),
    ],
)
def test_bad_restriction_flags_exit_2(args: list[str], fragment: str) -> None:
    result = run_cli("serve", "--model-repository", str(SAMPLE_REPOSITORY), *args)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr
    assert "hunter2" not in result.stderr
