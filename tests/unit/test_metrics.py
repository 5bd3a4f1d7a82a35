"""The Prometheus exposition, the families it renders and the metrics app."""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families

from hardware import CpuInfo, GpuInfo, Inventory
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.telemetry.metrics import MetricsApp, Scraper
from oipserve.telemetry.metrics.exposition import Family, escape_label_value, format_value, render
from oipserve.telemetry.metrics.families import host_families, model_families
from oipserve.telemetry.stats import FailureReason, ModelStats, StatsRegistry


def test_render_keeps_counter_names_and_escapes_labels() -> None:
    family = Family("nv_inference_request_success", "counter", "help with \\ and\nnewline")
    family.add((("model", 'a"b\\c\nd'), ("version", "1")), 3)
    gauge = Family("nv_cpu_utilization", "gauge", "CPU")
    gauge.add((), 0.25)
    text = render([family, gauge])
    assert text.splitlines() == [
        "# HELP nv_inference_request_success help with \\\\ and\\nnewline",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="a\\"b\\\\c\\nd",version="1"} 3',
        "# HELP nv_cpu_utilization CPU",
        "# TYPE nv_cpu_utilization gauge",
        "nv_cpu_utilization 0.25",
    ]
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    counter = parsed["nv_inference_request_success"]
    assert counter.type == "counter"
    assert counter.samples[0].labels == {"model": 'a"b\\c\nd', "version": "1"}
    assert counter.samples[0].value == 3
    assert parsed["nv_cpu_utilization"].samples[0].value == 0.25


def test_values_and_escaping() -> None:
    assert format_value(12345678901234567890) == "12345678901234567890"
    assert format_value(0.5) == "0.5"
    assert format_value(float("inf")) == "+Inf"
    assert format_value(float("-inf")) == "-Inf"
    assert format_value(float("nan")) == "NaN"
    assert escape_label_value("plain") == "plain"


def test_model_families_are_the_statistics_in_microseconds() -> None:
    stats = ModelStats("m", "2")
    stats.executed(4, 1_500, 2_500, 3_999)
    stats.request_succeeded(4, 10_999, 1_001, 1_500, 2_500, 3_999)
    stats.request_failed(FailureReason.REJECTED, 7)
    stats.pending = 5
    families = {f.name: f for f in model_families([stats])}
    labels = (("model", "m"), ("version", "2"))

    def value(name: str) -> int | float:
        [(got, number)] = families[name].samples
        assert got == labels
        return number

    assert value("nv_inference_request_success") == 1
    assert value("nv_inference_count") == 4
    assert value("nv_inference_exec_count") == 1
    assert value("nv_inference_request_duration_us") == 10
    assert value("nv_inference_queue_duration_us") == 1
    assert value("nv_inference_compute_input_duration_us") == 1
    assert value("nv_inference_compute_infer_duration_us") == 2
    assert value("nv_inference_compute_output_duration_us") == 3
    assert value("nv_inference_pending_request_count") == 5
    assert families["nv_inference_pending_request_count"].type == "gauge"
    failures = dict(families["nv_inference_request_failure"].samples)
    assert failures == {
        (*labels, ("reason", "REJECTED")): 1,
        (*labels, ("reason", "CANCELED")): 0,
        (*labels, ("reason", "BACKEND")): 0,
        (*labels, ("reason", "OTHER")): 0,
    }
    counters = [f.type for n, f in families.items() if n != "nv_inference_pending_request_count"]
    assert counters == ["counter"] * 9


def _inventory(*gpus: GpuInfo) -> Inventory:
    cpu = CpuInfo("cpu", 2, 4, memory_total=1000, memory_available=250, usable_cores=4)
    return Inventory(cpu=cpu, gpus=gpus)


def test_host_families() -> None:
    assert [f.name for f in host_families(_inventory(), 0.5)] == [
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
    ]
    gpus = (
        GpuInfo(0, "A", "GPU-0", 100, 40, 50, "d", "c"),
        GpuInfo(1, "B", "GPU-1", 200, 200, None, "d", "c"),
    )
    families = {f.name: f for f in host_families(_inventory(*gpus), 0.5)}
    assert families["nv_cpu_memory_used_bytes"].samples == [((), 750)]
    assert families["nv_gpu_utilization"].samples == [((("gpu_uuid", "GPU-0"),), 0.5)]
    assert families["nv_gpu_memory_used_bytes"].samples == [
        ((("gpu_uuid", "GPU-0"),), 60),
        ((("gpu_uuid", "GPU-1"),), 0),
    ]
    assert families["nv_gpu_memory_total_bytes"].samples[1] == ((("gpu_uuid", "GPU-1"),), 200)


class _Inventory:
    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> Inventory:
        self.reads += 1
        return _inventory()


def _call(app: MetricsApp, method: str, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path}
    asyncio.run(app(scope, None, send))
    start, body = sent
    return start["status"], dict(start["headers"]), body["body"]


def test_app_serves_get_metrics_only() -> None:
    registry = ModelRegistry()
    model = ModelVersion("m", "1", "/nowhere", None)
    model.state = "READY"
    registry.models["m"] = {"1": model}
    stats = StatsRegistry(registry)
    stats.of(model).request_succeeded(1, 2000, 0, 0, 0, 0)
    inventory = _Inventory()
    app = MetricsApp(Scraper(stats, inventory))

    status, headers, body = _call(app, "GET", "/metrics")
    assert status == 200 and headers[b"content-type"].startswith(b"text/plain")
    assert int(headers[b"content-length"]) == len(body)
    text = body.decode()
    assert 'nv_inference_request_success{model="m",version="1"} 1\n' in text
    assert 'nv_inference_request_duration_us{model="m",version="1"} 2\n' in text
    assert "\nnv_cpu_memory_used_bytes 750\n" in text
    assert "process_cpu_seconds_total" in text
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {"nv_inference_request_success", "nv_cpu_utilization", "process_cpu_seconds"} <= families
    _call(app, "GET", "/metrics")
    assert inventory.reads == 1  # the hardware is read at most every HOST_INTERVAL

    for method, path, status in (("POST", "/metrics", 405), ("PUT", "/x", 405), ("GET", "/", 404)):
        answer, headers, body = _call(app, method, path)
        assert answer == status and headers[b"content-type"] == b"application/json"
        assert set(json.loads(body)) == {"error"}, body
    assert _call(app, "POST", "/metrics")[1][b"allow"] == b"GET"
