"""Management over real HTTP: /v2/hardware, /v2/workers (AMD naming), /v2/repository, lifecycle.

One server for the module: a fake two-GPU inventory (so placement and CUDA
provider options can be checked on a CPU-only machine), explicit model control
with only ``simple`` loaded at start, on a private copy of a few sample models
so tests can add and break models on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.cli import run_serve
from tests.support.http import fp32_infer, get, post, request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, wait_for

H100 = "NVIDIA H100 80GB HBM3"
INVENTORY = {
    "gpus": [
        {"index": 0, "name": H100, "memory_total": 85_899_345_920, "memory_free": 10_000_000_000},
        {"index": 1, "name": H100, "memory_total": 85_899_345_920, "memory_free": 80_000_000_000},
    ]
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for name in ("simple", "identity_fp32", "versioned"):
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
    return root


@pytest.fixture(scope="module")
def srv(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    inventory = tmp_path_factory.mktemp("hw") / "inventory.json"
    inventory.write_text(json.dumps(INVENTORY))
    args = [
        "--devices",
        "cpu",
        "--hardware-inventory",
        str(inventory),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "simple",
    ]
    proc = ServerProcess(repo, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log, proc.log


def load_worker(srv: ServerProcess, worker: str, params: object) -> str:
    status, body = post(srv, f"/v2/workers/{worker}/load", params)
    assert status == 200, body
    return body.decode()


def served(srv: ServerProcess) -> list[str]:
    status, body = get(srv, "/v2/models")
    assert status == 200
    return body["models"]  # type: ignore[index]


# ---- start mode -------------------------------------------------------------


def test_explicit_mode_loads_only_named_models(srv: ServerProcess) -> None:
    assert served(srv) == ["simple"]
    status, _, body = request(srv, "GET", "/v2/health/ready")
    assert status == 200, body
    status, body = get(srv, "/v2/models/identity_fp32")
    assert status == 404 and "identity_fp32" in body["error"]  # type: ignore[index]
    status, payload = post(srv, "/v2/repository/index")
    assert status == 200
    index = {(e["name"], e.get("version")): e for e in json.loads(payload)}
    assert index[("simple", "1")]["state"] == "READY"
    # Never loaded: the name alone, once, whatever its versions (Triton's index).
    assert index[("identity_fp32", None)] == {"name": "identity_fp32"}
    assert index[("versioned", None)] == {"name": "versioned"}
    assert [e["name"] for e in json.loads(payload)].count("versioned") == 1
    status, payload = post(srv, "/v2/repository/index", {"ready": True})
    assert [e["name"] for e in json.loads(payload)] == ["simple"]
    assert post(srv, "/v2/repository/index", {"ready": 1})[0] == 400


# ---- hardware ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"name": "gpu", "num": 2}, 200),
        ({"name": "gpu", "num": 3}, 404),
        ({"name": "cuda"}, 200),
        ({"name": "cuda:1"}, 200),
        ({"name": "cuda:2"}, 404),
        ({"name": H100, "num": 2}, 200),
        ({"name": "h100 80gb hbm3"}, 200),
        ({"name": "H100"}, 404),
        ({"name": "cpu"}, 200),
        ({"num": 1}, 404),
    ],
)
def test_has_hardware(srv: ServerProcess, body: dict, status: int) -> None:
    assert post(srv, "/v2/hardware", body) == (status, b"")


@pytest.mark.parametrize("body", [None, "", "not json", "[1]", '{"name": "gpu", "num": "2"}'])
def test_has_hardware_bad_body(srv: ServerProcess, body: str | None) -> None:
    status, payload = post(srv, "/v2/hardware", body)
    assert status == 400 and json.loads(payload)["error"]


def test_hardware_inventory_lists_devices_workers_and_models(srv: ServerProcess) -> None:
    status, doc = get(srv, "/v2/hardware")
    assert status == 200
    devices = doc["devices"]  # type: ignore[index]
    assert set(devices) == {"cpu", "cuda:0", "cuda:1"}
    assert doc["simulated"] is True  # type: ignore[index]
    assert devices["cuda:1"]["name"] == H100
    cpu = devices["cpu"]
    assert "simple" in cpu["models"]
    assert cpu["workers"] and cpu["workers"][0]["alive"] and cpu["memory_in_use"] > 0
    simple = [i for i in cpu["instances"] if i["model"] == "simple"]
    assert simple[0]["providers"] == [["CPUExecutionProvider", {}]]


# ---- worker endpoints: naming, share, unload ----------------------------------


def test_echo_naming_share_and_unload(srv: ServerProcess) -> None:
    assert load_worker(srv, "Echo", {}) == "echo"
    assert load_worker(srv, "echo", {}) == "echo"  # same parameters: same endpoint
    assert load_worker(srv, "echo", {"share": False}) == "echo"  # one more instance
    assert load_worker(srv, "echo", {"a": 1}) == "echo-0"
    assert load_worker(srv, "echo", {"a": 1.0}) == "echo-1"  # 1 != 1.0
    assert load_worker(srv, "echo", {"a": True}) == "echo-2"
    assert load_worker(srv, "echo", {"a": 1, "share": True}) == "echo-0"
    assert get(srv, "/v2/workers/echo")[1]["instances"] == 2  # type: ignore[index]
    # its config says what its metadata says (it read onnxruntime_onnx; found by fuzzing)
    config = get(srv, "/v2/models/echo/config")[1]
    assert (config["platform"], config["backend"]) == ("echo", "")  # type: ignore[index]
    assert {"echo", "echo-0", "echo-1", "echo-2"} <= set(served(srv))

    client = httpclient.InferenceServerClient(srv.host_port)
    assert client.is_model_ready("echo-1")
    a = httpclient.InferInput("A", [2, 2], "INT64")
    a.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.int64))
    s = httpclient.InferInput("S", [1], "BYTES")
    s.set_data_from_numpy(np.array([b"hi"], dtype=object), binary_data=True)
    result = client.infer("echo-1", [a, s])
    assert result.as_numpy("A").tolist() == [[1, 2], [3, 4]]
    assert result.as_numpy("S").tolist() == [b"hi"]
    assert get(srv, "/v2/models/echo")[1]["platform"] == "echo"  # type: ignore[index]

    # Two instances: the first unload leaves it serving, the second removes it.
    assert post(srv, "/v2/workers/ECHO/unload") == (200, b"")
    assert client.is_model_ready("echo")
    assert post(srv, "/v2/workers/echo/unload") == (200, b"")
    status, body = get(srv, "/v2/models/echo")
    assert status == 404 and "echo" in body["error"]  # type: ignore[index]
    assert post(srv, "/v2/workers/echo/unload") == (200, b"")  # double unload: no-op
    assert post(srv, "/v2/workers/never-loaded/unload") == (200, b"")
    # Other endpoints of "echo" live on, so the original parameters get a new name.
    assert load_worker(srv, "echo", {}) == "echo-3"
    for name in ("echo-0", "echo-1", "echo-2", "echo-3"):
        assert post(srv, f"/v2/workers/{name}/unload")[0] == 200
    assert not any(n.startswith("echo") for n in served(srv))
    # Every endpoint of "echo" gone: naming starts over.
    assert load_worker(srv, "echo", {"b": "x"}) == "echo"
    assert post(srv, "/v2/repository/models/echo/unload")[0] == 200  # same as worker unload
    assert "echo" not in served(srv)


@pytest.mark.parametrize(
    ("worker", "params", "message"),
    [
        ("tensorflow", {"model": "simple"}, "unknown worker"),
        ("onnxruntime", {}, "No model specified"),
        ("onnxruntime", {"model": ["simple"]}, "parameter 'model'"),
        ("onnxruntime", {"model": "simple", "x": {"a": 1}}, "parameter 'x'"),
        ("onnxruntime", {"model": "simple", "x": None}, "parameter 'x'"),
        ("onnxruntime", {"model": "simple", "device": "cuda:7"}, "cuda:7"),
        ("onnxruntime", {"model": "simple", "device": "tpu"}, "tpu"),
        ("onnxruntime", {"model": "missing"}, "missing"),
        ("onnxruntime", {"model": "../escape.onnx"}, "outside"),
        ("onnxruntime", {"model": "simple", "version": "9"}, "no version '9'"),
        ("onnxruntime", {"model": "simple", "instances": 0}, "instances"),
        ("onnxruntime", {"model": "simple", "gpu_mem_limit": "lots"}, "gpu_mem_limit"),
        ("onnxruntime", {"model": "simple", "share": "no"}, "share"),
        ("echo", {"worker": "x"}, "worker"),
    ],
)
def test_worker_load_errors_leave_nothing_behind(
    srv: ServerProcess, worker: str, params: dict, message: str
) -> None:
    status, body = post(srv, f"/v2/workers/{worker}/load", params)
    assert status == 400, body
    assert message in json.loads(body)["error"]
    assert not any(n.startswith(("onnxruntime", "tensorflow")) for n in served(srv))


def test_worker_load_bad_body(srv: ServerProcess) -> None:
    for body in ("not json", "[1, 2]"):
        status, payload = post(srv, "/v2/workers/echo/load", body)
        assert status == 400 and json.loads(payload)["error"]


def test_failed_load_then_bare_name(srv: ServerProcess) -> None:
    assert post(srv, "/v2/workers/onnxruntime/load", {"model": "nope"})[0] == 400
    name = load_worker(srv, "onnxruntime", {"model": "identity_fp32", "device": "cpu"})
    assert name == "onnxruntime"
    fp32_infer(srv, "onnxruntime")
    assert load_worker(srv, "onnxruntime", {"model": "identity_fp32/1/model.onnx"}) == (
        "onnxruntime-0"
    )
    fp32_infer(srv, "onnxruntime-0")
    meta = get(srv, "/v2/models/onnxruntime")[1]
    assert meta["inputs"][0]["name"] == "INPUT0"  # type: ignore[index]
    for name in ("onnxruntime", "onnxruntime-0"):
        assert post(srv, f"/v2/workers/{name}/unload")[0] == 200
        assert get(srv, f"/v2/models/{name}")[0] == 404


# ---- placement on the fake two-GPU node ---------------------------------------


def test_placement_and_provider_options(srv: ServerProcess) -> None:
    # auto: the GPU with the most free memory (cuda:1 in the fake inventory).
    auto = load_worker(srv, "onnxruntime", {"model": "identity_fp32", "device": "auto"})
    info = get(srv, f"/v2/workers/{auto}")[1]
    assert info["device"] == "cuda:1"  # type: ignore[index]
    (placement,) = info["placements"]  # type: ignore[index]
    assert placement["device"] == "cuda:1" and placement["simulated"] is True
    assert placement["providers"] == [
        ["CUDAExecutionProvider", {"device_id": "1"}],
        ["CPUExecutionProvider", {}],
    ]
    assert placement["session_providers"] == ["CPUExecutionProvider"]
    fp32_infer(srv, auto)

    params = {
        "model": "identity_fp32",
        "device": "cuda:0",
        "instances": 2,
        "gpu_mem_limit": 1048576,
        "arena_extend_strategy": "kSameAsRequested",
    }
    pinned = load_worker(srv, "onnxruntime", params)
    assert (auto, pinned) == ("onnxruntime", "onnxruntime-0")
    info = get(srv, f"/v2/workers/{pinned}")[1]
    placements = info["placements"]  # type: ignore[index]
    assert len(placements) == 2 and info["instances"] == 2  # type: ignore[index]
    assert len({p["worker"] for p in placements}) == 2, "one session per worker process"
    for p in placements:
        assert p["device"] == "cuda:0"
        assert p["providers"][0] == [
            "CUDAExecutionProvider",
            {
                "device_id": "0",
                "gpu_mem_limit": "1048576",
                "arena_extend_strategy": "kSameAsRequested",
            },
        ]
    assert load_worker(srv, "onnxruntime", {**params, "share": False}) == pinned
    assert get(srv, f"/v2/workers/{pinned}")[1]["instances"] == 3  # type: ignore[index]

    hw = get(srv, "/v2/hardware")[1]["devices"]  # type: ignore[index]
    assert hw["cuda:0"]["models"] == [pinned]
    assert len(hw["cuda:0"]["workers"]) == 3
    assert all(w["dedicated"] for w in hw["cuda:0"]["workers"])
    assert auto in hw["cuda:1"]["models"]
    assert {i["providers"][0][1]["device_id"] for i in hw["cuda:0"]["instances"]} == {"0"}
    for _ in range(3):
        fp32_infer(srv, pinned)

    for _ in range(3):
        assert post(srv, f"/v2/workers/{pinned}/unload")[0] == 200
    assert post(srv, f"/v2/workers/{auto}/unload")[0] == 200
    hw = get(srv, "/v2/hardware")[1]["devices"]  # type: ignore[index]
    assert hw["cuda:0"]["workers"] == [] and hw["cuda:1"]["workers"] == []


def test_killed_endpoint_worker_is_replaced_with_its_session(srv: ServerProcess) -> None:
    name = load_worker(srv, "onnxruntime", {"model": "identity_fp32", "device": "cuda:1"})
    hw = get(srv, "/v2/hardware")[1]["devices"]  # type: ignore[index]
    (worker,) = hw["cuda:1"]["workers"]
    os.kill(worker["pid"], signal.SIGKILL)
    client = httpclient.InferenceServerClient(srv.host_port)

    def replaced() -> bool:
        workers = get(srv, "/v2/hardware")[1]["devices"]["cuda:1"]["workers"]  # type: ignore[index]
        return bool(workers) and workers[0]["pid"] != worker["pid"] and workers[0]["alive"]

    assert wait_for(replaced, 60), srv.log
    assert wait_for(lambda: client.is_model_ready(name), 30)
    fp32_infer(srv, name)
    info = get(srv, f"/v2/workers/{name}")[1]
    assert info["placements"][0]["providers"][0][1] == {"device_id": "1"}  # type: ignore[index]
    assert post(srv, f"/v2/workers/{name}/unload")[0] == 200


def test_cpu_workers_threads_follow_the_usable_cores(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A pod limited to 6 of a node's 16 CPUs: the repository's CPU worker gets the 6, a
    dedicated endpoint worker half of them, not the node's 16 (or this machine's own)."""
    inventory = tmp_path_factory.mktemp("hw-usable") / "inventory.json"
    inventory.write_text(json.dumps({"cpu": {"logical_cores": 16, "usable_cores": 6}}))
    args = ["--devices", "cpu", "--hardware-inventory", str(inventory),
            "--instances-per-device", "1", "--model-control-mode", "explicit",
            "--load-model", "simple"]  # fmt: skip
    srv = ServerProcess(repo, args).wait_ready()
    try:
        # Two instances: the repository's worker takes one, a dedicated worker the other.
        name = load_worker(srv, "onnxruntime", {"model": "identity_fp32", "instances": 2})
        fp32_infer(srv, name)
        cpu = get(srv, "/v2/hardware")[1]["devices"]["cpu"]  # type: ignore[index]
        assert cpu["usable_cores"] == 6
        threads = {w["dedicated"]: w["threads"] for w in cpu["workers"]}
        assert threads == {False: 6, True: 3}, cpu["workers"]
    finally:
        assert srv.stop() == 0, srv.log


# ---- model repository -----------------------------------------------------------


def test_repository_load_unload_and_aliases(srv: ServerProcess, repo: Path) -> None:
    assert post(srv, "/v2/repository/models/versioned/load") == (200, b"")
    meta = get(srv, "/v2/models/versioned")[1]
    assert meta["versions"] == ["1", "2"]  # type: ignore[index]
    assert "versioned" in served(srv)
    # Unload one version, then the rest with the /v2/models alias.
    assert post(srv, "/v2/repository/models/versioned/versions/1/unload")[0] == 200
    assert get(srv, "/v2/models/versioned")[1]["versions"] == ["2"]  # type: ignore[index]
    assert get(srv, "/v2/models/versioned/versions/1")[0] == 404
    assert post(srv, "/v2/models/versioned/unload")[0] == 200
    status, body = get(srv, "/v2/models/versioned")
    assert status == 404 and "unloaded" in body["error"]  # type: ignore[index]
    assert post(srv, "/v2/models/versioned/unload")[0] == 200  # double unload
    index = json.loads(post(srv, "/v2/repository/index")[1])
    assert {e["state"] for e in index if e["name"] == "versioned"} == {"UNAVAILABLE"}
    assert post(srv, "/v2/models/versioned/load", {"parameters": {}})[0] == 200
    assert post(srv, "/v2/repository/models/versioned/versions/2/load")[0] == 200
    # A failed load is a 400 in Triton's words (its clients match "failed to load").
    status, body = post(srv, "/v2/repository/models/versioned/versions/7/load")
    assert status == 400
    assert json.loads(body)["error"].startswith("failed to load 'versioned': it has no version '7'")

    status, body = post(srv, "/v2/repository/models/nope/load")
    assert status == 400 and json.loads(body)["error"].startswith("failed to load 'nope': ")
    status, body = post(srv, "/v2/repository/models/versioned/load", "not json")
    assert status == 400

    # A model added to the directory after start is found by load.
    shutil.copytree(repo / "identity_fp32", repo / "fresh")
    index = json.loads(post(srv, "/v2/repository/index")[1])
    assert {"name": "fresh"} in index
    assert post(srv, "/v2/repository/models/fresh/load")[0] == 200
    fp32_infer(srv, "fresh")
    # A broken model: 400 with the reason.
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    status, body = post(srv, "/v2/repository/models/broken/load")
    assert status == 400 and "broken" in json.loads(body)["error"]
    assert "broken" not in served(srv)
    # Readiness depends only on start-up models.
    assert request(srv, "GET", "/v2/health/ready")[0] == 200


def test_reload_and_loads_under_concurrent_inference(srv: ServerProcess) -> None:
    assert post(srv, "/v2/repository/models/identity_fp32/load")[0] == 200
    results: list[object] = []
    stop = threading.Event()

    def hammer(model: str) -> None:
        client = httpclient.InferenceServerClient(srv.host_port, network_timeout=30)
        x = np.ones((1, 64), dtype=np.float32)
        while not stop.is_set():
            inp = httpclient.InferInput("INPUT0", [1, 64], "FP32")
            inp.set_data_from_numpy(x)
            try:
                ok = np.array_equal(client.infer(model, [inp]).as_numpy("OUTPUT0"), x)
                results.append(200 if ok else "wrong output")
            except Exception as exc:
                results.append(str(exc))

    threads = [threading.Thread(target=hammer, args=("identity_fp32",)) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        assert wait_for(lambda: len(results) > 5, 30)  # inference is under way
        for _ in range(4):  # each reload swaps in fresh sessions
            assert post(srv, "/v2/repository/models/identity_fp32/load")[0] == 200
        name = load_worker(srv, "onnxruntime", {"model": "simple", "device": "cpu"})
        assert post(srv, f"/v2/workers/{name}/unload")[0] == 200
        # A slow load (it starts a worker process) does not hold up inference elsewhere.
        before = len(results)
        name = load_worker(srv, "onnxruntime", {"model": "simple", "device": "cuda:0"})
        assert len(results) > before + 3
        assert post(srv, f"/v2/workers/{name}/unload")[0] == 200
        count = len(results)
        assert wait_for(lambda: len(results) > count + 3, 30)  # and goes on after the unload
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert len(results) > 20
    assert all(r == 200 for r in results), [r for r in results if r != 200][:3]


def test_unload_under_load_finishes_in_flight_then_404(srv: ServerProcess) -> None:
    name = load_worker(srv, "onnxruntime", {"model": "identity_fp32", "device": "cpu", "k": 1})
    #: (monotonic time the request was sent, outcome) for every request
    results: list[tuple[float, object]] = []
    stop = threading.Event()

    def hammer() -> None:
        # NOTE: closed by the with, in the thread that used it: a failed infer leaves this
        #   frame in a cycle, and a client left to the collector may be closed in another
        #   thread, where tritonclient's HTTP client fails (gevent).
        with httpclient.InferenceServerClient(srv.host_port, network_timeout=30) as client:
            x = np.ones((1, 200_000), dtype=np.float32)
            while not stop.is_set():
                inp = httpclient.InferInput("INPUT0", [1, x.shape[1]], "FP32")
                inp.set_data_from_numpy(x)
                sent = time.monotonic()
                try:
                    client.infer(name, [inp])
                    results.append((sent, 200))
                except Exception as exc:
                    results.append((sent, str(exc)))

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        assert wait_for(lambda: len(results) > 5, 30)
        assert post(srv, f"/v2/workers/{name}/unload")[0] == 200
        unloaded = time.monotonic()
        count = len(results)
        assert wait_for(lambda: len(results) > count + 3, 30)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    outcomes = [outcome for _, outcome in results]
    assert outcomes[0] == 200
    errors = [r for r in outcomes if r != 200]
    # Requests in flight at the unload finished (200) or, if the unload overtook them
    # between their model lookup and their dispatch, got a retryable 503; none failed
    # any other way.
    in_flight = [
        outcome
        for sent, outcome in results
        if sent <= unloaded and "[503]" in str(outcome) and "while this request" in str(outcome)
    ]
    gone = [e for e in errors if "[404]" in str(e) and name in str(e)]
    assert errors and len(gone) + len(in_flight) == len(errors), errors[:3]
    # Every request sent after the unload answered is a 404.
    late = [outcome for sent, outcome in results if sent > unloaded]
    assert late and all(outcome != 200 for outcome in late), late[:3]


def test_unknown_load_model_stops_start_up() -> None:
    result = run_serve(
        "--model-control-mode",
        "explicit",
        "--load-model",
        "simple,zzz",
    )
    assert result.returncode != 0 and "zzz" in result.stderr


def test_management_bodies_that_are_not_json_objects_are_400(srv: ServerProcess) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/v2/hardware", "/v2/workers/onnxruntime/load", "/v2/repository/index"):
        for body in (deep, b"{", b"[1]"):
            status, payload = post(srv, path, body)
            assert status == 400, (path, body[:10], payload)
            assert set(json.loads(payload)) == {"error"}


#: Load configs that once reached an internal error (found by fuzzing): a number no enum
#: value has, where protobuf's parsers take any (proto3's open enums); a queue delay whose
#: nanoseconds overflowed the message to the other front (a 500, and that front lost); and
#: a lone UTF-16 surrogate echoed in the message (its JSON body, or its gRPC status, could
#: not be written).
ODD_CONFIGS = {
    "datatype number": (
        {"input": [{"name": "INPUT0", "data_type": 99, "dims": [-1]}]},
        "input[0].data_type: 99 is not a value of DataType",
    ),
    "instance group kind": ({"instance_group": [{"kind": 7}]}, "kind: 7 is not a value of Kind"),
    "timeout action": (
        {"dynamic_batching": {"default_queue_policy": {"timeout_action": 9}}},
        "timeout_action: 9 is not a value of TimeoutAction",
    ),
    "queue delay past int64 nanoseconds": (
        {"dynamic_batching": {"max_queue_delay_microseconds": str(2**64 // 1000 + 1)}},
        "max_queue_delay_microseconds: 18446744073709552 is more than",
    ),
    "surrogate as a value": ('{"input": "\\ud800"}', "lone UTF-16 surrogate"),
    "surrogate as a key": ('{"\\ud800": 1}', "lone UTF-16 surrogate"),
}


@pytest.mark.parametrize("case", list(ODD_CONFIGS))
def test_odd_config_overrides_are_400_over_rest_and_grpc(srv: ServerProcess, case: str) -> None:
    config, fragment = ODD_CONFIGS[case]
    text = config if isinstance(config, str) else json.dumps(config)
    body = json.dumps({"parameters": {"config": text}})
    status, payload = post(srv, "/v2/repository/models/odd_config/load", body)
    assert status == 400, payload
    assert payload.startswith(b"{") and fragment in json.loads(payload)["error"], payload
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("odd_config", config=text, client_timeout=30)
    finally:
        client.close()
    assert "INVALID_ARGUMENT" in str(caught.value.status()), caught.value
    assert fragment in caught.value.message()


def test_an_error_echoing_a_lone_surrogate_is_still_a_json_400(srv: ServerProcess) -> None:
    # (the override's own check echoes the value: the error's text, not the parse, has it)
    body = json.dumps({"parameters": {"config": "{}", "file:\ud800": "AAAA"}})
    status, payload = post(srv, "/v2/repository/models/odd_config/load", body)
    assert status == 400 and set(json.loads(payload)) == {"error"}, payload
