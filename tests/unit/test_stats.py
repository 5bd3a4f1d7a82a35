"""The statistics recorder, its registry and the statistics extension's JSON."""

from __future__ import annotations

import asyncio
import time

import pytest

from oipserve.errors import InvalidInput, NotFound, Unavailable
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.handle import WorkerDied
from oipserve.telemetry.stats import (
    FailureReason,
    ModelStats,
    StatsRegistry,
    failure_reason,
    refusal_reason,
)
from oipserve.telemetry.stats_report import model_stat, model_statistics


def test_requests_and_executions_are_counted_apart() -> None:
    stats = ModelStats("m", "1")
    before_ms = time.time_ns() // 1_000_000
    # Two requests (batch 1 and 3) batched into one execution of 4, then one alone.
    stats.executed(4, 40, 400, 4000)
    stats.request_succeeded(1, 1000, 100, 10, 100, 1000)
    stats.request_succeeded(3, 2000, 200, 30, 300, 3000)
    stats.executed(1, 5, 50, 500)
    stats.request_succeeded(1, 700, 70, 5, 50, 500)
    stats.request_failed(FailureReason.BACKEND, 90)
    stats.request_failed(FailureReason.OTHER, 10)
    stats.request_failed(FailureReason.OTHER, 0)

    assert (stats.success_count, stats.success_ns) == (3, 3700)
    assert (stats.queue_ns, stats.input_ns, stats.infer_ns, stats.output_ns) == (
        370,
        45,
        450,
        4500,
    )
    assert (stats.inference_count, stats.execution_count) == (5, 2)
    assert {s: c.as_list() for s, c in stats.batches.items()} == {
        4: [1, 40, 400, 4000],
        1: [1, 5, 50, 500],
    }
    assert (stats.fail_count, stats.fail_ns) == (3, 100)
    assert stats.failures == {
        FailureReason.REJECTED: 0,
        FailureReason.CANCELED: 0,
        FailureReason.BACKEND: 1,
        FailureReason.OTHER: 2,
    }
    assert before_ms <= stats.last_inference_ms <= time.time_ns() // 1_000_000


def test_json_has_triton_keys_in_order() -> None:
    stats = ModelStats("m", "3")
    assert model_stat(stats) == {
        "name": "m",
        "version": "3",
        "last_inference": 0,
        "inference_count": 0,
        "execution_count": 0,
        "inference_stats": {
            key: {"count": 0, "ns": 0}
            for key in (
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
                "cache_hit",
                "cache_miss",
            )
        },
        "response_stats": {},
        "batch_stats": [],
        "memory_usage": [],
    }
    stats.executed(8, 1, 2, 3)
    stats.executed(2, 4, 5, 6)
    stats.executed(8, 1, 2, 3)
    stats.request_succeeded(8, 100, 10, 1, 2, 3)
    entry = model_stat(stats)
    assert list(entry) == list(model_stat(ModelStats("x", "1")))
    assert entry["batch_stats"] == [
        {
            "batch_size": 2,
            "compute_input": {"count": 1, "ns": 4},
            "compute_infer": {"count": 1, "ns": 5},
            "compute_output": {"count": 1, "ns": 6},
        },
        {
            "batch_size": 8,
            "compute_input": {"count": 2, "ns": 2},
            "compute_infer": {"count": 2, "ns": 4},
            "compute_output": {"count": 2, "ns": 6},
        },
    ]
    assert entry["inference_stats"]["queue"] == {"count": 1, "ns": 10}  # type: ignore[index]


def _registry(*versions: tuple[str, str, str]) -> tuple[ModelRegistry, dict[str, ModelVersion]]:
    registry = ModelRegistry()
    made = {}
    for name, version, state in versions:
        model = ModelVersion(name, version, "/nowhere", None)
        model.state = state  # type: ignore[assignment]
        registry.models.setdefault(name, {})[version] = model
        made[f"{name}/{version}"] = model
    return registry, made


def test_registry_lists_ready_versions_in_order_and_forgets_replaced_ones() -> None:
    registry, made = _registry(
        ("b", "10", "READY"),
        ("b", "9", "READY"),
        ("a", "1", "UNAVAILABLE"),
        ("a", "2", "READY"),
    )
    stats = StatsRegistry(registry)
    old = stats.of(made["b/9"])
    assert stats.of(made["b/9"]) is old
    old.request_failed(FailureReason.OTHER, 1)
    listed = [(m.name, m.version) for m, _ in stats.ready()]
    assert listed == [("a", "2"), ("b", "9"), ("b", "10")]

    # A reload replaces the version object: its statistics start again at zero.
    reloaded = ModelVersion("b", "9", "/nowhere", None)
    reloaded.state = "READY"
    registry.models["b"]["9"] = reloaded
    assert stats.of(reloaded).fail_count == 0
    assert made["b/9"] not in stats._stats
    del registry.models["a"]
    stats.prune()
    assert made["a/2"] not in stats._stats


def test_report_selects_and_refuses() -> None:
    registry, made = _registry(("m", "1", "UNAVAILABLE"), ("m", "2", "READY"))
    registry.failed["broken"] = "no model file"
    stats = StatsRegistry(registry)
    stats.of(made["m/2"]).request_succeeded(1, 5, 1, 1, 1, 1)
    report = model_statistics(stats, registry, "m", None)
    assert [(s["name"], s["version"]) for s in report["model_stats"]] == [("m", "2")]  # type: ignore[index, union-attr]
    assert model_statistics(stats, registry, None, None) == report
    assert model_statistics(stats, registry, "m", "2") == report
    with pytest.raises(NotFound):
        model_statistics(stats, registry, "nope", None)
    with pytest.raises(NotFound):
        model_statistics(stats, registry, "m", "7")
    with pytest.raises(Unavailable):
        model_statistics(stats, registry, "m", "1")
    with pytest.raises(Unavailable, match="no model file"):
        model_statistics(stats, registry, "broken", None)
    registry.models["m"]["2"].state = "LOADING"
    with pytest.raises(Unavailable):
        model_statistics(stats, registry, "m", None)


def test_failure_reasons() -> None:
    assert refusal_reason(InvalidInput("bad")) is FailureReason.OTHER
    assert refusal_reason(Unavailable("overloaded", retry_after=1)) is FailureReason.REJECTED
    assert refusal_reason(asyncio.CancelledError()) is FailureReason.CANCELED
    assert failure_reason(InvalidInput("onnxruntime refused")) is FailureReason.BACKEND
    assert failure_reason(WorkerDied("worker died")) is FailureReason.BACKEND
    assert failure_reason(asyncio.CancelledError()) is FailureReason.CANCELED


def _counted(stats: ModelStats, executions: int, batch: int) -> ModelStats:
    for _ in range(executions):
        stats.executed(batch, 1, 10, 100)
        stats.request_succeeded(batch, 1000, 5, 1, 10, 100)
    stats.request_failed(FailureReason.OTHER, 7)
    return stats


def test_another_fronts_row_adds_up_with_this_ones() -> None:
    """``--http-workers``: a row sent by another front counts in, field by field."""
    here = _counted(ModelStats("m", "1"), 2, 1)
    there = _counted(ModelStats("m", "1"), 3, 4)
    there.pending = 2
    total = ModelStats("m", "1")
    total.add(here.row(9))
    total.add(there.row(9))
    assert total.success_count == 5 and total.success_ns == 5000
    assert total.inference_count == 2 * 1 + 3 * 4 and total.execution_count == 5
    assert total.fail_count == 2 and total.failures[FailureReason.OTHER] == 2
    assert {s: c.as_list() for s, c in total.batches.items()} == {
        1: [2, 2, 20, 200],
        4: [3, 3, 30, 300],
    }
    assert total.pending == 2
    assert total.last_success_ns == max(here.last_success_ns, there.last_success_ns)
    assert model_stat(total)["inference_stats"]["queue"] == {"count": 5, "ns": 25}


async def test_totals_are_what_the_readers_report() -> None:
    registry = ModelRegistry()
    model = ModelVersion("m", "1", "", None)
    model.state = "READY"
    model.echo = True
    registry.models["m"] = {"1": model}
    stats = StatsRegistry(registry)
    _counted(stats.of(model), 1, 1)
    other = _counted(ModelStats("m", "1"), 4, 1)
    gone = _counted(ModelStats("m", "1"), 100, 1)
    rows = [other.row(model.serial), gone.row(model.serial + 1000)]  # a serial not served

    async def collect() -> list:
        return rows

    stats.collect = collect
    await stats.refresh()
    assert stats.totals(model).success_count == 5
    assert [s.success_count for _, s in stats.ready()] == [5]
    # Recording still goes to this front's own counters, never to the totals.
    assert stats.of(model).success_count == 1
    assert stats.rows() == [stats.of(model).row(model.serial)]
