"""``--metrics-config`` and ``model_metrics`` parsing; the histogram and summary recorders."""

from __future__ import annotations

import math

import pytest

from oipserve.config.metrics_config import (
    DEFAULT_QUANTILES,
    MetricsConfigError,
    parse_metrics_config,
)
from oipserve.config.settings import SettingsError, load_settings
from oipserve.models.config.model_metrics import MAX_BUCKETS
from oipserve.models.config.parse import ModelConfigError, parse_model_config
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.telemetry.latency import (
    CAPACITY,
    DEFAULT_BUCKETS,
    HISTOGRAM_FAMILIES,
    SLOTS,
    Histograms,
    LatencyMetrics,
    SummaryWindow,
)
from oipserve.telemetry.metrics.families import model_families
from oipserve.telemetry.stats import ModelStats, StatsRegistry

REQUEST = HISTOGRAM_FAMILIES[0]


def test_metrics_config_defaults_are_tritons() -> None:
    config = parse_metrics_config([])
    assert config.counter_latencies and not config.histogram_latencies
    assert not config.summary_latencies
    assert config.summary_quantiles == DEFAULT_QUANTILES
    assert config.summary_max_age == 60.0


def test_metrics_config_items_later_ones_win() -> None:
    config = parse_metrics_config(
        [
            "histogram_latencies=true",
            "summary_latencies=true",
            "summary_quantiles=0.99:0.001,0.5:0.05",
            "summary_max_age=10",
            "counter_latencies=false",
            "histogram_latencies=false",
        ]
    )
    assert not config.histogram_latencies and config.summary_latencies
    assert config.summary_quantiles == ((0.5, 0.05), (0.99, 0.001))  # sorted
    assert config.summary_max_age == 10.0 and not config.counter_latencies


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ("histogram_latencies", "is not <key>=<value>"),
        ("histogram_latencies=maybe", "must be true or false"),
        ("latencies=true", "unknown key 'latencies'"),
        ("summary_quantiles=0.5", "is not <quantile>:<error>"),
        ("summary_quantiles=1.5:0.1", "between 0 and 1"),
        ("summary_quantiles=0.5:x", "an error must be a number"),
        ("summary_quantiles=0.5:0.1,0.5:0.2", "given twice"),
        ("summary_quantiles=nan:0.1", "finite"),
        ("summary_max_age=0", "between 1 and"),
    ],
)
def test_bad_metrics_config_items_are_refused_with_the_reason(item: str, reason: str) -> None:
    with pytest.raises(MetricsConfigError, match=reason):
        parse_metrics_config([item])
    with pytest.raises(SettingsError, match=f"--metrics-config.*{reason}"):
        load_settings(["serve", "--model-repository", "r", "--metrics-config", item], {})


def test_metrics_config_from_the_environment_is_split_on_semicolons() -> None:
    env = {"OIPSERVE_METRICS_CONFIG": "histogram_latencies=true; summary_quantiles=0.5:0.1,0.9:0"}
    _, settings = load_settings(["serve", "--model-repository", "r"], env)
    assert settings.metrics_config == (
        "histogram_latencies=true",
        "summary_quantiles=0.5:0.1,0.9:0",
    )


def _metrics(*controls: str) -> str:
    return "model_metrics { metric_control [ " + ", ".join(controls) + " ] }"


def _control(family: str, buckets: str | None) -> str:
    options = f" histogram_options {{ buckets: [ {buckets} ] }}" if buckets is not None else ""
    return f'{{ metric_identifier {{ family: "{family}" }}{options} }}'


def test_model_metrics_buckets_are_parsed_per_family() -> None:
    config = parse_model_config(
        _metrics(
            _control(REQUEST, "1, 2.5, 1e3"),
            _control("nv_inference_first_response_histogram_ms", "1"),
        )
    )
    assert config.histogram_buckets == {REQUEST: (1.0, 2.5, 1000.0)}
    # Triton's first-response histogram (decoupled models only): ignored with a warning.
    assert config.ignored == (
        "model_metrics.metric_control[1] (nv_inference_first_response_histogram_ms: "
        "decoupled models only)",
    )
    assert parse_model_config("").histogram_buckets == {}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (_metrics(_control("", "1")), "metric_identifier.family is required"),
        (_metrics(_control("nv_inference_count", "1")), "is not a histogram family"),
        (_metrics(_control(REQUEST, None)), "histogram_options is required"),
        (_metrics(_control(REQUEST, "")), "must list at least one bound"),
        (_metrics(_control(REQUEST, "2, 2")), "must increase strictly"),
        (_metrics(_control(REQUEST, "-1")), "is not a duration"),
        (_metrics(_control(REQUEST, "inf")), "is not a duration"),
        # Finite, but no int64 of nanoseconds: every scrape and stats read was a 500.
        (_metrics(_control(REQUEST, "100, 1e306")), "1e\\+306 is not a duration"),
        (_metrics(_control(REQUEST, "9223372036854776")), "is not a duration"),
        # An int64 of ns holds 9223372036854775 us, but that is no double: it reads as
        # ...776 (the docs gave it as the limit, and it was refused: found by fuzzing).
        (_metrics(_control(REQUEST, "9223372036854775")), "0 to 9223372036854774;"),
        (_metrics(_control(REQUEST, ", ".join(["1"] * (MAX_BUCKETS + 1)))), "at most 64"),
        (_metrics(_control(REQUEST, "1"), _control(REQUEST, "2")), "is given twice"),
    ],
)
def test_malformed_model_metrics_refuse_the_model(text: str, reason: str) -> None:
    with pytest.raises(ModelConfigError, match=reason):
        parse_model_config(text)


def test_the_largest_bound_the_docs_name_is_taken() -> None:
    config = parse_model_config(_metrics(_control(REQUEST, "100, 9223372036854774")))
    assert config.histogram_buckets == {REQUEST: (100.0, 9223372036854774.0)}
    histograms = Histograms(((100.0, 9223372036854774.0),) * 5)
    histograms.observe(9223372036854774000, 1, 1, 1, 1)  # on the bound: in its bucket
    histograms.observe(2**63 - 1, 1, 1, 1, 1)  # the longest duration: past it
    assert histograms.counts[0] == [0, 1, 1]


def test_a_duration_on_a_bound_is_in_that_bucket() -> None:
    histograms = Histograms(((1, 2.5),) * 5)
    for ns in (0, 1000, 1001, 2500, 2501, 10**9):
        histograms.observe(ns, ns, ns, ns, ns)
    # le=1 us: 0 and 1000 ns; le=2.5 us: 1001 and 2500 ns; +Inf: the rest.
    assert histograms.counts == [[2, 2, 2]] * 5


def test_histograms_add_another_fronts_counts() -> None:
    mine = Histograms(((1,),) * 5)
    mine.observe(1, 2000, 1, 1, 1)
    total = mine.empty()
    total.add(mine.snapshot())
    total.add(mine.snapshot())
    assert total.counts[0] == [2, 0] and total.counts[1] == [0, 2]
    assert mine.counts[0] == [1, 0]  # the snapshot is a copy


def test_the_summary_window_is_exact_below_capacity_and_ages_out() -> None:
    window = SummaryWindow(max_age=5)  # slots of 1 s
    second = 10**9
    for value in range(1, 101):  # 1..100 us
        window.observe(100 * second, value * 1000, 0, 0, 0, 0)
    found = window.quantiles(100 * second, (0.5, 0.9, 0.99))
    assert found[0] == [50.0, 90.0, 99.0]
    assert found[1] == [0.0, 0.0, 0.0]
    # Still there SLOTS - 1 slots later, gone after SLOTS.
    assert window.quantiles((100 + SLOTS - 1) * second, (0.5,))[0] == [50.0]
    assert math.isnan(window.quantiles((100 + SLOTS) * second, (0.5,))[0][0])


def test_the_summary_window_samples_past_capacity_and_reuses_its_slots() -> None:
    window = SummaryWindow(max_age=SLOTS)
    second = 10**9
    for value in range(CAPACITY * 8):  # one slot: a uniform sample of 0..8*CAPACITY us
        window.observe(7 * second, value * 1000, 0, 0, 0, 0)
    (median,) = window.quantiles(7 * second, (0.5,))[0]
    assert abs(median - CAPACITY * 4) < CAPACITY  # within 1/8 of the range
    # The next slot with the same index (SLOTS seconds on) starts empty.
    window.observe((7 + SLOTS) * second, 1000, 0, 0, 0, 0)
    assert window.quantiles((7 + SLOTS) * second, (0.5, 0.99))[0] == [1.0, 1.0]


def test_stats_record_histograms_only_when_asked() -> None:
    registry = ModelRegistry()
    config = parse_model_config(_metrics(_control(REQUEST, "5")))
    model = ModelVersion("m", "1", "/nowhere", config)
    registry.models["m"] = {"1": model}
    stats = StatsRegistry(registry)
    off = stats.of(model)
    assert off.histograms is None and off.window is None
    registry.models["m"] = {"1": (model := ModelVersion("m", "1", "/nowhere", config))}
    stats.latency = LatencyMetrics(
        parse_metrics_config(["histogram_latencies=true", "summary_latencies=true"])
    )
    on = stats.of(model)
    assert on.histograms is not None and on.window is not None
    assert on.histograms.bounds[0] == (5.0,)  # model_metrics
    assert on.histograms.bounds[1] == DEFAULT_BUCKETS[HISTOGRAM_FAMILIES[1]]
    on.request_succeeded(1, 4000, 0, 0, 0, 0)
    on.request_succeeded(1, 6000, 0, 0, 0, 0)
    assert on.histograms.counts[0] == [1, 1]
    # Another front's row adds its bucket counts into the totals.
    stats._others = {model.serial: [on.row(model.serial)]}
    total = stats.totals(model)
    assert total.histograms is not None and total.histograms.counts[0] == [2, 2]
    assert total.success_count == 4 and on.histograms.counts[0] == [1, 1]


def test_counter_latencies_false_leaves_out_the_duration_counters() -> None:
    stats = ModelStats("m", "1")
    names = {f.name for f in model_families([stats], counters=False)}
    assert "nv_inference_request_success" in names
    assert not {n for n in names if n.endswith("_duration_us")}
    assert len({f.name for f in model_families([stats])} - names) == 5
