"""One model version's counters as another HTTP front sends them (``--http-workers``):
``StatsRow``, which ``oipserve.telemetry.stats.ModelStats`` makes (``row``) and adds
(``add``).

A module of its own because it is a msgspec Struct, which mypyc cannot compile
(``msgspec.field`` defaults), and ``stats`` is compiled: the inference path records
every request there (pyproject.toml's ``[tool.oipserve] compiled``).
"""

from __future__ import annotations

import msgspec

__all__ = ["StatsRow"]


class StatsRow(msgspec.Struct, frozen=True, array_like=True):
    """One version's counters in another HTTP front, by the version's ``serial``."""

    serial: int
    success_count: int
    success_ns: int
    fail_count: int
    fail_ns: int
    failures: dict[str, int]
    queue_ns: int
    input_ns: int
    infer_ns: int
    output_ns: int
    inference_count: int
    execution_count: int
    batches: dict[int, list[int]]
    pending: int
    last_success_ns: int
    #: Per latency histogram family, the counts per bucket (empty when histograms are off).
    histograms: list[list[int]] = msgspec.field(default_factory=list)
    #: Response cache hits, their ns, misses, their ns.
    cache: list[int] = msgspec.field(default_factory=lambda: [0, 0, 0, 0])
    #: Padded batching's elements with the padding and without.
    padding: list[int] = msgspec.field(default_factory=lambda: [0, 0])
