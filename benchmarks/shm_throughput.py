"""System shared memory vs the binary extension, oipserve vs Triton, in one interleaved run.

FP32 round trips through ``identity_fp32`` (issue #14, "Measured"): for each size, each
server and each mode,

- ``shm``: the input and the output both lie in POSIX shared-memory regions that the
  client made with ``tritonclient.utils.shared_memory`` and registered once; a request
  is a small JSON body naming the regions, and the answer carries no tensor bytes;
- ``binary``: the binary tensor extension, the tensor in the request body and the
  output in the response body (bodies built once, before timing, as
  ``binary_throughput.py`` does; its request builder and loop are reused).

Servers: oipserve (``--allow-client-shm true``) and Triton (``tritonserver`` 2.51 from
nvidia-pytriton, python backend running ONNX Runtime on the same .onnx, started by
``oipbench.servers.start_triton`` exactly as ``run.py`` starts it), optionally a second
oipserve build (``--baseline CMD``) for an A/B in the same run. The rounds alternate
servers and modes (the order rotates every round), so a busy moment of this shared
machine hits every case alike; claims are the ratios of one round, medians over rounds.

    python benchmarks/shm_throughput.py [--sizes 1M,64M] [--rounds 3] [--seconds 3]
        [--baseline "env PYTHONPATH=../base python -P -m oipserve"] [--output FILE.md]

MB/s counts input plus output tensor bytes (MB = 10^6 bytes) over the wall time of
sequential requests on one keep-alive connection from one client on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from binary_throughput import parse_size, run_case, show_size, timed_posts  # noqa: E402
from oipbench import VENVS_DIR, WORK_DIR, procs  # noqa: E402
from oipbench.models import build_models  # noqa: E402
from oipbench.servers import Server, Tuning, start_oipserve, start_triton  # noqa: E402

MODEL = "identity_fp32"
MODES = ("shm", "binary")
#: The issue's goals, at 64 MiB.
GOAL_SIZE = 64 << 20
TRITON_RATIO_GOAL = 1.5
MBPS_GOAL = 5000.0  # 5 GB/s, input + output bytes


@dataclass
class Regions:
    """One server's input and output regions for one size (tritonclient's helpers)."""

    size: int
    array: np.ndarray
    names: tuple[str, str]
    keys: tuple[str, str]
    handles: tuple[object, object]
    body: bytes = b""

    def destroy(self) -> None:
        for handle in self.handles:
            try:
                shm.destroy_shared_memory_region(handle)
            except Exception as exc:  # noqa: BLE001 - cleanup must go on
                print(f"[cleanup] {exc}", file=sys.stderr)


@dataclass
class Target:
    """A started server under test and its regions per size."""

    key: str
    label: str
    server: Server
    regions: dict[int, Regions] = field(default_factory=dict)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.http_url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)


@dataclass
class Case:
    """One measured (round, server, size, mode)."""

    rnd: int
    key: str
    size: int
    mode: str
    times: list[float]
    server_cpu: float  # % of one core, the server's whole process tree
    other_cpu: float  # % of one core used by everything else on the machine

    @property
    def mbps(self) -> float:
        return 2 * self.size * len(self.times) / sum(self.times) / 1e6


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def shm_body(regions: Regions) -> bytes:
    """The request naming both regions (what tritonclient's ``set_shared_memory`` writes)."""
    inp, out = regions.names
    return json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": list(regions.array.shape),
                    "datatype": "FP32",
                    "parameters": {
                        "shared_memory_region": inp,
                        "shared_memory_byte_size": regions.size,
                    },
                }
            ],
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "parameters": {
                        "shared_memory_region": out,
                        "shared_memory_byte_size": regions.size,
                    },
                }
            ],
        }
    ).encode()


def make_regions(target: Target, size: int, array: np.ndarray) -> Regions:
    """Create, fill and register the input and output regions with tritonclient."""
    tag = uuid.uuid4().hex[:8]
    names = (f"in-{target.key}-{tag}", f"out-{target.key}-{tag}")
    keys = (f"/shmbench-in-{tag}", f"/shmbench-out-{tag}")
    handles = tuple(
        shm.create_shared_memory_region(n, k, size) for n, k in zip(names, keys, strict=True)
    )
    regions = Regions(size, array, names, keys, handles)  # type: ignore[arg-type]
    shm.set_shared_memory_region(handles[0], [array])
    client = httpclient.InferenceServerClient(target.server.http_url.removeprefix("http://"))
    try:
        for name, key in zip(names, keys, strict=True):
            client.register_system_shared_memory(name, key, size)
    finally:
        client.close()
    regions.body = shm_body(regions)
    return regions


def run_shm(
    address: tuple[str, int], regions: Regions, seconds: float, max_requests: int
) -> list[float]:
    """Sequential shm requests on one connection; the first one (untimed) is checked."""
    out = shm.get_contents_as_numpy(regions.handles[1], np.float32, list(regions.array.shape))
    out.fill(np.nan)
    conn = http.client.HTTPConnection(*address, timeout=300)
    path = f"/v2/models/{MODEL}/infer"
    headers = {"Content-Type": "application/json"}
    times: list[float] = []
    try:
        conn.request("POST", path, body=regions.body, headers=headers)
        resp = conn.getresponse()
        answer = resp.read()
        if resp.status != 200:
            raise SystemExit(f"shm {regions.size} B: HTTP {resp.status}: {answer[:300]!r}")
        if not np.array_equal(out, regions.array):
            raise SystemExit(f"shm {regions.size} B: the output region differs from the input")
        del out
        times = timed_posts(conn, path, regions.body, headers, seconds, max_requests, "shm")
    finally:
        conn.close()
    return times


def measure(target: Target, size: int, mode: str, rnd: int, ns: argparse.Namespace) -> Case:
    regions = target.regions[size]
    before = procs.cpu_snapshot(target.server.root_pid())
    own = time.process_time()
    if mode == "shm":
        times = run_shm(target.address, regions, ns.seconds, ns.max_requests)
    else:
        times = run_case(target.address, "binary", regions.array, ns.seconds, ns.max_requests)
    own = time.process_time() - own
    after = procs.cpu_snapshot(target.server.root_pid())
    server_cpu, _ = procs.cpu_delta(before, after)
    wall = max(after.at - before.at, 1e-9)
    other = procs.machine_cpu_pct(before, after) - server_cpu - 100.0 * own / wall
    case = Case(rnd, target.key, size, mode, times, server_cpu, max(other, 0.0))
    log(
        f"round {rnd + 1} {target.label:<20} {show_size(size):>6} {mode:<6} "
        f"n={len(times):<5} {case.mbps:8.0f} MB/s  p50 {np.percentile(times, 50) * 1e3:7.2f} ms"
        f"  server {server_cpu:4.0f}%  other {case.other_cpu:4.0f}%"
    )
    return case


# --- report ---------------------------------------------------------------------------


def _median_range(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def paired(
    cases: list[Case], size: int, a: tuple[str, str], b: tuple[str, str], p50: bool = False
) -> list[float]:
    """MB/s ratio a/b of each round (same round: the same moment of the machine), or with
    ``p50`` the ratio of b's median latency to a's (> 1: a is faster), which stalls caused
    by the machine's other jobs move less than they move MB/s."""
    out = []
    for rnd in sorted({c.rnd for c in cases}):
        got = {
            (c.key, c.mode): float(np.percentile(c.times, 50)) if p50 else c.mbps
            for c in cases
            if c.rnd == rnd and c.size == size and (c.key, c.mode) in (a, b)
        }
        if a in got and b in got:
            out.append(got[b] / got[a] if p50 else got[a] / got[b])
    return out


def report(targets: list[Target], cases: list[Case], sizes: list[int]) -> tuple[str, bool]:
    labels = {t.key: t.label for t in targets}
    lines = [
        "| size | server | mode | requests | MB/s (in+out), median (range) of rounds | "
        "p50 ms | p99 ms | server CPU % | other CPU % |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        for t in targets:
            for mode in MODES:
                rows = [c for c in cases if c.key == t.key and c.size == size and c.mode == mode]
                if not rows:
                    continue
                times = [x for c in rows for x in c.times]
                p50, p99 = np.percentile(times, [50, 99]) * 1e3
                lines.append(
                    f"| {show_size(size)} | {t.label} | {mode} | {len(times)} | "
                    f"{_median_range([c.mbps for c in rows], ',.0f')} | {p50:.2f} | {p99:.2f} | "
                    f"{statistics.median(c.server_cpu for c in rows):.0f} | "
                    f"{statistics.median(c.other_cpu for c in rows):.0f} |"
                )
    lines += [
        "",
        "| size | a / b | MB/s a ÷ MB/s b, same round: median (range) "
        "| p50 b ÷ p50 a, same round: median (range) |",
        "|---|---|---:|---:|",
    ]
    keys = [t.key for t in targets]
    pairs = []
    if "triton" in keys:
        pairs += [(("oipserve", "shm"), ("triton", "shm"))]
        pairs += [(("oipserve", "binary"), ("triton", "binary"))]
    if "oipserve-base" in keys:
        pairs += [(("oipserve", "shm"), ("oipserve-base", "shm"))]
    pairs += [((k, "shm"), (k, "binary")) for k in keys]
    for size in sizes:
        for a, b in pairs:
            ratios = paired(cases, size, a, b)
            if ratios:
                lines.append(
                    f"| {show_size(size)} | {labels[a[0]]} {a[1]} / {labels[b[0]]} {b[1]} | "
                    f"{_median_range(ratios, '.2f')}× | "
                    f"{_median_range(paired(cases, size, a, b, p50=True), '.2f')}× |"
                )
    ok = True
    big = GOAL_SIZE
    if big not in sizes:
        return "\n".join(lines), ok
    lines += ["", "| goal | measured | verdict |", "|---|---|---|"]
    if "triton" in keys:
        ratios = paired(cases, big, ("oipserve", "shm"), ("triton", "shm"))
        met = bool(ratios) and statistics.median(ratios) >= TRITON_RATIO_GOAL
        ok &= met
        lines.append(
            f"| {show_size(big)}: oipserve shm MB/s ≥ {TRITON_RATIO_GOAL}× Triton shm | "
            f"{_median_range(ratios, '.2f')}× | {'**met**' if met else '**MISSED**'} |"
        )
    mine = [c.mbps for c in cases if c.key == "oipserve" and c.size == big and c.mode == "shm"]
    met = bool(mine) and statistics.median(mine) >= MBPS_GOAL
    ok &= met
    lines.append(
        f"| {show_size(big)}: oipserve shm ≥ {MBPS_GOAL:,.0f} MB/s (in+out) | "
        f"{_median_range(mine, ',.0f')} MB/s | {'**met**' if met else '**MISSED**'} |"
    )
    return "\n".join(lines), ok


# --- main -----------------------------------------------------------------------------


def start(ns: argparse.Namespace, work: Path, cases: dict, tuning: Tuning) -> list[Target]:
    flags = ["--allow-client-shm", "true"]
    targets = []
    wanted = [("oipserve", ns.oipserve, "oipserve")]
    if ns.baseline:
        wanted.append(("oipserve-base", ns.baseline, "oipserve (baseline)"))
    for key, cmd, label in wanted:
        log(f"starting {label}: {cmd}")
        server = start_oipserve(cmd, cases, work, tuning, key=key, label=label, extra_args=flags)
        targets.append(Target(key, label, server))
    if not ns.no_triton:
        venv = Path(ns.triton_venv)
        if not (venv / "bin" / "python").exists():
            raise SystemExit(f"no Triton venv at {venv}: run benchmarks/run.py once to make it")
        log(f"starting Triton from {venv}")
        targets.append(Target("triton", "Triton 2.51", start_triton(venv, cases, work, tuning)))
    for t in targets:
        if t.server.error or not t.server.http_url:
            raise SystemExit(f"{t.label} did not start: {t.server.error}")
    return targets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,64M", help="tensor sizes in bytes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per case")
    parser.add_argument("--max-requests", type=int, default=3000, help="cap per case")
    parser.add_argument("--oipserve", default=f"{sys.executable} -m oipserve")
    parser.add_argument("--baseline", default="", help="a second oipserve command (A/B)")
    parser.add_argument("--triton-venv", default=str(VENVS_DIR / "triton"))
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--output", type=Path, help="also write the report (markdown) here")
    ns = parser.parse_args()
    procs.install_signal_cleanup()
    sizes = [parse_size(s) for s in ns.sizes.split(",")]
    work = WORK_DIR / "shm"
    models = build_models(work / "models")
    cases = {MODEL: models[MODEL]}
    tuning = Tuning(instances=ns.instances)
    rng = np.random.default_rng(0)
    arrays = {s: rng.standard_normal(s // 4, dtype=np.float32).reshape(1, -1) for s in sizes}
    targets = start(ns, work, cases, tuning)
    results: list[Case] = []
    try:
        for t in targets:
            for size in sizes:
                t.regions[size] = make_regions(t, size, arrays[size])
        order = [(t, mode) for t in targets for mode in MODES]
        for rnd in range(ns.rounds):
            turn = order[rnd % len(order) :] + order[: rnd % len(order)]
            for size in sizes:
                for t, mode in turn:
                    results.append(measure(t, size, mode, rnd, ns))
    finally:
        for t in targets:
            for regions in t.regions.values():
                regions.destroy()
            t.server.stop()
    text, ok = report(targets, results, sizes)
    head = (
        f"`{shlex.join([Path(sys.executable).name, *sys.argv])}`: {ns.rounds} rounds × "
        f"{ns.seconds:g} s a case, {os.cpu_count()} logical cores, instances {ns.instances}"
    )
    print(head + "\n\n" + text)
    if ns.output:
        ns.output.write_text(head + "\n\n" + text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
