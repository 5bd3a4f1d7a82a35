"""A batch's statistics (``batched._record``): counted in once per batch of one-row
requests, the same counters as request by request (Triton's statistics extension)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from oipserve.dataplane import batched
from oipserve.dataplane.batched import _Queued, _record
from oipserve.scheduling.scheduler import Entry
from oipserve.telemetry.stats import ModelStats
from oipserve.wire.messages import InferDone

_FIELDS = (
    "success_count",
    "success_ns",
    "queue_ns",
    "input_ns",
    "infer_ns",
    "output_ns",
    "inference_count",
    "execution_count",
)


def _entries(enqueued: list[int]) -> list[Entry]:
    """Queue entries of those enqueue times (what ``_record`` reads of them)."""
    loop = asyncio.new_event_loop()
    entries = [Entry(None, 1, (), 0, loop.create_future(), seq) for seq in range(len(enqueued))]
    loop.close()
    for entry, ns in zip(entries, enqueued, strict=True):
        entry.enqueued_ns = ns
    return entries


def _counters(stats: ModelStats) -> dict[str, Any]:
    counters = {name: getattr(stats, name) for name in _FIELDS}
    counters["batches"] = {size: row.as_list() for size, row in stats.batches.items()}
    return counters


@pytest.mark.parametrize("rows", [[1, 1, 1], [0, 2, 1], [2, 2]])
def test_a_batch_counts_as_its_requests_one_by_one(
    rows: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = 9_000
    monkeypatch.setattr(batched, "monotonic_ns", lambda: now)
    done = InferDone(0, "seg", [], [], 5_000, 1_001, 20_003, 3_007)
    starts = [100, 250, 400, 410][: len(rows)]
    batch, each = ModelStats("m", "1"), ModelStats("m", "1")
    requests = [_Queued([], [], [], n, start, batch) for n, start in zip(rows, starts, strict=True)]
    _record(requests, _entries([start + 50 for start in starts]), done)
    total = sum(rows) or 1
    each.executed(total, done.input_ns, done.infer_ns, done.output_ns)
    for n, start in zip(rows, starts, strict=True):
        share = n / total
        each.request_succeeded(
            n,
            now - start,
            done.started_ns - start - 50,
            int(done.input_ns * share),
            int(done.infer_ns * share),
            int(done.output_ns * share),
        )
    assert _counters(batch) == _counters(each)


def test_with_latency_histograms_each_request_is_observed() -> None:
    observed: list[tuple[int, ...]] = []
    stats = ModelStats("m", "1")
    stats.histograms = SimpleNamespace(observe=lambda *times: observed.append(times))  # type: ignore[assignment]
    done = InferDone(0, "seg", [], [], 5_000, 1_000, 2_000, 3_000)
    requests = [_Queued([], [], [], 1, 100, stats) for _ in range(3)]
    _record(requests, _entries([150] * 3), done)
    assert len(observed) == 3 and stats.success_count == 3
