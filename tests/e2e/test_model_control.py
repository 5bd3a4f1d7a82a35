"""Model control as Triton's clients use it: loads with ``config`` and ``file:`` overrides,
Triton's example clients, readiness after unload, reloads under load, the load timeout.

One server in explicit mode on a private copy of a few sample models; the load-timeout
test has a server of its own (a slow load occupies a repository worker).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.http import fp32_infer, get, post, request
from tests.support.onnx_models import write_slow_model
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, wait_for

MODELS = ("simple", "identity_fp32", "batched", "versioned")
IDENTITY = (SAMPLE_REPOSITORY / "identity_fp32" / "1" / "model.onnx").read_bytes()
#: A configuration for an uploaded identity model: its inputs and outputs come from the ONNX
#: graph (auto-complete, which batches it: max_batch_size 4; the tests send one row).
IDENTITY_CONFIG = json.dumps({"max_batch_size": "0"})
UPLOADS = re.compile(r"loading (/\S+-uploads-\S+?)/\d+/model\.onnx on")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for name in MODELS:
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
    return root


@pytest.fixture(scope="module")
def srv(repo: Path) -> Iterator[ServerProcess]:
    args = ["--devices", "cpu", "--instances-per-device", "2", "--model-control-mode", "explicit"]
    args += ["--load-model", "identity_fp32", "--load-model", "batched"]
    proc = ServerProcess(repo, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log
    # Uploaded files are gone with the server.
    assert not [p for p in UPLOADS.findall(proc.log) if Path(p).exists()]


@pytest.fixture
def http(srv: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    # NOTE: closed at teardown: the ExceptionInfo of a pytest.raises holds the test's frame,
    #   and so this client, in a cycle; left to the collector, it may be closed in another
    #   thread, where tritonclient's HTTP client fails (gevent).
    client = httpclient.InferenceServerClient(srv.host_port)
    yield client
    client.close()


@pytest.fixture
def grpc_client(srv: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    yield client
    client.close()


def load(srv: ServerProcess, name: str, parameters: dict[str, object]) -> tuple[int, str]:
    """A raw HTTP load; (status, error message or "")."""
    status, body = post(srv, f"/v2/repository/models/{name}/load", {"parameters": parameters})
    return status, json.loads(body)["error"] if body else ""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ---- Triton's example clients ----------------------------------------------------------


def test_triton_http_model_control_example(
    srv: ServerProcess, repo: Path, http: httpclient.InferenceServerClient
) -> None:
    """The calls of Triton's simple_http_model_control.py, in order."""
    # The example counts the entries of Triton's QA repository: every directory is listed.
    names = {e["name"] for e in http.get_model_repository_index()}
    assert names == {p.name for p in repo.iterdir()}
    http.load_model("simple")
    assert http.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as caught:
        http.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    assert caught.value.message().startswith("failed to load 'simple': invalid config override")
    assert caught.value.status() == "400"
    # The failed reload changed nothing: the model still serves its config.pbtxt.
    assert http.is_model_ready("simple")
    assert http.get_model_config("simple")["max_batch_size"] == 8
    http.load_model("simple", config='{"max_batch_size":"16"}')
    assert http.get_model_config("simple")["max_batch_size"] == 16
    # The ONNX graph filled in the inputs; a batch of 16 now runs.
    a = np.arange(16 * 16, dtype=np.int32).reshape(16, 16)
    inputs = [httpclient.InferInput(n, [16, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    assert np.array_equal(http.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)
    # A load without config goes back to the file.
    http.load_model("simple")
    assert http.get_model_config("simple")["max_batch_size"] == 8
    http.unload_model("simple")
    assert not http.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as caught:
        http.load_model("wrong_model_name")
    assert "failed to load" in caught.value.message()
    assert caught.value.status() == "400"
    assert "wrong_model_name" in caught.value.message()


def test_triton_grpc_model_control_example(
    repo: Path, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """The calls of Triton's simple_grpc_model_control.py, in order."""
    client = grpc_client
    names = {e.name for e in client.get_model_repository_index().models}
    assert names == {p.name for p in repo.iterdir()}
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    assert "failed to load" in caught.value.message()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.load_model("simple", config='{"max_batch_size":"16"}')
    assert client.get_model_config("simple").config.max_batch_size == 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    # A path component longer than NAME_MAX is refused; the server lives on.
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
    assert "Invalid file path" in caught.value.message()
    assert caught.value.message().startswith("failed to load 'simple'")
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_server_live()
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("wrong_model_name")
    assert "failed to load" in caught.value.message()


# ---- loads with files -----------------------------------------------------------------


def _upload_dir(srv: ServerProcess, name: str) -> Path:
    """The directory a model was last loaded from (from its "loading" log line)."""
    lines = [line for line in srv.lines if f"model '{name}' version" in line and "loading" in line]
    match = UPLOADS.search(lines[-1])
    assert match, lines[-1]
    return Path(match.group(1))


def test_load_a_new_model_from_files_over_http_and_grpc(
    srv: ServerProcess, repo: Path, grpc_client: grpcclient.InferenceServerClient
) -> None:
    before = sorted(p.name for p in repo.iterdir())
    # HTTP: base64 strings (tritonclient.http cannot send files: it json.dumps bytes).
    extra = bytes(2 * 1024 * 1024)  # over the 1 MiB of other management bodies
    parameters = {
        "config": IDENTITY_CONFIG,
        "file:3/model.onnx": b64(IDENTITY),
        "file:3/notes/extra.bin": b64(extra),
    }
    assert load(srv, "uploaded", parameters) == (200, "")
    fp32_infer(srv, "uploaded")
    assert get(srv, "/v2/models/uploaded")[1]["versions"] == ["3"]  # type: ignore[index]
    # Progress in the log: load time and placement, one line per version (read from the
    #   server's output by a thread of its own: waited for, it may come after the answer).
    ready = r"model 'uploaded' version 3 is READY: loaded in \d+\.\d\ds on worker \d+ \(cpu\)"
    assert wait_for(lambda: re.search(ready, srv.log)), srv.log
    # Written under the server's upload directory, never into the repository.
    place = _upload_dir(srv, "uploaded")
    assert (place / "3" / "notes" / "extra.bin").read_bytes() == extra
    assert not place.is_relative_to(repo)
    assert sorted(p.name for p in repo.iterdir()) == before
    index = json.loads(post(srv, "/v2/repository/index")[1])
    assert {"name": "uploaded", "version": "3", "state": "READY", "reason": ""} in index

    # gRPC: raw bytes. A reload with new version files swaps versions; the old files go.
    grpc_client.load_model(
        "uploaded", config=IDENTITY_CONFIG, files={"file:4/model.onnx": IDENTITY}
    )
    assert get(srv, "/v2/models/uploaded")[1]["versions"] == ["4"]  # type: ignore[index]
    fp32_infer(srv, "uploaded")
    assert not place.exists()
    assert wait_for(lambda: "model 'uploaded' version 4 is READY" in srv.log), srv.log
    place = _upload_dir(srv, "uploaded")
    # A failed reload (a file that is not ONNX) leaves version 4 serving, and its files.
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.load_model(
            "uploaded", config=IDENTITY_CONFIG, files={"file:5/model.onnx": b"not onnx"}
        )
    assert caught.value.message().startswith("failed to load 'uploaded': version 5:")
    assert get(srv, "/v2/models/uploaded")[1]["versions"] == ["4"]  # type: ignore[index]
    fp32_infer(srv, "uploaded")
    assert wait_for(lambda: "model 'uploaded' version 5: loading" in srv.log), srv.log
    assert place.exists() and not _upload_dir(srv, "uploaded").exists()
    # Unload removes the files; the model is known and not ready, and the index lists
    # its version unloaded (it went from the index: no directory lists it, fuzzing).
    grpc_client.unload_model("uploaded")
    assert not place.exists()
    assert not grpc_client.is_model_ready("uploaded")
    index = json.loads(post(srv, "/v2/repository/index")[1])
    entries = [entry for entry in index if entry["name"] == "uploaded"]
    assert entries == [
        {"name": "uploaded", "version": "4", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    listed = grpc_client.get_model_repository_index().models
    assert [(m.version, m.state, m.reason) for m in listed if m.name == "uploaded"] == [
        ("4", "UNAVAILABLE", "unloaded")
    ]
    # Not in the repository: a load without files cannot find it.
    status, message = load(srv, "uploaded", {})
    assert status == 400 and message.startswith("failed to load 'uploaded': there is no model")


def test_a_failed_load_of_files_leaves_no_file(srv: ServerProcess) -> None:
    """A load of a new name whose file is not ONNX: its 400, and its files removed with
    it (they stayed until the name was loaded again; fuzzing)."""
    status, message = load(
        srv, "never_served", {"config": IDENTITY_CONFIG, "file:1/model.onnx": b64(b"not onnx")}
    )
    assert status == 400 and message.startswith("failed to load 'never_served': version 1:")
    assert not _upload_dir(srv, "never_served").exists()


def test_load_with_config_only_uses_the_repository_files(srv: ServerProcess) -> None:
    config = json.dumps({"version_policy": {"all": {}}, "maxBatchSize": 0})
    assert load(srv, "versioned", {"config": config}) == (200, "")
    assert get(srv, "/v2/models/versioned")[1]["versions"] == ["1", "2"]  # type: ignore[index]
    assert load(srv, "versioned", {"config": json.dumps({"name": "versioned"})}) == (200, "")
    assert get(srv, "/v2/models/versioned")[1]["versions"] == ["2"]  # type: ignore[index]
    assert post(srv, "/v2/repository/models/versioned/unload")[0] == 200


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({"file:1/model.onnx": b64(IDENTITY)}, "'config' must be specified for model file"),
        ({"config": "{}", "file:../1/model.onnx": b64(IDENTITY)}, "Invalid file path"),
        ({"config": "{}", "file:/etc/1/model.onnx": b64(IDENTITY)}, "Invalid file path"),
        ({"config": "{}", "file:1/./model.onnx": b64(IDENTITY)}, "Invalid file path"),
        ({"config": "{}", "file:": b64(IDENTITY)}, "Invalid file path"),
        ({"config": "{}", "file:1": "YQ==", "file:1/model.onnx": "YQ=="}, "also the directory"),
        ({"config": "{}", "file:1/model.onnx": "not base64!"}, "not valid base64"),
        ({"config": "{}", "file:1/model.onnx": 12}, "must be a base64 string"),
        ({"config": {"max_batch_size": 1}}, "'config' must be a string"),
        ({"config": "{nope"}, "invalid config override: Failed to load JSON"),
        ({"config": '{"max_batch_sze": 1}'}, 'has no field named "max_batch_sze"'),
        ({"config": '{"platform": "tensorflow_savedmodel"}'}, "only ONNX models"),
        ({"config": '{"max_batch_size": -1}'}, "max_batch_size must be 0 or more"),
        ({"config": '{"name": "other"}'}, "names the model 'other'"),
        ({"config": "[" * 100_000}, "invalid config override"),
        ({"unload_dependents": "true"}, "unrecognized load parameter 'unload_dependents'"),
    ],
)
def test_bad_loads_are_400_failed_to_load_and_change_nothing(
    srv: ServerProcess, parameters: dict[str, object], reason: str
) -> None:
    status, message = load(srv, "identity_fp32", parameters)
    assert status == 400, message
    assert message.startswith("failed to load 'identity_fp32': ") and reason in message, message
    fp32_infer(srv, "identity_fp32")  # still the model loaded at start
    assert request(srv, "GET", "/v2/health/ready")[0] == 200


#: Triton's QA configs qa/L0_model_config/noautofill_platform/reshape_{nobatch_empty0,
#: nobatch_empty1, variable3, nobatch_variable3} (as JSON, one each of input and output):
#: oipserve loaded them until 2026-11-30; Triton refuses them at load, in these words.
RESHAPES = [
    (0, "input", [1], [], "cannot have empty reshape for non-batching model as scalar tensors"),
    (0, "output", [1], [], "cannot have empty reshape for non-batching model as scalar tensors"),
    (4, "input", [2, -1], [1, -1, 2], "has different size for dims and reshape"),
    (0, "output", [2, -1], [1, -1, 2], "has different size for dims and reshape"),
]


@pytest.mark.parametrize(("batch", "kind", "dims", "reshape", "phrase"), RESHAPES)
def test_reshapes_triton_refuses_are_refused_at_load(
    srv: ServerProcess,
    grpc_client: grpcclient.InferenceServerClient,
    batch: int,
    kind: str,
    dims: list[int],
    reshape: list[int],
    phrase: str,
) -> None:
    tensor = {"name": f"{kind}0", "data_type": "TYPE_FP32", "dims": dims}
    other = {"name": "other", "data_type": "TYPE_FP32", "dims": [1]}
    config = {
        "max_batch_size": batch,
        "input": [{**tensor, "reshape": {"shape": reshape}} if kind == "input" else other],
        "output": [{**tensor, "reshape": {"shape": reshape}} if kind == "output" else other],
    }
    words = f"model {kind} '{kind}0' {phrase}"
    status, message = load(srv, "identity_fp32", {"config": json.dumps(config)})
    assert status == 400, message
    assert message.startswith("failed to load 'identity_fp32': ") and words in message, message
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.load_model("identity_fp32", config=json.dumps(config))
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert words in caught.value.message(), caught.value.message()
    fp32_infer(srv, "identity_fp32")  # still the model loaded at start


def test_bad_names_and_models_that_do_not_load(
    srv: ServerProcess, grpc_client: grpcclient.InferenceServerClient
) -> None:
    for name in ("..", ".", "a/b", "x" * 300):
        with pytest.raises(InferenceServerException) as caught:
            grpc_client.load_model(name, config="{}", files={"file:1/model.onnx": IDENTITY})
        assert caught.value.message().startswith("failed to load '"), name
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    # Over gRPC files are bytes_param; a string is refused.
    stub_error = _grpc_load_raw(grpc_client, "fresh", {"config": "{}"}, {"file:1/model.onnx": "x"})
    assert stub_error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be a bytes_param" in stub_error.details()
    # A new model whose file is not ONNX: 400 with ONNX Runtime's reason; it is known, not ready.
    status, message = load(
        srv, "fresh", {"config": IDENTITY_CONFIG, "file:1/model.onnx": b64(b"garbage")}
    )
    assert status == 400 and message.startswith("failed to load 'fresh': version 1: "), message
    assert request(srv, "GET", "/v2/models/fresh/ready")[0] == 503
    assert post(srv, "/v2/repository/models/fresh/unload")[0] == 200
    # A version the model does not have.
    status, message = load(srv, "identity_fp32", {})
    assert status == 200
    status, body = post(srv, "/v2/repository/models/identity_fp32/versions/7/load")
    assert status == 400 and "failed to load 'identity_fp32'" in json.loads(body)["error"]
    assert grpc_client.is_server_live()


def _grpc_load_raw(
    client: grpcclient.InferenceServerClient,
    name: str,
    strings: dict[str, str],
    string_files: dict[str, str],
) -> grpc.RpcError:
    """A RepositoryModelLoad with string parameters only (tritonclient sends files as bytes)."""
    from tritonclient.grpc import service_pb2

    request_ = service_pb2.RepositoryModelLoadRequest(model_name=name)
    for key, value in {**strings, **string_files}.items():
        request_.parameters[key].string_param = value
    try:
        client._client_stub.RepositoryModelLoad(request_)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the load was accepted")


# ---- readiness after unload -------------------------------------------------------------


def test_unloaded_model_is_known_and_not_ready(
    srv: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    http.load_model("simple")
    assert http.is_model_ready("simple") and grpc_client.is_model_ready("simple")
    http.unload_model("simple")
    status, _, body = request(srv, "GET", "/v2/models/simple/ready")
    assert (status, json.loads(body)) == (503, {"name": "simple", "ready": False})
    assert not http.is_model_ready("simple")
    assert grpc_client.is_model_ready("simple") is False  # not NOT_FOUND
    # Its statistics say what its metadata says (they called it unknown; found by fuzzing)
    status, _, body = request(srv, "GET", "/v2/models/simple/stats")
    assert (status, json.loads(body)) == (
        404,
        {"error": "model 'simple' is not loaded (it was unloaded)"},
    )
    # Never known: 404 / NOT_FOUND, as documented.
    assert request(srv, "GET", "/v2/models/never_seen/ready")[0] == 404
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.is_model_ready("never_seen")
    assert caught.value.status() == "StatusCode.NOT_FOUND"


# ---- loads, unloads and reloads while clients infer -------------------------------------


def test_reloads_and_unloads_under_concurrent_inference(srv: ServerProcess) -> None:
    """Every answer is 200, or 503 with a JSON error; none hangs, none is 500; a reload
    never answers 404; only an unload may, for a request sent while it was unloaded."""
    #: (model, sent, answered, status, message)
    results: list[tuple[str, float, float, int, str]] = []
    stop = threading.Event()

    def hammer(model: str, batched: bool) -> None:
        # NOTE: closed by the with, in the thread that used it (see the http fixture).
        with httpclient.InferenceServerClient(srv.host_port, network_timeout=30) as client:
            x = np.ones((1, 4), dtype=np.float32)
            while not stop.is_set():
                inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32")]
                inputs[0].set_data_from_numpy(x)
                if batched:
                    text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
                    text.set_data_from_numpy(np.array([[b"a"]], dtype=object))
                    inputs.append(text)
                sent = time.monotonic()
                try:
                    out = client.infer(model, inputs).as_numpy("OUTPUT0")
                    status, message = (200, "") if out is not None else (0, "no output")
                except InferenceServerException as exc:
                    status, message = int(exc.status() or 0), exc.message()
                results.append((model, sent, time.monotonic(), status, message))

    def hammer_grpc(model: str) -> None:
        codes = {grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.NOT_FOUND: 404}
        with grpcclient.InferenceServerClient(srv.grpc_url) as client:
            x = np.ones((1, 4), dtype=np.float32)
            while not stop.is_set():
                inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32")]
                inputs[0].set_data_from_numpy(x)
                sent = time.monotonic()
                try:
                    client.infer(model, inputs, client_timeout=30).as_numpy("OUTPUT0")
                    status, message = 200, ""
                except InferenceServerException as exc:
                    code = next((c for c in codes if str(c) == exc.status()), None)
                    status, message = codes.get(code, 0), f"{exc.status()} {exc.message()}"
                results.append((model, sent, time.monotonic(), status, message))

    threads = [
        threading.Thread(target=hammer, args=(model, model == "batched"))
        for model in ("identity_fp32", "identity_fp32", "batched", "batched")
    ]
    threads.append(threading.Thread(target=hammer_grpc, args=("identity_fp32",)))
    for thread in threads:
        thread.start()
    #: (model, from, to): times when a model was (being) unloaded
    unloaded: list[tuple[str, float, float]] = []
    try:
        assert wait_for(lambda: len(results) > 10, 30)
        for round_ in range(6):
            for model in ("identity_fp32", "batched"):
                assert post(srv, f"/v2/repository/models/{model}/load")[0] == 200
                config = json.dumps({"max_batch_size": 16 if model == "batched" else 0})
                if model == "batched":
                    config = json.dumps({**json.loads(config), "dynamic_batching": {}})
                status, message = load(srv, model, {"config": config})
                assert status == 200, message
                if round_ % 2:
                    began = time.monotonic()
                    assert post(srv, f"/v2/repository/models/{model}/unload")[0] == 200
                    time.sleep(0.1)  # the churn's own tempo: traffic meets it unloaded
                    assert post(srv, f"/v2/repository/models/{model}/load")[0] == 200
                    unloaded.append((model, began, time.monotonic()))
                time.sleep(0.05)  # the churn's own tempo, not a wait on the server
    finally:
        stop.set()
        for thread in threads:
            thread.join(40)
    assert not any(thread.is_alive() for thread in threads), "a request hung"
    assert len(results) > 50
    bad = []
    for model, sent, answered, status, message in results:
        if status == 200:
            continue
        if status == 503 and message:
            continue
        during_unload = any(
            m == model and sent < end and answered > begin for m, begin, end in unloaded
        )
        if status == 404 and during_unload and "unloaded" in message:
            continue
        bad.append((model, status, message))
    import collections

    print(collections.Counter((r[0], r[3], r[4][:60]) for r in results))
    assert not bad, bad[:5]
    assert sum(r[3] == 200 for r in results) > len(results) / 2


# ---- the load timeout ---------------------------------------------------------------------


LOAD_TIMEOUT = 1.5
#: Nodes of the slow model: its session takes ~7 s on an idle core of the 2-core test box,
#: ~3 s on a fast one (session creation grows faster than linearly: 4,000 took ~10 s),
#: twice the load timeout or more; the test waits for two of them.
SLOW_NODES = 3500


@pytest.fixture(scope="module")
def slow_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("slowrepo")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "identity_fp32")
    (root / "slow" / "1").mkdir(parents=True)
    write_slow_model(root / "slow" / "1" / "model.onnx", SLOW_NODES)
    args = ["--devices", "cpu", "--model-control-mode", "explicit"]
    args += ["--load-model", "identity_fp32", "--load-timeout", str(LOAD_TIMEOUT)]
    proc = ServerProcess(root, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def test_repository_load_past_the_timeout_is_503_and_leaves_nothing(
    slow_srv: ServerProcess,
) -> None:
    srv = slow_srv
    answer: dict[str, tuple[int, bytes]] = {}
    started = time.monotonic()
    thread = threading.Thread(
        target=lambda: answer.update(load=post(srv, "/v2/repository/models/slow/load"))
    )
    thread.start()
    # While it loads the model is known and not ready: 503, not 404.
    assert wait_for(lambda: "model 'slow' version 1: loading" in srv.log, 30)
    assert request(srv, "GET", "/v2/models/slow/ready")[0] == 503
    status, meta = get(srv, "/v2/models/slow")
    assert status == 503 and "is being loaded" in meta["error"], meta  # type: ignore[index]
    thread.join(60)
    took = time.monotonic() - started
    status, body = answer["load"]
    assert status == 503, body
    message = json.loads(body)["error"]
    assert f"--load-timeout {LOAD_TIMEOUT:g}s" in message and "'slow'" in message
    assert LOAD_TIMEOUT <= took < LOAD_TIMEOUT + 5
    # Known, not ready; the index gives the reason.
    assert request(srv, "GET", "/v2/models/slow/ready")[0] == 503
    index = json.loads(post(srv, "/v2/repository/index")[1])
    assert any(e["name"] == "slow" and "--load-timeout" in e["reason"] for e in index), index
    # The session the worker went on creating is unloaded once it exists.
    assert wait_for(lambda: "abandoned at the load timeout is unloaded" in srv.log, 90)
    hardware = get(srv, "/v2/hardware")[1]
    instances = [i for d in hardware["devices"].values() for i in d["instances"]]  # type: ignore[union-attr]
    assert {i["model"] for i in instances} == {"identity_fp32"}
    fp32_infer(srv, "identity_fp32")
    # A reload that times out leaves the loaded version serving.
    slow_file = (srv_root(srv) / "slow" / "1" / "model.onnx").read_bytes()
    status, body = post(
        srv,
        "/v2/repository/models/identity_fp32/load",
        {"parameters": {"config": "{}", "file:1/model.onnx": b64(slow_file)}},
    )
    assert status == 503, body
    fp32_infer(srv, "identity_fp32")
    assert wait_for(lambda: srv.log.count("abandoned at the load timeout is unloaded") >= 2, 90)
    assert not [p for p in UPLOADS.findall(srv.log) if Path(p).exists()]


def srv_root(srv: ServerProcess) -> Path:
    return Path(srv.command[srv.command.index("--model-repository") + 1])


def test_a_version_is_its_number_and_one_unloaded_stays_listed(
    srv: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    """As Triton: version "01" is version 1 (404 here before), an empty version is a 400 on
    the statistics route as on every other, and a version unloaded on its own is listed by
    the index as unloaded (it vanished from it). All found by fuzzing."""
    http.load_model("versioned")
    try:
        for route in ("ready", "config", "stats"):
            status, _, body = request(srv, "GET", f"/v2/models/versioned/versions/01/{route}")
            assert status == 200, (route, body)
            status, _, body = request(srv, "GET", f"/v2/models/versioned/versions//{route}")
            assert status == 400 and b"version string ''" in body, (route, body)
        assert http.get_model_metadata("versioned", "002")["name"] == "versioned"
        assert post(srv, "/v2/repository/models/versioned/versions/1/unload")[0] == 200
        index = [e for e in http.get_model_repository_index() if e["name"] == "versioned"]
        assert sorted((e["version"], e["state"], e["reason"]) for e in index) == [
            ("1", "UNAVAILABLE", "unloaded"),
            ("2", "READY", ""),
        ]
    finally:
        http.unload_model("versioned")
