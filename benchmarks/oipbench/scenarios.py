"""The scenarios of issue 7 and how their figures are aggregated across rounds."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .load import Measurement


@dataclass(frozen=True)
class Scenario:
    """One model × transport × concurrency cell of the table."""

    key: str
    group: str
    model: str
    protocol: str  # json | binary | grpc | jpeg
    concurrency: int
    payload: bool = False  # report MB/s (tensor bytes in + out)
    floor: bool = False  # compare with the in-process ORT floor
    #: Requests a second, paced (wrk's schedule, REST only); 0: as fast as answered.
    rate: float = 0.0

    @property
    def label(self) -> str:
        names = {
            "json": "REST JSON",
            "binary": "REST binary",
            "grpc": "gRPC",
            "jpeg": "REST binary, JPEG bytes",
        }
        paced = f", paced {self.rate:,.0f}/s" if self.rate else ""
        return f"{names[self.protocol]}, c={self.concurrency}{paced}"


SCENARIOS: list[Scenario] = [
    Scenario("tiny-json-c1", "1. tiny model (INT32 [1,16] add/sub)", "simple", "json", 1),
    Scenario("tiny-json-c16", "1. tiny model (INT32 [1,16] add/sub)", "simple", "json", 16),
    # Below saturation: requests far apart, each waking a sleeping server (issue #40).
    Scenario(
        "tiny-json-paced600-c1",
        "1. tiny model (INT32 [1,16] add/sub)",
        "simple",
        "json",
        1,
        rate=600.0,
    ),
    Scenario(
        "tiny-json-paced2000-c1",
        "1. tiny model (INT32 [1,16] add/sub)",
        "simple",
        "json",
        1,
        rate=2000.0,
    ),
    Scenario("tiny-binary-c1", "2. tiny model, binary extension and gRPC", "simple", "binary", 1),
    Scenario("tiny-binary-c16", "2. tiny model, binary extension and gRPC", "simple", "binary", 16),
    Scenario("tiny-grpc-c1", "2. tiny model, binary extension and gRPC", "simple", "grpc", 1),
    Scenario("tiny-grpc-c16", "2. tiny model, binary extension and gRPC", "simple", "grpc", 16),
    Scenario(
        "mib-binary-c4",
        "3. FP32 1 MiB tensor through identity",
        "identity_fp32",
        "binary",
        4,
        payload=True,
    ),
    Scenario(
        "mib-grpc-c4",
        "3. FP32 1 MiB tensor through identity",
        "identity_fp32",
        "grpc",
        4,
        payload=True,
    ),
    Scenario(
        "matmul-binary-c4",
        "4. compute-bound ([8,1024] x [1024,1024] MatMul + Relu)",
        "matmul_relu",
        "binary",
        4,
        floor=True,
    ),
    Scenario(
        "matmul-grpc-c4",
        "4. compute-bound ([8,1024] x [1024,1024] MatMul + Relu)",
        "matmul_relu",
        "grpc",
        4,
        floor=True,
    ),
    Scenario("jpeg-c4", "5. 224x224 JPEG as image bytes", "image_nhwc_u8", "jpeg", 4),
    Scenario(
        "matmul-batched-c16",
        "6. dynamic batching: the MatMul with one row per request, max_batch_size 16",
        "matmul_batched",
        "binary",
        16,
        floor=True,
    ),
    Scenario(
        "matmul-unbatched-c16",
        "6. dynamic batching: the MatMul with one row per request, max_batch_size 16",
        "matmul_unbatched",
        "binary",
        16,
    ),
]
BY_KEY = {s.key: s for s in SCENARIOS}


@dataclass
class Cell:
    """Median figures of one server in one scenario over the rounds that succeeded."""

    server: str
    scenario: str
    runs: int = 0
    rps: float = math.nan
    rps_min: float = math.nan
    rps_max: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    mbps: float | None = None
    client_cpu_pct: float = math.nan
    server_cpu_pct: float = math.nan
    #: Server CPU per request (µs): the server tree's CPU over the window divided by the
    #: requests answered in it, the median over rounds (of each round's own ratio).
    server_cpu_us: float = math.nan
    other_cpu_pct: float = math.nan
    errors: int = 0
    note: str = ""
    percentiles_ms: list[tuple[float, float]] = field(default_factory=list)
    server_top: list[tuple[str, float]] = field(default_factory=list)


def _median(values: list[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def cpu_us_per_request(cpu_pct: float, rps: float) -> float:
    """CPU µs one request cost: ``cpu_pct`` % of a core over a window at ``rps`` req/s.

    None (NaN) where no CPU was seen: a server that answered used some, so the CPU window
    missed the load (the gRPC client's window is estimated, and a loaded machine may
    start the client late): better no figure than a CPU goal met by 0 µs."""
    if not rps or math.isnan(rps) or cpu_pct is None or math.isnan(cpu_pct) or cpu_pct <= 0:
        return math.nan
    return cpu_pct * 1e4 / rps


def aggregate(measurements: list[Measurement], server: str, scenario: str) -> Cell:
    """Medians across rounds (drift on this machine is 30-40 %: single runs mislead)."""
    runs = [m for m in measurements if m.server == server and m.scenario == scenario]
    good = [m for m in runs if m.ok]
    cell = Cell(server, scenario, runs=len(good))
    notes = sorted({m.note for m in runs if m.note})
    cell.note = "; ".join(notes)
    if not good:
        return cell
    cell.rps = _median([m.rps for m in good])
    cell.rps_min = min(m.rps for m in good)
    cell.rps_max = max(m.rps for m in good)
    cell.p50_ms = _median([m.p50_ms for m in good])
    cell.p99_ms = _median([m.p99_ms for m in good])
    if any(m.mbps is not None for m in good):
        cell.mbps = _median([m.mbps for m in good if m.mbps is not None])
    cell.client_cpu_pct = _median([m.client_cpu_pct for m in good])
    cell.server_cpu_pct = _median([m.server_cpu_pct for m in good])
    cell.server_cpu_us = _median([cpu_us_per_request(m.server_cpu_pct, m.rps) for m in good])
    cell.other_cpu_pct = _median([m.other_cpu_pct for m in good])
    cell.errors = sum(m.errors for m in runs)
    points = [p for p, _ in good[0].percentiles_ms]
    cell.percentiles_ms = [
        (p, _median([dict(m.percentiles_ms).get(p, math.nan) for m in good])) for p in points
    ]
    # The busiest processes of the median-throughput run, for the bottleneck notes.
    median_run = sorted(good, key=lambda m: m.rps)[len(good) // 2]
    cell.server_top = median_run.server_top
    return cell
