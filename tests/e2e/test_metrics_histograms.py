"""``--metrics-config``: Triton's latency histograms and summaries, ``model_metrics`` buckets,
``nv_model_load_duration_secs``, read by prometheus_client's parser from a real server.

Counts are compared as differences (before/after) so the tests hold in any order.
"""

from __future__ import annotations

import http.client
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from oipserve.telemetry.latency import DEFAULT_BUCKETS, HISTOGRAM_FAMILIES, SUMMARY_FAMILIES
from tests.support.cli import run_serve
from tests.support.http import post
from tests.support.metrics import Page, scrape
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, socket_to_front
from tests.support.tensors import SIMPLE_JSON

#: The counter each histogram's ``_sum`` must equal (same phase, same microseconds).
COUNTERS = {
    "nv_inference_request_duration_histogram_us": "nv_inference_request_duration_us",
    "nv_inference_queue_duration_histogram_us": "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_histogram_us": "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_histogram_us": "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_histogram_us": (
        "nv_inference_compute_output_duration_us"
    ),
}
CUSTOM_BUCKETS = [50, 100, 250.5, 1000, 100000]
QUANTILES = "0.5:0.05,0.9:0.01,0.99:0.001"
N = 24

SIMPLE_BODY = json.dumps(SIMPLE_JSON)


def _copy_simple(root: Path, name: str, extra: str) -> None:
    shutil.copytree(SAMPLE_REPOSITORY / "simple", root / name)
    config = root / name / "config.pbtxt"
    text = config.read_text().replace('name: "simple"', f'name: "{name}"')
    config.write_text(text + extra)


def _bucket_config(family: str, buckets: str) -> str:
    return (
        "model_metrics { metric_control [ { metric_identifier { family: "
        f'"{family}" }} histogram_options {{ buckets: [ {buckets} ] }} }} ] }}\n'
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("metrics-repo")
    _copy_simple(root, "simple", "")
    request_family = HISTOGRAM_FAMILIES[0]
    _copy_simple(
        root, "custom", _bucket_config(request_family, ", ".join(map(str, CUSTOM_BUCKETS)))
    )
    _copy_simple(root, "broken", _bucket_config(request_family, "100, 50"))
    _copy_simple(root, "unknown_family", _bucket_config("nv_inference_made_up_us", "1"))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    args = [
        "--model-control-mode",
        "explicit",
        "--load-model",
        "simple,custom",
        "--metrics-config",
        "histogram_latencies=true",
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config",
        f"summary_quantiles={QUANTILES}",
    ]
    proc = ServerProcess(repository, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _infer(conn: http.client.HTTPConnection, model: str) -> None:
    conn.request("POST", f"/v2/models/{model}/infer", SIMPLE_BODY, {"Content-Type": "json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    response.read()


def _send(proc: ServerProcess, model: str, count: int) -> None:
    conn = http.client.HTTPConnection(proc.host_port, timeout=30)
    try:
        for _ in range(count):
            _infer(conn, model)
    finally:
        conn.close()


def _check_histograms(page: Page, model: str) -> None:
    """Cumulative buckets ending in +Inf == _count == successes; _sum == the counter."""
    successes = page.value("nv_inference_request_success", model)
    for family in HISTOGRAM_FAMILIES:
        assert page.types[family] == "histogram"
        buckets = page.buckets(family, model)
        counts = [count for _, count in buckets]
        assert counts == sorted(counts), (family, buckets)
        assert buckets[-1][0] == math.inf
        assert buckets[-1][1] == page.value(family + "_count", model) == successes
        assert page.value(family + "_sum", model) == page.value(COUNTERS[family], model)


def test_the_five_histograms_count_every_request(server: ServerProcess) -> None:
    before = scrape(server.metrics_url)
    _send(server, "simple", N)
    after = scrape(server.metrics_url)
    for family in HISTOGRAM_FAMILIES:
        moved = after.value(family + "_count", "simple") - before.value(family + "_count", "simple")
        assert moved == N, family
        assert [b for b, _ in after.buckets(family, "simple")] == [
            *DEFAULT_BUCKETS[family],
            math.inf,
        ]
    _check_histograms(after, "simple")
    # Triton writes whole bounds without a fraction: le="1000", not le="1000.0".
    assert 'le="1000"' in after.text and 'le="1000.0"' not in after.text


def test_model_metrics_buckets_replace_the_defaults_for_that_model(server: ServerProcess) -> None:
    _send(server, "custom", N)
    page = scrape(server.metrics_url)
    request_family, queue_family = HISTOGRAM_FAMILIES[0], HISTOGRAM_FAMILIES[1]
    assert [b for b, _ in page.buckets(request_family, "custom")] == [*CUSTOM_BUCKETS, math.inf]
    assert 'le="250.5"' in page.text
    # The other families of that model, and the same family of another, keep the defaults.
    assert [b for b, _ in page.buckets(queue_family, "custom")] == [
        *DEFAULT_BUCKETS[queue_family],
        math.inf,
    ]
    assert [b for b, _ in page.buckets(request_family, "simple")][0] == 1000
    _check_histograms(page, "custom")


def test_summaries_report_the_configured_quantiles(server: ServerProcess) -> None:
    before = scrape(server.metrics_url)
    _send(server, "simple", N)
    page = scrape(server.metrics_url)
    successes = page.value("nv_inference_request_success", "simple")
    for family in SUMMARY_FAMILIES:
        assert page.types[family] == "summary"
        moved = page.value(family + "_count", "simple") - before.value(family + "_count", "simple")
        assert moved == N, family
        for quantile in ("0.5", "0.9", "0.99"):
            value = page.value(family, "simple", quantile=quantile)
            assert math.isfinite(value) and value >= 0, (family, quantile)
        assert page.value(family + "_count", "simple") == successes
    # Ordered quantiles of one window: p50 <= p90 <= p99.
    family = SUMMARY_FAMILIES[0]
    values = [page.value(family, "simple", quantile=q) for q in ("0.5", "0.9", "0.99")]
    assert values == sorted(values)
    assert page.value(family + "_sum", "simple") == page.value(
        "nv_inference_request_duration_us", "simple"
    )
    assert 'quantile="0.95"' not in page.text  # only the configured ones


def test_load_duration_is_reported_per_loaded_version(server: ServerProcess) -> None:
    page = scrape(server.metrics_url)
    assert page.types["nv_model_load_duration_secs"] == "gauge"
    for model in ("simple", "custom"):
        assert 0 < page.value("nv_model_load_duration_secs", model) < 120
    assert not page.families_of("broken")  # not loaded: no series at all


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("broken", "histogram_options.buckets must increase strictly"),
        ("unknown_family", "'nv_inference_made_up_us' is not a histogram family"),
    ],
)
def test_a_malformed_model_metrics_is_refused_at_load(
    server: ServerProcess, model: str, reason: str
) -> None:
    status, body = post(server, f"/v2/repository/models/{model}/load")
    assert status == 400, body
    assert reason in json.loads(body)["error"]
    assert not scrape(server.metrics_url).families_of(model)


def test_histograms_and_summaries_are_off_by_default() -> None:
    proc = ServerProcess(args=["--model-control-mode", "explicit", "--load-model", "simple"])
    try:
        proc.wait_ready()
        _send(proc, "simple", 2)
        page = scrape(proc.metrics_url)
    finally:
        assert proc.stop() == 0, proc.log
    assert not set(HISTOGRAM_FAMILIES + SUMMARY_FAMILIES) & set(page.types)
    assert "_histogram_us" not in page.text and "_summary_us" not in page.text
    assert page.value("nv_inference_request_duration_us", "simple") > 0
    assert page.value("nv_model_load_duration_secs", "simple") > 0


def test_a_bad_metrics_config_stops_start_up_with_the_reason() -> None:
    result = run_serve("--metrics-config", "summary_quantiles=0.5")
    assert result.returncode == 2, result.stderr
    assert "summary_quantiles: '0.5' is not <quantile>:<error>" in result.stderr
    result = run_serve("--metrics-config", "histogram_latency=true")
    assert result.returncode == 2
    assert "unknown key 'histogram_latency'" in result.stderr


def test_histograms_of_every_http_front_add_up() -> None:
    proc = ServerProcess(
        args=[
            "--http-workers",
            "2",
            "--model-control-mode",
            "explicit",
            "--load-model",
            "simple",
            "--metrics-config",
            "histogram_latencies=true",
        ]
    ).wait_ready()
    try:
        fronts = [proc.process.pid, *proc.http_front_pids()]
        assert len(fronts) == 2
        before = scrape(proc.metrics_url)
        for pid in fronts:  # N requests on each front's own connection
            conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=30)
            conn.sock = socket_to_front(proc, pid)
            try:
                for _ in range(N):
                    _infer(conn, "simple")
            finally:
                conn.close()
        after = scrape(proc.metrics_url)
    finally:
        assert proc.stop() == 0, proc.log
    for family in HISTOGRAM_FAMILIES:
        moved = after.value(family + "_count", "simple") - before.value(family + "_count", "simple")
        assert moved == 2 * N, family
        infinite = after.buckets(family, "simple")[-1][1] - before.buckets(family, "simple")[-1][1]
        assert infinite == 2 * N, family
    _check_histograms(after, "simple")
