"""The statistics extension and ``/metrics``, end to end, with tritonclient and a scraper.

Counts are compared as differences (before/after) on the shared session server,
so the tests hold whatever ran before them.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.support.cli import run_serve
from tests.support.http import request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

DURATION_KEYS = {"count", "ns"}
INFERENCE_STATS_KEYS = [
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
]
MODEL_STAT_KEYS = [
    "name",
    "version",
    "last_inference",
    "inference_count",
    "execution_count",
    "inference_stats",
    "response_stats",
    "batch_stats",
    "memory_usage",
]
COUNTERS = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
]


@pytest.fixture(scope="module")
def http_client(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.host_port)


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        yield client


def _simple_inputs(module: object, batch: int) -> list[object]:
    data = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [batch, 16], "INT32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def _one(stats: dict, name: str, version: str) -> dict:
    found = [s for s in stats["model_stats"] if (s["name"], s["version"]) == (name, version)]
    assert len(found) == 1, stats
    return found[0]


def _count(entry: dict, key: str) -> int:
    return entry["inference_stats"][key]["count"]


def _batch_count(entry: dict, size: int) -> int:
    for row in entry["batch_stats"]:
        if row["batch_size"] == size:
            return row["compute_infer"]["count"]
    return 0


def scrape(server: ServerProcess) -> tuple[str, dict[tuple[str, tuple], float]]:
    """The raw page and {(sample name, sorted labels): value}, parsed by prometheus_client."""
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/plain")
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return text, samples


def metric(samples: dict, name: str, model: str, version: str = "1", **extra: str) -> float:
    # NOTE: prometheus_client's parser names counter samples <name>_total; the raw text
    #   is checked for the exact names separately.
    labels = tuple(sorted({"model": model, "version": version, **extra}.items()))
    for candidate in (name, name + "_total"):
        if (candidate, labels) in samples:
            return samples[(candidate, labels)]
    raise KeyError(f"{name}{dict(labels)} not scraped")


def test_http_statistics_count_requests_and_failures(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    before = _one(http_client.get_inference_statistics("simple"), "simple", "1")
    started_ms = time.time() * 1000
    for _ in range(3):
        http_client.infer("simple", _simple_inputs(httpclient, 2))
    http_client.infer("simple", _simple_inputs(httpclient, 1))
    with pytest.raises(InferenceServerException):  # a shape the model refuses: validation
        bad = httpclient.InferInput("INPUT0", [1, 3], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.int32))
        http_client.infer("simple", [bad, _simple_inputs(httpclient, 1)[1]])
    after_all = http_client.get_inference_statistics("simple")
    assert len(after_all["model_stats"]) == 1
    after = _one(after_all, "simple", "1")

    assert list(after) == MODEL_STAT_KEYS
    assert list(after["inference_stats"]) == INFERENCE_STATS_KEYS
    for value in after["inference_stats"].values():
        assert set(value) == DURATION_KEYS
    assert after["response_stats"] == {} and after["memory_usage"] == []
    assert after["last_inference"] >= started_ms - 1000
    assert after["inference_count"] - before["inference_count"] == 7
    assert after["execution_count"] - before["execution_count"] == 4
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert _count(after, key) - _count(before, key) == 4, key
        assert after["inference_stats"][key]["ns"] > before["inference_stats"][key]["ns"], key
    assert _count(after, "fail") - _count(before, "fail") == 1
    assert _batch_count(after, 2) - _batch_count(before, 2) == 3
    assert _batch_count(after, 1) - _batch_count(before, 1) == 1
    assert after["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
    # The request's whole time holds its phases.
    stats = after["inference_stats"]
    phases = sum(stats[k]["ns"] for k in ("queue", "compute_input", "compute_infer"))
    assert stats["success"]["ns"] > phases


def test_grpc_statistics_match_requests(grpc_client: grpcclient.InferenceServerClient) -> None:
    before = grpc_client.get_inference_statistics("simple", "1", as_json=True)
    for _ in range(2):
        grpc_client.infer("simple", _simple_inputs(grpcclient, 3))
    with pytest.raises(InferenceServerException):
        grpc_client.infer("simple", _simple_inputs(grpcclient, 9))  # over max_batch_size 8
    proto = grpc_client.get_inference_statistics("simple", "1")
    assert len(proto.model_stats) == 1
    entry = proto.model_stats[0]
    assert (entry.name, entry.version) == ("simple", "1")
    old = before["model_stats"][0]
    # as_json renders uint64 as strings (protobuf's JSON mapping).
    assert entry.inference_count - int(old["inference_count"]) == 6
    assert entry.execution_count - int(old["execution_count"]) == 2
    assert (
        entry.inference_stats.success.count - int(old["inference_stats"]["success"]["count"]) == 2
    )
    assert entry.inference_stats.fail.count - int(old["inference_stats"]["fail"]["count"]) == 1
    assert {b.batch_size for b in entry.batch_stats} >= {3}


def test_backend_refusal_counts_as_backend(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    _, before = scrape(server)
    data = httpclient.InferInput("DATA", [6], "FP32")
    data.set_data_from_numpy(np.arange(6, dtype=np.float32))
    shape = httpclient.InferInput("SHAPE", [2], "INT64")
    shape.set_data_from_numpy(np.array([4, 4], dtype=np.int64))
    with pytest.raises(InferenceServerException, match="reshape"):
        http_client.infer("reshape", [data, shape])
    _, after = scrape(server)
    failure = "nv_inference_request_failure"
    for reason, moved in (("BACKEND", 1), ("OTHER", 0), ("REJECTED", 0), ("CANCELED", 0)):
        delta = metric(after, failure, "reshape", reason=reason) - metric(
            before, failure, "reshape", reason=reason
        )
        assert delta == moved, reason
    stats = _one(http_client.get_inference_statistics("reshape"), "reshape", "1")
    assert _count(stats, "fail") >= 1


def test_unknown_model_or_version_is_not_found(
    server: ServerProcess,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    for path in ("/v2/models/nope/stats", "/v2/models/simple/versions/9/stats"):
        status, _, body = request(server, "GET", path)
        assert status == 404 and "error" in json.loads(body), path
    with pytest.raises(InferenceServerException, match="nope"):
        http_client.get_inference_statistics("nope")
    with pytest.raises(InferenceServerException) as info:
        grpc_client.get_inference_statistics("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_all_models_are_listed_once_with_string_versions(
    http_client: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    listing = http_client.get_inference_statistics()["model_stats"]
    pairs = [(s["name"], s["version"]) for s in listing]
    assert len(pairs) == len(set(pairs))
    assert {("simple", "1"), ("versioned", "1"), ("versioned", "2")} <= set(pairs)
    assert all(isinstance(version, str) for _, version in pairs)
    versioned = http_client.get_inference_statistics("versioned")["model_stats"]
    assert [s["version"] for s in versioned] == ["1", "2"]
    one = http_client.get_inference_statistics("versioned", "2")["model_stats"]
    assert [s["version"] for s in one] == ["2"]
    assert len(grpc_client.get_inference_statistics().model_stats) == len(listing)


def test_metrics_have_triton_names_and_move_with_requests(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    text, before = scrape(server)
    for name in COUNTERS:
        assert f"# TYPE {name} counter\n" in text, name
    assert "# TYPE nv_inference_pending_request_count gauge\n" in text
    assert 'nv_inference_request_success{model="simple",version="1"} ' in text
    assert "# TYPE nv_cpu_utilization gauge\n" in text
    assert "\nnv_cpu_memory_total_bytes " in text and "\nnv_cpu_memory_used_bytes " in text
    assert "\nprocess_resident_memory_bytes " in text
    assert "_total{model=" not in text  # Triton's names, not prometheus_client's

    for _ in range(2):
        http_client.infer("simple", _simple_inputs(httpclient, 4))
    with pytest.raises(InferenceServerException):
        http_client.infer("simple", _simple_inputs(httpclient, 1)[:1])  # INPUT1 missing
    stats = _one(http_client.get_inference_statistics("simple"), "simple", "1")
    _, after = scrape(server)

    def moved(name: str, **labels: str) -> float:
        return metric(after, name, "simple", **labels) - metric(before, name, "simple", **labels)

    assert moved("nv_inference_request_success") == 2
    assert moved("nv_inference_count") == 8
    assert moved("nv_inference_exec_count") == 2
    assert moved("nv_inference_request_failure", reason="OTHER") == 1
    assert moved("nv_inference_request_failure", reason="BACKEND") == 0
    assert moved("nv_inference_request_duration_us") > 0
    assert metric(after, "nv_inference_pending_request_count", "simple") == 0
    # µs in /metrics are the statistics' ns (nothing ran between the two reads).
    inference = stats["inference_stats"]
    for name, key in (
        ("nv_inference_request_duration_us", "success"),
        ("nv_inference_queue_duration_us", "queue"),
        ("nv_inference_compute_input_duration_us", "compute_input"),
        ("nv_inference_compute_infer_duration_us", "compute_infer"),
        ("nv_inference_compute_output_duration_us", "compute_output"),
    ):
        assert metric(after, name, "simple") == inference[key]["ns"] // 1000, name
    assert metric(after, "nv_inference_request_success", "simple") == inference["success"]["count"]


def test_metrics_answer_only_get_on_metrics(server: ServerProcess) -> None:
    req = urllib.request.Request(server.metrics_url + "/metrics", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 405
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.metrics_url + "/v2", timeout=10)
    assert info.value.code == 404


def test_metrics_port_in_use_fails_start_up() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_serve(
            "--metrics-port",
            str(port),
        )
    assert result.returncode == 3
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_only_ready_versions_and_fake_gpus(tmp_path: Path) -> None:
    """Version 1 of ``versioned`` is broken: listed nowhere, 503 by name; GPUs from the file."""
    repository = tmp_path / "repo"
    repository.mkdir()
    shutil.copytree(SAMPLE_REPOSITORY / "versioned", repository / "versioned")
    (repository / "versioned" / "1" / "model.onnx").write_bytes(b"not a model")
    inventory = tmp_path / "inventory.json"
    gpus = [
        {"uuid": "GPU-a", "memory_total": 1000, "memory_free": 600, "utilization": 25},
        {"uuid": 'GPU-"b"', "memory_total": 2000, "memory_free": 2000},
    ]
    inventory.write_text(json.dumps({"gpus": gpus}))
    args = ["--devices", "cpu", "--hardware-inventory", str(inventory)]
    server = ServerProcess(repository, args).wait_ready()
    try:
        client = httpclient.InferenceServerClient(server.host_port)
        listing = client.get_inference_statistics()["model_stats"]
        assert [(s["name"], s["version"]) for s in listing] == [("versioned", "2")]
        assert [
            s["version"] for s in client.get_inference_statistics("versioned")["model_stats"]
        ] == ["2"]
        status, _, _ = request(server, "GET", "/v2/models/versioned/versions/1/stats")
        assert status == 503
        text, samples = scrape(server)
        assert 'model="versioned",version="1"' not in text
        assert samples[("nv_gpu_utilization", (("gpu_uuid", "GPU-a"),))] == 0.25
        assert samples[("nv_gpu_memory_used_bytes", (("gpu_uuid", "GPU-a"),))] == 400
        assert samples[("nv_gpu_memory_total_bytes", (("gpu_uuid", 'GPU-"b"'),))] == 2000
        assert 'nv_gpu_memory_total_bytes{gpu_uuid="GPU-\\"b\\""} 2000' in text
    finally:
        assert server.stop() == 0, server.log


def test_allow_metrics_false_serves_no_metrics_port(tmp_path: Path) -> None:
    shutil.copytree(SAMPLE_REPOSITORY / "simple", tmp_path / "simple")
    server = ServerProcess(tmp_path, ["--allow-metrics", "false"]).wait_ready()
    try:
        assert server.metrics_url == ""
        ready = [line for line in server.lines if "ready http://" in line]
        assert ready and "metrics=" not in ready[0]
        client = httpclient.InferenceServerClient(server.host_port)
        assert client.get_inference_statistics("simple")["model_stats"]  # statistics stay on
    finally:
        assert server.stop() == 0, server.log
