"""Ensembles (``platform: "ensemble"``) through a real server, with tritonclient HTTP and gRPC.

One server for the module, in explicit model-control mode with two workers: the ensembles
are loaded at start (their composing models with them, as Triton does), the bad ones by
each test, and the last test unloads a composing model under load.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
import uuid
from collections.abc import Iterator

import cv2
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from oipserve.request.json_offload import PARSE_MIN
from tests.support.ensemble_models import (
    ENSEMBLES,
    ensemble_config,
    mapped_output_prefixes,
    write_ensemble,
    write_repository,
)
from tests.support.http import request
from tests.support.metrics import scrape
from tests.support.refusals import refusals, tensor
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, wait_for

X = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)

_IN = [("X", "TYPE_FP32", "[ -1 ]")]
_OUT = [("Y", "TYPE_FP32", "[ -1 ]")]

#: Ensembles Triton refuses, and a piece of the message each load failure gives.
BAD = {
    "bad_unknown": (
        ensemble_config("bad_unknown", [("nope", {"IN": "X"}, {"OUT": "Y"})], _IN, _OUT),
        "depends on 'nope', which is not a model of the repository",
    ),
    "bad_cycle": (
        ensemble_config(
            "bad_cycle",
            [
                ("plus", {"A": "X", "B": "c"}, {"OUT": "a"}),
                ("add_one", {"IN": "a"}, {"OUT": "b"}),
                ("double", {"IN": "b"}, {"OUT": "c"}),
            ],
            _IN,
            [("b", "TYPE_FP32", "[ -1 ]")],
        ),
        "circular dependency in ensemble 'bad_cycle': step 0 (plus) -> step 1 (add_one) -> "
        "step 2 (double) -> step 0 (plus)",
    ),
    "bad_self": (
        ensemble_config("bad_self", [("bad_self", {"X": "X"}, {"Y": "Y"})], _IN, _OUT),
        "circular dependency between ensembles: bad_self -> ... -> bad_self -> bad_self",
    ),
    "bad_twice": (
        ensemble_config(
            "bad_twice",
            [("add_one", {"IN": "X"}, {"OUT": "Y"}), ("double", {"IN": "X"}, {"OUT": "Y"})],
            _IN,
            _OUT,
        ),
        "ensemble tensor 'Y' is written by step 0 (model 'add_one') and by step 1 (model "
        "'double'): a tensor is mapped twice",
    ),
    "bad_dtype": (
        ensemble_config(
            "bad_dtype",
            [("add_one", {"IN": "X"}, {"OUT": "Y"})],
            [("X", "TYPE_INT32", "[ -1 ]")],
            _OUT,
        ),
        "ensemble tensor X: inconsistent data type: TYPE_INT32 is inferred from model bad_dtype "
        "while TYPE_FP32 is inferred from model add_one",
    ),
    "bad_shape": (
        ensemble_config(
            "bad_shape",
            [("add_one", {"IN": "X"}, {"OUT": "Y"})],
            [("X", "TYPE_FP32", "[ 3, 2 ]")],
            _OUT,
        ),
        "ensemble tensor X: inconsistent shape: [-1, 3, 2] is inferred from model bad_shape "
        "while [-1, -1] is inferred from model add_one",
    ),
    "bad_batch": (
        ensemble_config(
            "bad_batch", [("add_one", {"IN": "X"}, {"OUT": "Y"})], _IN, _OUT, max_batch_size=16
        ),
        "ensemble bad_batch allows maximum batch size 16, but it contains model add_one which "
        "only allows maximum batch size to be 8",
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_repository(tmp_path_factory.mktemp("ensembles"), slow_nodes=3000)
    for name, (config, _) in BAD.items():
        write_ensemble(root, name, config)
    args = ["--model-control-mode", "explicit", "--instances-per-device", "2"]
    args += ["--allow-client-shm", "true"]
    for name in ENSEMBLES:
        args += ["--load-model", name]
    proc = ServerProcess(root, args).wait_ready()
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.host_port, concurrency=4)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _http_x(values: np.ndarray = X, binary: bool = True) -> list[httpclient.InferInput]:
    given = httpclient.InferInput("X", list(values.shape), "FP32")
    given.set_data_from_numpy(values, binary_data=binary)
    return [given]


def _grpc_x(values: np.ndarray = X) -> list[grpcclient.InferInput]:
    given = grpcclient.InferInput("X", list(values.shape), "FP32")
    given.set_data_from_numpy(values)
    return [given]


def test_the_composing_models_load_with_the_ensembles(http: httpclient.InferenceServerClient):
    for name in ("add_one", "double", "plus", "pixel_mean", "slow_add_one"):
        assert http.is_model_ready(name), name
    metadata = http.get_model_metadata("chain")
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, -1]}]
    config = http.get_model_config("diamond")
    # an ensemble's own platform, and no instances (it read onnxruntime_onnx, with one)
    assert (config["platform"], config["backend"], config["instance_group"]) == ("ensemble", "", [])
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
        "plus",
        "add_one",
        "double",
    ]


def test_a_linear_chain_over_http_and_grpc(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    expected = (X + 1) * 2
    np.testing.assert_array_equal(http.infer("chain", _http_x()).as_numpy("Y"), expected)
    np.testing.assert_array_equal(grpc.infer("chain", _grpc_x()).as_numpy("Y"), expected)
    wanted = [httpclient.InferRequestedOutput("Y", binary_data=False)]
    as_json = http.infer("chain", _http_x(binary=False), outputs=wanted).as_numpy("Y")
    np.testing.assert_array_equal(as_json, expected)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for k in range(3):
            grpc.async_stream_infer("chain", _grpc_x(X + k), request_id=str(k))
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None, error
            k = int(result.get_response().id)  # type: ignore[attr-defined]
            np.testing.assert_array_equal(result.as_numpy("Y"), (X + k + 1) * 2)  # type: ignore[attr-defined]
    finally:
        grpc.stop_stream()


def test_a_json_body_past_the_offload_size_is_parsed_for_an_ensemble(
    http: httpclient.InferenceServerClient,
) -> None:
    """A JSON body of ``PARSE_MIN`` or more is parsed by one of the model's workers; an
    ensemble has none of its own: it was refused 503, "no running instance" (fuzzing).
    The front parses it, as a smaller one."""
    values = np.arange(300_000, dtype=np.float32).reshape(1, -1)
    assert len(json.dumps(values.tolist())) > PARSE_MIN
    wanted = [httpclient.InferRequestedOutput("Y", binary_data=True)]
    answer = http.infer("chain", _http_x(values, binary=False), outputs=wanted)
    np.testing.assert_array_equal(answer.as_numpy("Y"), (values + 1) * 2)


def test_a_diamond_runs_its_branches_and_joins_them(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    expected = (X + 1) + 2 * X
    np.testing.assert_array_equal(http.infer("diamond", _http_x()).as_numpy("Y"), expected)
    np.testing.assert_array_equal(grpc.infer("diamond", _grpc_x()).as_numpy("Y"), expected)
    # Many at once, from several clients: each answer is its own request's.
    rows = [np.full((1, 5), float(i), np.float32) for i in range(24)]
    pending = [http.async_infer("diamond", _http_x(row)) for row in rows]
    for row, call in zip(rows, pending, strict=True):
        np.testing.assert_array_equal(call.get_result().as_numpy("Y"), (row + 1) + 2 * row)


def test_a_step_reads_another_workers_output_in_place(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    """The diamond's branches run on the two workers at once; the joining step then reads
    the other worker's output segment where it lies: a worker maps it (docs/ensembles.md)."""
    for _ in range(4):
        http.infer("diamond", _http_x())
    workers = server.worker_pids()
    assert len(workers) == 2
    assert any(len(mapped_output_prefixes(pid)) >= 2 for pid in workers)


def test_an_image_decoding_first_step(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """PNG bytes in, decoded by the first step's worker (BGR), classes out of the next."""
    image = np.zeros((4, 4, 3), np.uint8)
    image[:] = (10, 20, 30)  # B, G, R
    ok, png = cv2.imencode(".png", image)
    assert ok
    blobs = np.array([png.tobytes(), png.tobytes()], dtype=np.object_)
    given = httpclient.InferInput("PNG", [2], "BYTES")
    given.set_data_from_numpy(blobs)
    expected = np.array([[20.0, 40.0, 60.0]] * 2, np.float32)
    np.testing.assert_array_equal(http.infer("image_mean", [given]).as_numpy("SCORES"), expected)
    given_grpc = grpcclient.InferInput("PNG", [2], "BYTES")
    given_grpc.set_data_from_numpy(blobs)
    result = grpc.infer("image_mean", [given_grpc]).as_numpy("SCORES")
    np.testing.assert_array_equal(result, expected)


def test_an_ensemble_as_a_step_runs_as_in_triton(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """``nested``'s first step is the ensemble ``inner_chain``, which only ``nested`` names:
    it was loaded with it, with its own composing models. Each level counts the request
    once in its statistics, as Triton counts a nested ensemble's."""
    assert http.is_model_ready("inner_chain")
    chained = (X + 1) * 2
    np.testing.assert_array_equal(http.infer("nested", _http_x()).as_numpy("Y"), chained + 1)
    np.testing.assert_array_equal(grpc.infer("nested", _grpc_x()).as_numpy("Y"), chained + 1)
    names = ("nested_twice", "nested", "inner_chain", "add_one", "double", "plus")
    before = {name: _step_stats(http, name) for name in names}
    answer = http.infer("nested_twice", _http_x(binary=False)).as_numpy("Y")
    np.testing.assert_array_equal(answer, (chained + 1) * 2 + chained)
    after = {name: _step_stats(http, name) for name in names}
    counted = {"nested_twice": 1, "nested": 1, "inner_chain": 2, "add_one": 3, "double": 3}
    for name, count in {**counted, "plus": 1}.items():
        assert after[name][:2] == (before[name][0] + count, before[name][1]), name


def test_an_unloaded_inner_ensemble_makes_the_outer_one_unavailable(
    http: httpclient.InferenceServerClient,
) -> None:
    """As a composing model: 503 naming the step, not ready, and back with it."""
    http.unload_model("inner_chain")
    try:
        assert wait_for(lambda: not http.is_model_ready("nested"), timeout=10)
        (entry,) = [e for e in http.get_model_repository_index() if e["name"] == "nested"]
        assert "composing model 'inner_chain'" in entry["reason"], entry  # not "restarting"
        with pytest.raises(InferenceServerException, match="composing model 'inner_chain'") as info:
            http.infer("nested", _http_x())
        assert info.value.status() == "503"
    finally:
        http.load_model("inner_chain")
    assert http.is_model_ready("nested") and http.is_model_ready("nested_twice")
    np.testing.assert_array_equal(http.infer("nested", _http_x()).as_numpy("Y"), (X + 1) * 2 + 1)


def test_an_inner_ensemble_reloaded_with_other_tensors_makes_the_outer_one_unavailable(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """inner_chain reloaded with its tensors renamed (X, Y -> XX, YY): it has no graph to
    refuse that, and nested maps X and Y. nested then said ready and answered every
    request 400 'unexpected input' (found by fuzzing); now it is not ready, a 503 saying
    why, until a reload of inner_chain fits again (Triton checks the ensembles using a
    reloaded model again)."""
    renamed = {
        "name": "inner_chain",
        "platform": "ensemble",
        "max_batch_size": 8,
        "input": [{"name": "XX", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "YY", "data_type": "TYPE_FP32", "dims": [-1]}],
        "ensemble_scheduling": {
            "step": [
                {"model_name": "add_one", "model_version": -1,
                 "input_map": {"IN": "XX"}, "output_map": {"OUT": "x1"}},
                {"model_name": "double", "model_version": -1,
                 "input_map": {"IN": "x1"}, "output_map": {"OUT": "YY"}},
            ]
        },
    }  # fmt: skip
    http.load_model("inner_chain", config=json.dumps(renamed))
    try:
        assert not http.is_model_ready("nested") and not grpc.is_model_ready("nested_twice")
        with pytest.raises(InferenceServerException, match="no longer fits") as info:
            http.infer("nested", _http_x())
        assert info.value.status() == "503" and "non-existing input X in model inner_chain" in (
            info.value.message() or ""
        )
        (entry,) = [e for e in http.get_model_repository_index() if e["name"] == "nested"]
        assert entry["state"] == "UNAVAILABLE" and "no longer fits" in entry["reason"], entry
        renamed_x = httpclient.InferInput("XX", list(X.shape), "FP32")
        renamed_x.set_data_from_numpy(X)
        expected = (X + 1) * 2
        np.testing.assert_array_equal(
            http.infer("inner_chain", [renamed_x]).as_numpy("YY"), expected
        )
    finally:
        http.load_model("inner_chain")  # the repository's config again
    assert http.is_model_ready("nested") and http.is_model_ready("nested_twice")
    np.testing.assert_array_equal(http.infer("nested", _http_x()).as_numpy("Y"), (X + 1) * 2 + 1)


def test_outputs_the_client_cannot_take_are_refused_and_counted_as_failures(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    """Found by fuzzing: an output into a region too small for it was a 400 counted as a
    success; classification skipped its checks on ensembles (a count past the bound was
    served, a BYTES output or one also in a region was a 500). Each is a 400 and a
    failure now, as for any model."""
    key = f"/oipserve-test-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("small", key, 16)
    http.register_system_shared_memory("small", key, 16)
    region = {"shared_memory_region": "small", "shared_memory_byte_size": 16}
    cases = [  # Y of X [2, 3] needs 24 bytes
        (region, "output 'Y' needs 24 bytes but its shared memory region 'small' gives 16"),
        ({"classification": 10**12}, "asks for 1000000000000 classes; at most 65536 may be"),
        ({"classification": 2, **region}, "cannot be both in shared memory and a classification"),
    ]
    x = {"name": "X", "datatype": "FP32", "shape": [2, 3], "data": X.ravel().tolist()}
    try:
        for parameters, message in cases:
            before = _step_stats(http, "chain")
            body = {"inputs": [x], "outputs": [{"name": "Y", "parameters": parameters}]}
            status, _, answer = request(server, "POST", "/v2/models/chain/infer", json.dumps(body))
            assert (status, message in json.loads(answer)["error"]) == (400, True), answer
            after = _step_stats(http, "chain")
            assert after[:2] == (before[0], before[1] + 1), message
    finally:
        http.unregister_system_shared_memory("small")
        shm.destroy_shared_memory_region(handle)


def test_requests_that_do_not_fit_the_ensemble_are_refused(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    before = scrape(server.metrics_url).value(
        "nv_inference_request_failure", "chain", reason="OTHER"
    )
    wrong = httpclient.InferInput("X", [1, 3], "INT32")
    wrong.set_data_from_numpy(np.ones((1, 3), np.int32))
    with pytest.raises(InferenceServerException, match="expects 'FP32'") as info:
        http.infer("chain", [wrong])
    assert info.value.status() == "400"
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
        http.infer("chain", _http_x(np.ones((9, 2), np.float32)))
    unknown = httpclient.InferInput("Z", [1, 3], "FP32")
    unknown.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="unexpected inference input 'Z'"):
        http.infer("chain", [unknown])
    after = scrape(server.metrics_url).value(
        "nv_inference_request_failure", "chain", reason="OTHER"
    )
    assert after == before + 3  # an ensemble failure's reason is OTHER, as in Triton


def test_inputs_of_different_batch_sizes_are_refused_as_by_any_model(
    http: httpclient.InferenceServerClient,
) -> None:
    """Two inputs, each read by a step of its own, with batch sizes 1 and 3: refused in
    Triton's words, as by any batching model. Each step ran on its own batch, a 200 with
    outputs of batch 1 and 3 (found by fuzzing)."""
    http.load_model("two_inputs")
    inputs = []
    for name, rows in (("X", 1), ("Z", 3)):
        given = httpclient.InferInput(name, [rows, 2], "FP32")
        given.set_data_from_numpy(np.ones((rows, 2), np.float32))
        inputs.append(given)
    words = "input 'Z' batch size does not match other inputs for 'two_inputs'"
    with pytest.raises(InferenceServerException, match=words) as info:
        http.infer("two_inputs", inputs)
    assert info.value.status() == "400"
    inputs[1] = httpclient.InferInput("Z", [1, 2], "FP32")
    inputs[1].set_data_from_numpy(np.full((1, 2), 5, np.float32))
    result = http.infer("two_inputs", inputs)
    assert result.as_numpy("Y").tolist() == [[2.0, 2.0]]
    assert result.as_numpy("W").tolist() == [[10.0, 10.0]]


def test_requested_outputs_are_checked_as_any_models(
    http: httpclient.InferenceServerClient,
) -> None:
    """The ensemble's requested outputs go through the one check every model's do
    (``request.checks.check_output_names``)."""
    unknown = [httpclient.InferRequestedOutput("Z")]
    with pytest.raises(InferenceServerException, match="unexpected inference output 'Z'"):
        http.infer("chain", _http_x(), outputs=unknown)
    twice = [httpclient.InferRequestedOutput("Y"), httpclient.InferRequestedOutput("Y")]
    with pytest.raises(InferenceServerException, match="'Y' already exists in request") as info:
        http.infer("chain", _http_x(), outputs=twice)
    assert info.value.status() == "400"


def test_a_request_with_several_faults_is_refused_as_by_any_model(server: ServerProcess) -> None:
    """The ensemble's request goes through every model's checks (``check_inputs``), in
    Triton's order: the requested outputs before the inputs' datatypes, and the input count
    before them. Its own shorter twin checked each input first and the outputs last."""
    wrong = tensor("X", "INT32", [1, 3], [0, 0, 0])
    for message in refusals(server, "chain", [wrong], ["Z"]):
        assert "unexpected inference output 'Z' for model 'chain'" in message, message
    other = tensor("W", "FP32", [1, 3], [0.0, 0.0, 0.0])
    for message in refusals(server, "chain", [wrong, other]):
        assert "expected 1 inputs but got 2 inputs for model 'chain'" in message, message
    # (Triton's core puts the request's id first, as for any model)
    for message in refusals(server, "chain", [wrong], request_id="ens-1"):
        assert message.startswith("[request id: ens-1] inference input 'X' data-type is"), message


def test_statistics_count_the_ensemble_and_each_step(http: httpclient.InferenceServerClient):
    def successes(name: str) -> int:
        stats = http.get_inference_statistics(name)["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"])

    before = {name: successes(name) for name in ("diamond", "plus", "add_one", "double")}
    for _ in range(3):
        http.infer("diamond", _http_x())
    assert successes("diamond") == before["diamond"] + 3
    for step in ("plus", "add_one", "double"):
        assert successes(step) == before[step] + 3, step


def _step_stats(http: httpclient.InferenceServerClient, name: str) -> tuple[int, int, int, int]:
    """A composing model's successes, failures, executions and queue time (ns)."""
    stats = http.get_inference_statistics(name)["model_stats"][0]
    inference = stats["inference_stats"]
    return (
        int(inference["success"]["count"]),
        int(inference["fail"]["count"]),
        int(stats["execution_count"]),
        int(inference["queue"]["ns"]),
    )


@pytest.mark.parametrize(
    ("name", "steps"),
    [("chain", ("add_one", "double")), ("chain3", ("add_one", "double", "preprocess"))],
)
def test_a_chain_runs_in_one_worker_and_answers_as_its_steps_do(
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
    name: str,
    steps: tuple[str, ...],
) -> None:
    """The steps run in one worker (``workers.chains``): the same bits as the models called
    one by one, each step counted in its model's statistics, and no Infer of its own for a
    later step (it never waits in a worker's queue: its queue time stays 0)."""
    x = np.random.default_rng(7).standard_normal((3, 5)).astype(np.float32)
    expected = x
    for step in steps:
        given = httpclient.InferInput("IN", list(expected.shape), "FP32")
        given.set_data_from_numpy(expected)
        expected = http.infer(step, [given]).as_numpy("OUT")
    before = {step: _step_stats(http, step) for step in steps}
    np.testing.assert_array_equal(http.infer(name, _http_x(x)).as_numpy("Y"), expected)
    np.testing.assert_array_equal(grpc.infer(name, _grpc_x(x)).as_numpy("Y"), expected)
    after = {step: _step_stats(http, step) for step in steps}
    for step in steps:
        success, fail, executions, _ = after[step]
        assert (success, fail, executions) == (
            before[step][0] + 2,
            before[step][1],
            before[step][2] + 2,
        ), step
    for step in steps[1:]:
        assert after[step][3] == before[step][3], step  # fed in the worker, never queued


def test_a_failing_chain_step_fails_as_that_step_alone(
    http: httpclient.InferenceServerClient,
) -> None:
    """six_wide (a Reshape to [-1, 6]) fails on 4 values: the chain's answer is the one the
    model gives alone for that input, the step counts a failure, the one before a success."""
    x = np.ones((1, 4), np.float32)
    given = httpclient.InferInput("IN", [1, 4], "FP32")
    given.set_data_from_numpy(x + 1)
    with pytest.raises(InferenceServerException) as alone:
        http.infer("six_wide", [given])
    before = {step: _step_stats(http, step) for step in ("add_one", "six_wide")}
    with pytest.raises(InferenceServerException) as chained:
        http.infer("failing_chain", _http_x(x))
    assert chained.value.status() == alone.value.status() == "400"
    assert chained.value.message() == alone.value.message()
    after = {step: _step_stats(http, step) for step in ("add_one", "six_wide")}
    assert after["add_one"][:2] == (before["add_one"][0] + 1, before["add_one"][1])
    assert after["six_wide"][:2] == (before["six_wide"][0], before["six_wide"][1] + 1)
    six = np.arange(6, dtype=np.float32).reshape(1, 6)
    np.testing.assert_array_equal(http.infer("failing_chain", _http_x(six)).as_numpy("Y"), six + 1)


def test_a_batched_step_batches_steps_of_several_ensemble_requests(
    http: httpclient.InferenceServerClient,
) -> None:
    """batched_double's own batcher joins the second steps of four ensemble requests."""
    rows = [np.full((1, 3), float(i), np.float32) for i in range(4)]
    pending = [http.async_infer("batched_chain", _http_x(row)) for row in rows]
    for row, call in zip(rows, pending, strict=True):
        np.testing.assert_array_equal(call.get_result().as_numpy("Y"), (row + 1) * 2)
    stats = http.get_inference_statistics("batched_double")["model_stats"][0]
    assert stats["inference_count"] == 4
    assert stats["execution_count"] < 4  # (one batch of 4 unless the box is very slow)


def test_max_inflight_requests_holds_requests_back_without_deadlock(
    http: httpclient.InferenceServerClient,
) -> None:
    rows = [np.full((1, 3), float(i), np.float32) for i in range(6)]
    pending = [http.async_infer("limited_chain", _http_x(row)) for row in rows]
    for row, call in zip(rows, pending, strict=True):
        np.testing.assert_array_equal(call.get_result().as_numpy("Y"), (row + 1) * 2)


@pytest.mark.parametrize("name", sorted(BAD))
def test_an_ensemble_triton_refuses_does_not_load(
    http: httpclient.InferenceServerClient, name: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        http.load_model(name)
    assert BAD[name][1] in str(info.value)
    assert not http.is_model_ready(name)


def test_a_composing_model_unloaded_under_load(
    server: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    """Requests in flight get their answer or a 503 naming what went; none hangs or 500s;
    the ensemble is not ready until the step's model is back, and works again then."""
    errors: list[str] = []
    answers = [0]
    stop = threading.Event()

    def load() -> None:
        client = httpclient.InferenceServerClient(server.host_port)
        try:
            while not stop.is_set():
                try:
                    result = client.infer("slow_chain", _http_x())
                    np.testing.assert_array_equal(result.as_numpy("Y"), (X + 1) * 2)
                    answers[0] += 1
                except InferenceServerException as exc:
                    errors.append(f"{exc.status()} {exc.message()}")
        finally:
            client.close()

    threads = [threading.Thread(target=load) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        assert wait_for(lambda: answers[0] >= 3, timeout=30)
        grpc.unload_model("double")
        assert wait_for(lambda: not http.is_model_ready("slow_chain"), timeout=10)
        assert wait_for(lambda: len(errors) >= 3, timeout=10)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert errors
    assert all(e.startswith("503 ") for e in errors), errors
    assert any("step 1" in e and "'double'" in e for e in errors), errors
    with pytest.raises(InferenceServerException, match="composing model 'double'") as info:
        http.infer("slow_chain", _http_x())
    assert info.value.status() == "503"
    grpc.load_model("double")
    assert http.is_model_ready("slow_chain")
    np.testing.assert_array_equal(http.infer("slow_chain", _http_x()).as_numpy("Y"), (X + 1) * 2)


#: An ensemble whose one step is the model named second (INT32 [16] in and out).
_STEP_ON = """name: "{0}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{1}" model_version: -1
  input_map {{ key: "INPUT0" value: "INPUT0" }}
  output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} }} ] }}
"""


def test_two_ensembles_naming_each_other_do_not_hold_the_start(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """ens_a's step is ens_b and ens_b's is ens_a: each load waited for the other's, and the
    start never ended, logging nothing (found by fuzzing). Both are not ready now, each
    with Triton's reason, and the rest of the repository serves."""
    root = tmp_path_factory.mktemp("ensemble-cycle")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_int32", root / "identity_int32")
    for name, step in (("ens_a", "ens_b"), ("ens_b", "ens_a")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(_STEP_ON.format(name, step))
    proc = ServerProcess(root).wait_ready(timeout=60)
    try:
        with httpclient.InferenceServerClient(proc.host_port) as client:
            assert client.is_model_ready("identity_int32")
            assert not client.is_model_ready("ens_a") and not client.is_model_ready("ens_b")
    finally:
        assert proc.stop() == 0, proc.log
    for name, other in (("ens_a", "ens_b"), ("ens_b", "ens_a")):
        reason = f"circular dependency between ensembles: {name} -> ... -> {other} -> {name}"
        assert f"model '{name}' is UNAVAILABLE: {reason}" in proc.log, proc.log


def test_an_unload_with_its_dependents_takes_the_steps_loaded_for_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Triton's ``unload_dependents``: the composing models loaded for the ensemble go with
    it, at any depth (``outer`` -> ``solo`` -> ``id_a``); a step another loaded ensemble
    still has (``id_b``), or one loaded by its own request (``id_c``), stays. It was
    ignored: every step stayed loaded (found by fuzzing)."""
    root = tmp_path_factory.mktemp("unload-dependents")
    for name in ("id_a", "id_b", "id_c"):
        shutil.copytree(SAMPLE_REPOSITORY / "identity_int32", root / name)
    steps = {"solo": "id_a", "outer": "solo", "pair1": "id_b", "pair2": "id_b", "mine": "id_c"}
    for name, step in steps.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(_STEP_ON.format(name, step))
    args = ["--model-control-mode", "explicit"]
    for name in ("outer", "pair1", "pair2", "id_c", "mine"):
        args += ["--load-model", name]
    proc = ServerProcess(root, args).wait_ready(timeout=60)
    http = httpclient.InferenceServerClient(proc.host_port)
    grpc = grpcclient.InferenceServerClient(proc.grpc_url)
    try:
        loaded = {e["name"] for e in http.get_model_repository_index() if e.get("state") == "READY"}
        assert loaded == {*steps, "id_a", "id_b", "id_c"}
        http.unload_model("outer", unload_dependents=True)
        grpc.unload_model("pair1", unload_dependents=True)
        http.unload_model("mine", unload_dependents=True)
        ready = {e["name"] for e in http.get_model_repository_index() if e.get("state") == "READY"}
        assert ready == {"pair2", "id_b", "id_c"}
        for name in ("solo", "id_a"):
            (entry,) = [e for e in http.get_model_repository_index() if e["name"] == name]
            assert entry["reason"] == "unloaded", entry
        grpc.unload_model("pair2")  # without: its step stays, as in Triton
        assert http.is_model_ready("id_b")
        assert "model 'id_a': unloading it with the ensemble it was loaded for" in proc.log
    finally:
        http.close()
        grpc.close()
        assert proc.stop() == 0, proc.log


def test_unload_dependents_must_be_a_boolean_and_a_named_repository_is_refused(
    server: ServerProcess, grpc: grpcclient.InferenceServerClient
) -> None:
    """As Triton: a non-boolean ``unload_dependents`` is INVALID_ARGUMENT (REST 400) and the
    model stays; a request naming a repository is refused (UNSUPPORTED), where it was
    served from the one repository; an empty name is no route (404)."""
    from oipserve.grpc_generated import grpc_service_pb2 as pb

    unload_body = json.dumps({"parameters": {"unload_dependents": "yes"}})
    status, _, body = request(server, "POST", "/v2/repository/models/chain/unload", unload_body)
    assert status == 400 and b"'unload_dependents'" in body, body
    stub = grpc._client_stub
    parameter = pb.ModelRepositoryParameter(string_param="x")
    unload = pb.RepositoryModelUnloadRequest(model_name="chain")
    unload.parameters["unload_dependents"].CopyFrom(parameter)
    with pytest.raises(Exception, match="expected a boolean") as info:
        stub.RepositoryModelUnload(unload)
    assert info.value.code().name == "INVALID_ARGUMENT"
    assert grpc.is_model_ready("chain")
    named = "'repository_name' specification is not supported"
    other = {"repository_name": "other", "model_name": "chain"}
    for call, message in (
        (stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name="other")),
        (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(**other)),
        (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(**other)),
    ):
        with pytest.raises(Exception, match=named) as info:
            call(message)
        assert info.value.code().name == "UNIMPLEMENTED"
    for path in ("/v2/repository/other/index", "/v2/repository/other/models/chain/unload"):
        status, _, body = request(server, "POST", path, "{}")
        assert (status, json.loads(body)) == (501, {"error": named}), path
    # An empty repository segment is no route of Triton's: a 404, where it answered 200.
    for path in ("/v2/repository//index", "/v2/repository//models/chain/unload"):
        status, _, body = request(server, "POST", path, "{}")
        assert (status, json.loads(body)) == (404, {"error": "404 Not Found"}), path
    assert grpc.is_model_ready("chain")
