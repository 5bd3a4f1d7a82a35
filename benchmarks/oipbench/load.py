"""Load generation: wrk (HTTP, Lua script) and the multi-process gRPC client.

Both return a `Measurement` with req/s, latency percentiles, errors and the CPU the client
itself used, so a figure that is really the client's ceiling can be recognised as such.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import LUA_SCRIPT
from .payloads import HttpBody
from .procs import cpu_delta, cpu_snapshot, front_and_workers, machine_cpu_pct, run_client


@dataclass
class Measurement:
    """One bounded run of one scenario against one server."""

    server: str
    scenario: str
    round: int
    ok: bool
    note: str = ""
    requests: int = 0
    duration_s: float = 0.0
    rps: float = 0.0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    mean_ms: float = math.nan
    percentiles_ms: list[tuple[float, float]] = field(default_factory=list)
    errors: int = 0
    status: dict[str, int] = field(default_factory=dict)
    socket_errors: dict[str, int] = field(default_factory=dict)
    client_cpu_pct: float = math.nan
    server_cpu_pct: float = math.nan
    other_cpu_pct: float = math.nan  # machine busy minus server and client: other tenants
    server_top: list[tuple[str, float]] = field(default_factory=list)
    #: CPU seconds of the server's fronts and of its workers over the measured window
    #: (``procs.front_and_workers``): the window the requests were counted in, not the
    #: client's start-up (the gRPC client calls for ~1 s before it counts).
    front_cpu_s: float = math.nan
    workers_cpu_s: float = math.nan
    mbps: float | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def cpu_us_per_request(self) -> tuple[float, float]:
        """The fronts' and the workers' CPU µs a request counted."""
        per = 1e6 / max(self.requests, 1)
        return self.front_cpu_s * per, self.workers_cpu_s * per


def wrk_version() -> str:
    exe = shutil.which("wrk")
    if not exe:
        return "not installed"
    res = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=10)
    text = (res.stdout + res.stderr).strip().splitlines()
    return text[0] if text else "unknown"


def _pct(points: list[list[float]], p: float) -> float:
    for q, v in points:
        if abs(q - p) < 1e-9:
            return float(v)
    return math.nan


def run_wrk(
    server: str,
    scenario: str,
    rnd: int,
    url: str,
    body: HttpBody,
    connections: int,
    duration_s: int,
    work: Path,
    server_pid: int,
    timeout_s: float = 5.0,
    count_status: bool = False,
    max_requests: int = 0,
    rate: float = 0.0,
    payload_bytes: int = 0,
    threads: int = 1,
) -> Measurement:
    """One wrk run (1 thread by default: wrk's one event loop out-runs any Python server on
    2 cores; ``threads`` for a many-core node's several fronts)."""
    env = dict(os.environ)
    env.update(
        {
            "OIPB_BODY": str(body.path),
            "OIPB_CTYPE": body.content_type,
            "OIPB_HLEN": "" if body.header_length is None else str(body.header_length),
            "OIPB_COUNT_STATUS": "1" if count_status else "0",
            "OIPB_MAX_REQUESTS": str(max_requests),
            "OIPB_RATE": f"{rate:.1f}",
        }
    )
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration_s}s",
        "--timeout",
        f"{timeout_s:g}s",
        "-s",
        str(LUA_SCRIPT),
        url,
    ]
    before = cpu_snapshot(server_pid)
    run = run_client(argv, env, timeout_s=duration_s + timeout_s + 20, work=work)
    after = cpu_snapshot(server_pid)
    m = Measurement(server, scenario, rnd, ok=False)
    m.server_cpu_pct, m.server_top = cpu_delta(before, after)
    m.server_top = m.server_top[:4]
    m.front_cpu_s, m.workers_cpu_s = front_and_workers(before, after)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("OIPB_RESULT ")), None)
    if run.timed_out or line is None:
        m.note = "wrk failed: " + (run.stderr.strip() or run.stdout.strip())[-300:]
        return m
    data = json.loads(line[len("OIPB_RESULT ") :])
    m.requests = int(data["requests"])
    m.duration_s = data["duration_us"] / 1e6
    m.rps = m.requests / m.duration_s if m.duration_s else 0.0
    points = data["percentiles_us"]
    m.percentiles_ms = [(float(p), v / 1000.0) for p, v in points]
    m.p50_ms = _pct(points, 50) / 1000.0
    m.p99_ms = _pct(points, 99) / 1000.0
    m.mean_ms = data["latency_us"]["mean"] / 1000.0
    m.socket_errors = {k: int(v) for k, v in data["errors"].items() if v}
    m.status = {k: int(v) for k, v in data.get("status", {}).items()}
    non2xx = int(data["errors"].get("status", 0))
    m.errors = non2xx + sum(v for k, v in m.socket_errors.items() if k != "status")
    m.client_cpu_pct = 100.0 * run.cpu_s / max(run.wall_s, 1e-9)
    m.other_cpu_pct = max(0.0, machine_cpu_pct(before, after) - m.server_cpu_pct - m.client_cpu_pct)
    if payload_bytes:
        m.mbps = m.rps * payload_bytes / 1e6
    m.ok = m.requests > 0
    if not m.ok:
        m.note = (
            f"no response completed within {duration_s} s at c={connections} "
            f"(socket errors: {m.socket_errors or 'none'})"
        )
    return m


def run_grpc(
    server: str,
    scenario: str,
    rnd: int,
    tools_python: Path,
    target: str,
    spec: Path,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    work: Path,
    server_pid: int,
    payload_bytes: int = 0,
    max_requests: int = 500_000,
    client_processes: int = 2,
) -> Measurement:
    """One run of grpc_client.py; server CPU is sampled around the measurement window."""
    script = Path(__file__).with_name("grpc_client.py")
    result_path = work / "grpc-result.json"
    result_path.unlink(missing_ok=True)
    startup = 2.0
    argv = [
        str(tools_python),
        str(script),
        "load",
        "--target",
        target,
        "--spec",
        str(spec),
        "--result",
        str(result_path),
        "--concurrency",
        str(concurrency),
        "--processes",
        str(min(client_processes, concurrency)),
        "--startup",
        str(startup),
        "--warmup",
        str(warmup_s),
        "--duration",
        str(duration_s),
        "--max-requests",
        str(max_requests),
    ]
    # The server CPU window approximates the client's measurement window.
    snaps: dict[str, object] = {}

    def sample() -> None:
        time.sleep(startup + warmup_s)
        snaps["before"] = cpu_snapshot(server_pid)
        time.sleep(duration_s)
        snaps["after"] = cpu_snapshot(server_pid)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    run = run_client(argv, None, timeout_s=startup + warmup_s + duration_s + 40, work=work)
    sampler.join(timeout=5)
    m = Measurement(server, scenario, rnd, ok=False)
    if "before" in snaps and "after" in snaps:
        m.server_cpu_pct, top = cpu_delta(snaps["before"], snaps["after"])  # type: ignore[arg-type]
        m.server_top = top[:4]
        m.front_cpu_s, m.workers_cpu_s = front_and_workers(snaps["before"], snaps["after"])  # type: ignore[arg-type]
    try:
        data = json.loads(result_path.read_text())
    except (OSError, ValueError):
        m.note = "gRPC client failed: " + (run.stderr.strip() or run.stdout.strip())[-300:]
        return m
    if not data.get("ok"):
        m.note = "gRPC client failed: " + str(data.get("error", ""))[-300:]
        return m
    m.requests = int(data["requests"])
    m.duration_s = float(data["duration_s"])
    m.rps = data["ok_requests"] / m.duration_s
    points = data["percentiles_us"]
    m.percentiles_ms = [(float(p), v / 1000.0) for p, v in points]
    m.p50_ms = _pct(points, 50) / 1000.0
    m.p99_ms = _pct(points, 99) / 1000.0
    m.mean_ms = data["mean_us"] / 1000.0
    m.socket_errors = {k: int(v) for k, v in data["errors"].items()}
    m.errors = sum(m.socket_errors.values())
    m.client_cpu_pct = 100.0 * data["client_cpu_s"] / m.duration_s
    if "before" in snaps and "after" in snaps:
        machine = machine_cpu_pct(snaps["before"], snaps["after"])  # type: ignore[arg-type]
        m.other_cpu_pct = max(0.0, machine - m.server_cpu_pct - m.client_cpu_pct)
    if payload_bytes:
        m.mbps = m.rps * payload_bytes / 1e6
    m.ok = data["ok_requests"] > 0
    if not m.ok:
        m.note = "no call succeeded: " + json.dumps(m.socket_errors)
    return m


def grpc_check(
    tools_python: Path, target: str, spec: Path, work: Path, timeout_s: float = 10.0
) -> dict[str, object]:
    """ServerReady + one ModelInfer through the tools venv; decoded outputs for verification."""
    script = Path(__file__).with_name("grpc_client.py")
    result_path = work / "grpc-check.json"
    result_path.unlink(missing_ok=True)
    run_client(
        [
            str(tools_python),
            str(script),
            "check",
            "--target",
            target,
            "--spec",
            str(spec),
            "--result",
            str(result_path),
            "--timeout",
            str(timeout_s),
        ],
        None,
        timeout_s=timeout_s * 2 + 20,
        work=work,
    )
    try:
        return dict(json.loads(result_path.read_text()))
    except (OSError, ValueError):
        return {"ok": False, "error": "gRPC check produced no result"}


def concurrency_specs(text: str, names: Iterable[str]) -> list[tuple[str, int]]:
    """A script's ``--scenarios`` parsed: "tiny:16,mib:4" is [("tiny", 16), ("mib", 4)],
    each name one of ``names``."""
    known = tuple(names)
    out = []
    for item in text.split(","):
        name, _, concurrency = item.partition(":")
        if name not in known or not concurrency.isdigit():
            shown = "|".join(known)
            raise SystemExit(f"--scenarios: {item!r} is not <{shown}>:<concurrency>")
        out.append((name, int(concurrency)))
    return out


def medians(rows: Iterable[object], fields: Iterable[str]) -> dict[str, float]:
    """Each field's median over ``rows`` (measurements of one configuration, one per
    round)."""
    got = list(rows)
    return {name: statistics.median(getattr(row, name) for row in got) for name in fields}
