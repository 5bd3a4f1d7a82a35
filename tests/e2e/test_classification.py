"""Triton's classification extension over a real server, with tritonclient HTTP and gRPC."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

LABELS = "zero\none\ntwo\n"  # no label for index 3
ROWS = np.array([[0.5, 3.25, 2.0, -1.0], [9.0, 1.0, 1.0, 8.0]], dtype=np.float32)
#: OUTPUT0 = INPUT0 + 1, top 2 of each row, labels where the index has one.
ROWS_TOP2 = [["4.250000:1:one", "3.000000:2:two"], ["10.000000:0:zero", "9.000000:3"]]
FLAT = np.array([[1.5, -2.0, 7.25], [0.0, 3.0, -9.5]], dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repository")
    model = root / "classes"
    shutil.copytree(SAMPLE_REPOSITORY / "batched", model)
    config = (model / "config.pbtxt").read_text().replace('name: "batched"', 'name: "classes"')
    config = config.replace(
        '{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }',
        '{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" }',
    )
    assert "labels.txt" in config
    (model / "config.pbtxt").write_text(config)
    (model / "labels.txt").write_text(LABELS)
    escaping = root / "escaping"
    shutil.copytree(model, escaping)
    (escaping / "config.pbtxt").write_text(
        config.replace('name: "classes"', "").replace("labels.txt", "../classes/labels.txt")
    )
    for name in ("identity_fp32", "identity_int32", "identity_fp16", "identity_bytes"):
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
    proc = ServerProcess(root, ["--allow-client-shm", "true"]).wait_ready()
    yield proc
    assert proc.stop() == 0


def _texts(array: np.ndarray) -> list:
    return [
        _texts(item) if isinstance(item, np.ndarray) else _text(item)
        for item in (array if array.ndim > 1 else array)
    ]


def _text(item: object) -> str:
    return item.decode() if isinstance(item, bytes) else str(item)


def _http_infer(
    http: httpclient.InferenceServerClient,
    model: str,
    values: np.ndarray,
    count: object,
    binary: bool = False,
    datatype: str = "FP32",
) -> httpclient.InferResult:
    given = httpclient.InferInput("INPUT0", list(values.shape), datatype)
    given.set_data_from_numpy(values, binary_data=False)
    inputs = [given]
    if model == "classes":
        text = httpclient.InferInput("TEXT", [len(values), 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"a"]] * len(values), dtype=np.object_))
        inputs.append(text)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=count)
    return http.infer(model, inputs, outputs=[wanted])


def _grpc_infer(
    client: grpcclient.InferenceServerClient, model: str, values: np.ndarray, count: int
) -> grpcclient.InferResult:
    given = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    given.set_data_from_numpy(values)
    inputs = [given]
    if model == "classes":
        text = grpcclient.InferInput("TEXT", [len(values), 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"a"]] * len(values), dtype=np.object_))
        inputs.append(text)
    wanted = grpcclient.InferRequestedOutput("OUTPUT0", class_count=count)
    return client.infer(model, inputs, outputs=[wanted])


@pytest.mark.parametrize("binary", [False, True])
def test_batched_model_with_labels_over_http(
    http: httpclient.InferenceServerClient, binary: bool
) -> None:
    result = _http_infer(http, "classes", ROWS, 2, binary)
    output = result.get_output("OUTPUT0")
    assert (output["datatype"], output["shape"]) == ("BYTES", [2, 2])
    assert ("binary_data_size" in output.get("parameters", {})) is binary
    assert _texts(result.as_numpy("OUTPUT0")) == ROWS_TOP2


def test_batched_model_with_labels_over_grpc(grpc_client: grpcclient.InferenceServerClient) -> None:
    result = _grpc_infer(grpc_client, "classes", ROWS, 2)
    output = result.get_output("OUTPUT0")
    assert (output.datatype, list(output.shape)) == ("BYTES", [2, 2])
    assert _texts(result.as_numpy("OUTPUT0")) == ROWS_TOP2


def test_k_larger_than_a_batch_item(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    everything = [
        ["4.250000:1:one", "3.000000:2:two", "1.500000:0:zero", "0.000000:3"],
        ["10.000000:0:zero", "9.000000:3", "2.000000:1:one", "2.000000:2:two"],
    ]
    result = _http_infer(http, "classes", ROWS, 1000)
    assert result.get_output("OUTPUT0")["shape"] == [2, 4]
    assert _texts(result.as_numpy("OUTPUT0")) == everything
    assert _texts(_grpc_infer(grpc_client, "classes", ROWS, 1000).as_numpy("OUTPUT0")) == everything


def test_non_batched_model_takes_the_whole_tensor(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    top3 = ["7.250000:2", "3.000000:4", "1.500000:0"]
    result = _http_infer(http, "identity_fp32", FLAT, 3)
    assert result.get_output("OUTPUT0")["shape"] == [3]
    assert _texts(result.as_numpy("OUTPUT0")) == top3
    result = _grpc_infer(grpc_client, "identity_fp32", FLAT, 3)
    assert list(result.get_output("OUTPUT0").shape) == [3]
    assert _texts(result.as_numpy("OUTPUT0")) == top3
    whole = _http_infer(http, "identity_fp32", FLAT, 50, binary=True)
    assert whole.get_output("OUTPUT0")["shape"] == [6]
    assert _texts(whole.as_numpy("OUTPUT0"))[-1] == "-9.500000:5"


def test_integers_print_plain_and_zero_means_not_asked(
    http: httpclient.InferenceServerClient,
) -> None:
    values = np.array([[3, -4, 10]], dtype=np.int32)
    result = _http_infer(http, "identity_int32", values, 2, datatype="INT32")
    assert _texts(result.as_numpy("OUTPUT0")) == ["10:2", "3:0"]
    given = httpclient.InferInput("INPUT0", [1, 3], "INT32")
    given.set_data_from_numpy(values, binary_data=False)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    wanted._parameters["classification"] = 0
    plain = http.infer("identity_int32", [given], outputs=[wanted])
    assert plain.get_output("OUTPUT0")["datatype"] == "INT32"
    np.testing.assert_array_equal(plain.as_numpy("OUTPUT0"), values)


@pytest.mark.parametrize(
    ("model", "values", "datatype", "words"),
    [
        ("identity_fp16", np.ones((1, 2), np.float16), "FP16", "datatype FP16"),
        ("identity_fp32", FLAT, "FP32", "must be a non-negative integer, got -1"),
        ("identity_fp32", FLAT, "FP32", "must be a non-negative integer, got 1.5"),
        ("identity_fp32", FLAT, "FP32", "must be a non-negative integer, got '2'"),
    ],
)
def test_refusals_over_http(
    http: httpclient.InferenceServerClient,
    model: str,
    values: np.ndarray,
    datatype: str,
    words: str,
) -> None:
    count = {"got -1": -1, "got 1.5": 1.5, "got '2'": "2"}.get(words.split(", ")[-1], 2)
    with pytest.raises(InferenceServerException, match=words) as info:
        _http_infer(http, model, values, count, datatype=datatype)
    assert info.value.status() == "400"


def test_bytes_output_is_refused(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    given = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
    given.set_data_from_numpy(np.array([[b"x"]], dtype=np.object_))
    wanted = grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)
    with pytest.raises(InferenceServerException, match="datatype BYTES") as info:
        grpc_client.infer("identity_bytes", [given], outputs=[wanted])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_grpc_refuses_counts_that_are_not_a_positive_int64(server: ServerProcess) -> None:
    channel = grpc.insecure_channel(server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    for setting in ("string_param", "int64_param"):
        request.ClearField("outputs")
        output = request.outputs.add(name="OUTPUT0")
        if setting == "string_param":
            output.parameters["classification"].string_param = "2"
        else:
            output.parameters["classification"].int64_param = 0
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "positive int64_param" in info.value.details()
    channel.close()


def test_output_in_shared_memory_is_refused(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    handle = shm.create_shared_memory_region("classes_out", "/classes_out", 64)
    http.register_system_shared_memory("classes_out", "/classes_out", 64)
    try:
        given = httpclient.InferInput("INPUT0", [2, 3], "FP32")
        given.set_data_from_numpy(FLAT, binary_data=False)
        wanted = httpclient.InferRequestedOutput("OUTPUT0")
        wanted.set_shared_memory("classes_out", 24)
        # NOTE: tritonclient refuses both on one output: a client that does not check.
        wanted._parameters["classification"] = 2
        with pytest.raises(InferenceServerException, match="both in shared memory") as info:
            http.infer("identity_fp32", [given], outputs=[wanted])
        assert info.value.status() == "400"
        given_grpc = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
        given_grpc.set_data_from_numpy(FLAT)
        wanted_grpc = grpcclient.InferRequestedOutput("OUTPUT0")
        wanted_grpc.set_shared_memory("classes_out", 24)
        wanted_grpc._output.parameters["classification"].int64_param = 2
        with pytest.raises(InferenceServerException, match="both in shared memory") as info:
            grpc_client.infer("identity_fp32", [given_grpc], outputs=[wanted_grpc])
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        http.unregister_system_shared_memory("classes_out")
        shm.destroy_shared_memory_region(handle)


def test_label_file_outside_the_model_directory_is_refused(
    http: httpclient.InferenceServerClient,
) -> None:
    index = {entry["name"]: entry for entry in http.get_model_repository_index()}
    assert index["escaping"]["state"] == "UNAVAILABLE"
    assert (
        "label_filename '../classes/labels.txt' must name a file inside"
        in (index["escaping"]["reason"])
    )
    assert index["classes"]["state"] == "READY"


def test_a_large_output_is_classified_in_a_thread_with_the_same_answer(
    http: httpclient.InferenceServerClient,
) -> None:
    """Past CLASSIFY_ON_LOOP_MAX elements the sort runs off the event loop: same strings."""
    values = np.random.default_rng(5).random((1, 200_000), dtype=np.float32)
    given = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    given.set_data_from_numpy(values, binary_data=True)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True, class_count=3)
    result = http.infer("identity_fp32", [given], outputs=[wanted])
    flat = values.ravel()
    best = np.argsort(flat)[::-1][:3]
    assert _texts(result.as_numpy("OUTPUT0")) == [f"{flat[i]:f}:{i}" for i in best]


def test_more_classes_than_the_bound_are_refused(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException, match="at most 65536 may be asked") as info:
        _http_infer(http, "identity_fp32", FLAT, 65537)
    assert info.value.status() == "400"
    with pytest.raises(InferenceServerException, match="at most 65536 may be asked") as info:
        _grpc_infer(grpc_client, "identity_fp32", FLAT, 65537)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
