"""Benchmark oipserve against Triton, MLServer, KServe and the in-process ORT floor.

One command runs everything side by side on this machine and writes
benchmarks/results/<date>.md (+ .json and PNG charts); see benchmarks/README.md.

    .venv/bin/python benchmarks/run.py            # full run, ~15 min
    .venv/bin/python benchmarks/run.py --quick    # one short round, smoke check

Run it with the interpreter that has oipserve installed: `--oipserve` defaults to
`<this interpreter> -m oipserve`, and the floor uses this interpreter's ONNX Runtime.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from oipbench import BENCH_DIR, REPO_DIR, RESULTS_DIR, WORK_DIR, procs, venvs  # noqa: E402
from oipbench.load import Measurement, grpc_check, run_grpc, run_wrk, wrk_version  # noqa: E402
from oipbench.models import ModelCase, build_models, outputs_match  # noqa: E402
from oipbench.payloads import (  # noqa: E402
    HttpBody,
    binary_body,
    grpc_spec,
    jpeg_body,
    json_body,
    post,
)
from oipbench.profiling import parse as parse_profile  # noqa: E402
from oipbench.profiling import record as record_profile  # noqa: E402
from oipbench.report import evaluate_goals, headline_table, render  # noqa: E402
from oipbench.scenarios import SCENARIOS, Scenario, aggregate  # noqa: E402
from oipbench.servers import (  # noqa: E402
    Server,
    Tuning,
    start_kserve,
    start_mlserver,
    start_oipserve,
    start_triton,
)

ALL_SERVERS = ["oipserve", "triton", "mlserver", "kserve", "mlserver-pw2"]
DEFAULT_SERVERS = ["oipserve", "triton", "mlserver", "kserve", "mlserver-pw2"]
# Waiting for other tenants of this shared machine to calm down (see Bench.wait_for_quiet).
QUIET_PCT = 40.0
QUIET_BUDGET_S = 120.0
QUIET_BUDGET_QUICK_S = 10.0
# Extra variants only run where their knob matters, to keep a full run near 15 minutes.
VARIANT_SCENARIOS = {"mlserver-pw2": {"tiny-json-c16", "matmul-grpc-c4"}}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one short round (smoke check)")
    p.add_argument(
        "--oipserve",
        default=f"{sys.executable} -m oipserve",
        help="command that runs oipserve (default: this interpreter -m oipserve)",
    )
    p.add_argument(
        "--baseline",
        metavar="CMD",
        help="command that runs a second oipserve (e.g. a checkout of an earlier commit: "
        "'env PYTHONPATH=DIR python -P -m oipserve'), measured in the same interleaved "
        "rounds as 'oipserve-base': an A/B of two builds in one run",
    )
    p.add_argument(
        "--http-workers",
        default="auto",
        metavar="N|auto|none",
        help="OIPSERVE_HTTP_WORKERS for every oipserve started (the candidate and --baseline): "
        "auto, as the README's command and the KServe runtimes run it (default); none leaves "
        "it unset (a build before 2026-11-28 refuses auto: give it a number or none)",
    )
    p.add_argument(
        "--servers",
        default=",".join(DEFAULT_SERVERS),
        help=f"comma list from {','.join(ALL_SERVERS)}",
    )
    p.add_argument("--scenarios", default="all", help="comma list of scenario keys, or all")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3, quick 1)")
    p.add_argument("--duration", type=int, help="seconds per measurement (default 3, quick 1)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up seconds before each")
    p.add_argument("--overload-seconds", type=int, help="default 10, quick 3")
    p.add_argument("--no-overload", action="store_true")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    p.add_argument("--instances", type=int, default=2, help="model instances / workers")
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--inter-op-threads", type=int, default=1)
    p.add_argument("--output", type=Path, help="results .md path (default results/<date>.md)")
    p.add_argument("--no-readme", action="store_true", help="do not update README.md")
    p.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS.json",
        help="only re-render the Markdown, charts (and README) of a saved run",
    )
    ns = p.parse_args()
    ns.rounds = ns.rounds or (1 if ns.quick else 3)
    ns.duration = ns.duration or (1 if ns.quick else 3)
    ns.overload_seconds = ns.overload_seconds or (3 if ns.quick else 10)
    return ns


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- preflight ----------------------------------------------------------------------------


def ensure_wrk() -> None:
    """wrk comes from Debian's packages; install it when running as root, else say how."""
    if shutil.which("wrk"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("installing wrk from Debian's packages")
        subprocess.run(["apt-get", "update", "-qq"], check=False, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False, timeout=600)
    if not shutil.which("wrk"):
        sys.exit("wrk is required: apt-get install wrk")


def raise_fd_limit() -> None:
    """Overload uses hundreds of connections; servers inherit this limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    osname = platform.platform()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip('"') + f" (kernel {platform.release()})"
    except OSError:
        pass
    return {
        "CPU": f"{cpu}, {os.cpu_count()} logical cores",
        "memory": mem,
        "OS": osname,
        "Python": platform.python_version(),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "GPU": "none (CPU execution provider only)",
    }


def git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(REPO_DIR),
                "status",
                "--porcelain",
                "--",
                "oipserve",
                "workers",
                "hardware",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


# --- the run ------------------------------------------------------------------------------


class Bench:
    """State of one harness run: servers, payloads, measurements."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.tuning = Tuning(ns.intra_op_threads, ns.inter_op_threads, ns.instances)
        self.work = WORK_DIR
        self.scratch = WORK_DIR / "scratch"
        self.servers: list[Server] = []
        self.measurements: list[Measurement] = []
        self.notes: list[str] = []
        self.overload: list[dict[str, Any]] = []
        self.profiles: list[dict[str, Any]] = []
        self.cases: dict[str, ModelCase] = {}
        self.bodies: dict[tuple[str, str], HttpBody] = {}
        self.specs: dict[str, Path] = {}
        self.versions: dict[str, str] = {}
        self.pythons: dict[str, Path] = {}
        self.floor_info: dict[str, Any] = {}
        self.check_notes: dict[tuple[str, str], str] = {}
        self.jpeg_expected: np.ndarray | None = None
        self.machine: dict[str, str] = {}
        self.quiet_samples: list[float] = []
        self.quiet_waited = 0.0

    # setup ------------------------------------------------------------------------------

    def setup_venvs(self, wanted: list[str]) -> None:
        ort = venvs.host_onnxruntime_version()
        reqs = venvs.requirements(ort)
        need = {"tools"} | {w.split("-")[0] for w in wanted if not w.startswith("oipserve")}
        for name in sorted(need):
            self.pythons[name] = venvs.ensure_venv(
                name, reqs[name], self.work / "logs" / f"pip-{name}.log"
            )
        self.versions["onnxruntime (all servers)"] = ort
        pk = {
            "mlserver": [
                "mlserver",
                "onnxruntime",
                "numpy",
                "uvloop",
                "fastapi",
                "uvicorn",
                "grpcio",
            ],
            "kserve": ["kserve", "onnxruntime", "numpy", "fastapi", "uvicorn", "grpcio"],
            "triton": ["nvidia-pytriton", "onnxruntime", "numpy"],
            "tools": ["grpcio", "tritonclient", "matplotlib", "py-spy"],
        }
        for name in sorted(need):
            got = venvs.package_versions(self.pythons[name], pk[name])
            self.versions[f"{name} venv"] = ", ".join(f"{k} {v}" for k, v in got.items())

    def build_payloads(self) -> None:
        self.cases = build_models(self.work / "models")
        payload_dir = self.work / "payloads"
        payload_dir.mkdir(parents=True, exist_ok=True)
        for name, case in self.cases.items():
            self.bodies[(name, "json")] = json_body(case, payload_dir / f"{name}.json")
            self.bodies[(name, "binary")] = binary_body(case, payload_dir / f"{name}.bin")
            self.specs[name] = grpc_spec(case, payload_dir)
        jpeg = self.make_jpeg(payload_dir / "image.jpg")
        if jpeg is not None:
            self.bodies[("image_nhwc_u8", "jpeg")] = jpeg_body(
                jpeg, "image", "mean", payload_dir / "image.jpeg.bin"
            )

    def make_jpeg(self, path: Path) -> bytes | None:
        """A 224x224 photo-like JPEG made with Pillow in the tools venv (and its mean)."""
        code = (
            "import sys, io, numpy as np\nfrom PIL import Image\n"
            "y, x = np.mgrid[0:224, 0:224]\nrng = np.random.default_rng(3)\n"
            "img = np.stack([x, y, (x + y) // 2], -1).astype(np.float32)\n"
            "img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)\n"
            "Image.fromarray(img).save(sys.argv[1], quality=90)\n"
            "dec = np.asarray(Image.open(sys.argv[1]).convert('RGB'), dtype=np.float64)\n"
            "print(*dec.mean(axis=(0, 1)))\n"
        )
        try:
            res = subprocess.run(
                [str(self.pythons["tools"]), "-c", code, str(path)],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            self.jpeg_expected = np.array([float(v) for v in res.stdout.split()])
            return path.read_bytes()
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            self.notes.append(f"JPEG payload could not be made: {exc}")
            return None

    def start_servers(self, wanted: list[str]) -> None:
        for key in wanted:
            log(f"starting {key}")
            if key == "oipserve":
                server = start_oipserve(self.ns.oipserve, self.cases, self.work, self.tuning)
            elif key == "oipserve-base":
                server = start_oipserve(
                    self.ns.baseline,
                    self.cases,
                    self.work,
                    self.tuning,
                    key="oipserve-base",
                    label="oipserve (baseline)",
                )
            elif key == "triton":
                server = start_triton(
                    self.pythons["triton"].parent.parent, self.cases, self.work, self.tuning
                )
            elif key.startswith("mlserver"):
                pw = self.tuning.instances if key == "mlserver-pw2" else 0
                server = start_mlserver(
                    self.pythons["mlserver"].parent.parent,
                    self.cases,
                    self.work,
                    self.tuning,
                    pw,
                    key,
                )
            elif key.startswith("kserve"):
                workers = self.tuning.instances if key == "kserve-w2" else 1
                server = start_kserve(
                    self.pythons["kserve"].parent.parent,
                    self.cases,
                    self.work,
                    self.tuning,
                    workers,
                    key,
                )
            else:
                raise ValueError(key)
            server.scenario_filter = VARIANT_SCENARIOS.get(key)
            if server.error:
                log(f"  {key} FAILED: {server.error.splitlines()[0]}")
                self.notes.append(
                    f"{server.label} did not start: " + " ".join(server.error.split())[:400]
                )
                server.stop()
            else:
                log(f"  {key} ready at {server.http_url}")
            self.servers.append(server)
        time.sleep(2)
        self.measure_idle()

    def measure_idle(self) -> None:
        """CPU the idle servers burn: all servers stay up during the run, so it is noise."""
        live = [s for s in self.servers if s.alive()]
        before = {s.key: procs.cpu_snapshot(s.root_pid()) for s in live}
        time.sleep(3)
        for s in live:
            total, _ = procs.cpu_delta(before[s.key], procs.cpu_snapshot(s.root_pid()))
            s.idle_cpu_pct = total

    def server_versions(self) -> None:
        for s in self.servers:
            if not s.alive():
                continue
            try:
                import urllib.request

                with urllib.request.urlopen(f"{s.http_url}/v2", timeout=3) as resp:
                    meta = json.loads(resp.read())
                s.versions = {"name": str(meta.get("name")), "version": str(meta.get("version"))}
                self.versions[f"{s.label} (/v2 metadata)"] = (
                    f"{meta.get('name')} {meta.get('version')}"
                )
            except (OSError, ValueError):
                pass

    # verification -----------------------------------------------------------------------

    def supports(self, server: Server, scen: Scenario) -> tuple[bool, str]:
        if server.scenario_filter is not None and scen.key not in server.scenario_filter:
            return False, ""
        if not server.alive():
            return False, "server not running"
        if scen.protocol not in server.protocols:
            return False, server.unsupported.get(scen.protocol, "not supported")
        if scen.protocol == "grpc" and not server.grpc_target:
            return False, server.unsupported.get("grpc", "no gRPC endpoint")
        if scen.protocol == "jpeg" and ("image_nhwc_u8", "jpeg") not in self.bodies:
            return False, "no JPEG payload"
        return True, ""

    def verify(self, server: Server, scen: Scenario) -> str:
        """One request through the same path as the load; '' when the answer is right."""
        key = (server.key, f"{scen.model}/{scen.protocol}")
        if key in self.check_notes:
            return self.check_notes[key]
        note = ""
        try:
            if scen.protocol == "grpc":
                res = grpc_check(
                    self.pythons["tools"],
                    str(server.grpc_target),
                    self.specs[scen.model],
                    self.scratch,
                )
                if not res.get("ok"):
                    note = f"gRPC not available: {str(res.get('error'))[:160]}"
                else:
                    got = {k: np.asarray(v) for k, v in res["outputs"].items()}  # type: ignore[union-attr]
                    why = outputs_match(self.cases[scen.model], got)
                    note = f"wrong gRPC answer: {why}" if why else ""
            elif scen.protocol == "jpeg":
                reply = post(server.infer_url(scen.model), self.bodies[(scen.model, "jpeg")])
                if reply.status != 200 or "mean" not in reply.outputs:
                    note = f"JPEG input not accepted (HTTP {reply.status}: {reply.text[:120]})"
                elif self.jpeg_expected is not None and not np.allclose(
                    reply.outputs["mean"].astype(np.float64), self.jpeg_expected, atol=3.0
                ):
                    note = "JPEG decoded to different pixels (mean off by > 3)"
            else:
                body = self.bodies[(scen.model, scen.protocol)]
                reply = post(server.infer_url(scen.model), body)
                if reply.status != 200:
                    note = f"HTTP {reply.status}: {reply.text[:160]}"
                else:
                    why = outputs_match(self.cases[scen.model], reply.outputs)
                    if why:
                        note = f"wrong answer: {why}"
                    elif scen.protocol == "binary" and not reply.binary_outputs:
                        self.notes.append(
                            f"{server.label} answered binary requests for "
                            f"{scen.model} with JSON outputs"
                        )
        except Exception as exc:  # a broken peer must not stop the run
            note = f"check failed: {exc!r}"[:200]
        self.check_notes[key] = note
        return note

    # measuring --------------------------------------------------------------------------

    def measure(self, server: Server, scen: Scenario, rnd: int) -> Measurement:
        ns = self.ns
        case = self.cases.get(scen.model)
        payload = case.tensor_bytes() if (case and scen.payload) else 0
        if scen.protocol == "grpc":
            return run_grpc(
                server.key,
                scen.key,
                rnd,
                self.pythons["tools"],
                str(server.grpc_target),
                self.specs[scen.model],
                scen.concurrency,
                ns.warmup,
                ns.duration,
                self.scratch,
                server.root_pid(),
                payload_bytes=payload,
            )
        body = self.bodies[(scen.model, scen.protocol)]
        url = server.infer_url(scen.model)
        if ns.warmup:
            run_wrk(
                server.key,
                scen.key,
                rnd,
                url,
                body,
                scen.concurrency,
                ns.warmup,
                self.scratch,
                server.root_pid(),
                rate=scen.rate,
            )
        return run_wrk(
            server.key,
            scen.key,
            rnd,
            url,
            body,
            scen.concurrency,
            ns.duration,
            self.scratch,
            server.root_pid(),
            payload_bytes=payload,
            rate=scen.rate,
        )

    def measure_floor(self, scen: Scenario, rnd: int, sessions: int) -> Measurement:
        """In-process ORT on the same model with the servers' session settings."""
        case = self.cases[scen.model]
        args = []
        for name, arr in case.inputs.items():
            path = self.work / "payloads" / f"{case.name}.{name}.npy"
            np.save(path, arr)
            args += ["--input", f"{name}={path}"]
        argv = [
            sys.executable,
            str(BENCH_DIR / "oipbench" / "floor.py"),
            "--model",
            str(case.onnx_path),
            *args,
            "--sessions",
            str(sessions),
            "--intra",
            str(self.tuning.intra_op_threads),
            "--inter",
            str(self.tuning.inter_op_threads),
            "--warmup",
            str(max(self.ns.warmup, 0.5)),
            "--duration",
            str(self.ns.duration),
        ]
        run = procs.run_client(argv, None, timeout_s=self.ns.duration + 60, work=self.scratch)
        m = Measurement("floor", scen.key, rnd, ok=False)
        try:
            data = json.loads(run.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            m.note = "floor failed: " + run.stderr[-200:]
            return m
        m.ok = True
        m.requests = data["requests"]
        m.duration_s = data["duration_s"]
        m.rps = m.requests / m.duration_s
        m.percentiles_ms = [(p, v / 1000.0) for p, v in data["percentiles_us"]]
        m.p50_ms = dict(m.percentiles_ms)[50]
        m.p99_ms = dict(m.percentiles_ms)[99]
        m.mean_ms = data["mean_us"] / 1000.0
        m.server_cpu_pct = 100.0 * data["cpu_s"] / m.duration_s
        m.client_cpu_pct = math.nan
        self.floor_info["ort_version"] = data.get("ort_version", "")
        return m

    def wait_for_quiet(self) -> None:
        """This machine is shared: before a batch of A B C measurements, wait (bounded) until
        other tenants use less than QUIET_PCT of a core, so one server is not measured in a
        busy moment and the next in a quiet one. The load seen is recorded either way."""
        budget = QUIET_BUDGET_QUICK_S if self.ns.quick else QUIET_BUDGET_S
        waited_here = 0.0
        while True:
            before = procs.machine_busy_seconds()
            time.sleep(1.0)
            load = 100.0 * (procs.machine_busy_seconds() - before)
            self.quiet_samples.append(load)
            if load <= QUIET_PCT or self.quiet_waited >= budget or waited_here >= 30:
                break
            if waited_here == 0:
                log(f"  other tenants use {load:.0f}% of a core; waiting for a quieter moment")
            waited_here += 1.0
            self.quiet_waited += 1.0

    def run_scenarios(self, scenarios: list[Scenario]) -> None:
        for scen in scenarios:
            active: list[Server] = []
            for server in self.servers:
                ok, why = self.supports(server, scen)
                if not ok:
                    if why:
                        self.measurements.append(
                            Measurement(server.key, scen.key, 0, ok=False, note=why)
                        )
                    continue
                note = self.verify(server, scen)
                if note:
                    log(f"  {scen.key} / {server.key}: skipped — {note}")
                    self.measurements.append(
                        Measurement(server.key, scen.key, 0, ok=False, note=note)
                    )
                    continue
                active.append(server)
            if not active:
                continue
            log(
                f"{scen.key}: " + " ".join(s.key for s in active) + (" floor" if scen.floor else "")
            )
            for rnd in range(self.ns.rounds):
                self.wait_for_quiet()
                # A B C, B C A, C A B: interleaved, and no server always goes first after the
                # quiet-wait.
                shift = rnd % len(active)
                for server in active[shift:] + active[:shift]:
                    if not server.alive():
                        continue
                    m = self.measure(server, scen, rnd)
                    self.measurements.append(m)
                    log(
                        f"  r{rnd} {server.key:13s} {m.rps:9,.0f} req/s  p50 {m.p50_ms:7.2f} "
                        f"p99 {m.p99_ms:7.2f} ms  err {m.errors}  client {m.client_cpu_pct:4.0f}%"
                        f"  server {m.server_cpu_pct:4.0f}% {m.note[:80]}"
                    )
                if scen.floor:
                    m = self.measure_floor(scen, rnd, self.tuning.instances)
                    self.measurements.append(m)
                    log(f"  r{rnd} {'floor':13s} {m.rps:9,.0f} calls/s p50 {m.p50_ms:7.2f} ms")

    def run_tiny_floor(self) -> None:
        """Per-call cost of the tiny model in-process, for context in the notes."""
        scen = Scenario("tiny-floor", "", "simple", "json", 1)
        m = self.measure_floor(scen, 0, 1)
        if m.ok:
            self.notes.append(
                f"In-process ONNX Runtime, tiny model, one session: {m.rps:,.0f} calls/s, "
                f"p50 {1000 * m.p50_ms:.0f} µs per call (the floor under every tiny figure)."
            )

    def run_overload(self) -> None:
        """2× each server's saturating tiny-JSON rate for a bounded time."""
        scen_key = "tiny-json-c16"
        connections, timeout_s = 256, 2.0
        for server in self.servers:
            if server.scenario_filter is not None or not server.alive():
                continue
            runs = [
                m.rps
                for m in self.measurements
                if m.server == server.key and m.scenario == scen_key and m.ok
            ]
            if not runs:
                continue
            # Re-measure saturation just before: the median may come from a disturbed moment.
            self.wait_for_quiet()
            probe = run_wrk(
                server.key,
                "saturation-probe",
                0,
                server.infer_url("simple"),
                self.bodies[("simple", "json")],
                16,
                self.ns.duration,
                self.scratch,
                server.root_pid(),
            )
            sat = max(float(np.median(runs)), probe.rps)
            offered = 2.0 * sat
            dur = self.ns.overload_seconds
            log(f"overload {server.key}: offering {offered:,.0f} req/s for {dur} s")
            body = self.bodies[("simple", "json")]
            m = run_wrk(
                server.key,
                "overload",
                0,
                server.infer_url("simple"),
                body,
                connections,
                dur,
                self.scratch,
                server.root_pid(),
                timeout_s=timeout_s,
                count_status=True,
                max_requests=int(offered * dur * 1.5),
                rate=offered,
            )
            ready_after = procs.wait_until(
                lambda s=server: procs.http_status(s.ready_url(), 1.0) == 200, 10.0
            )
            ok_count = sum(v for k, v in m.status.items() if k.startswith("2"))
            ok_rps = ok_count / m.duration_s if m.duration_s else 0.0
            timeouts = m.socket_errors.get("timeout", 0)
            bounded = bool(
                m.ok
                and ready_after
                and not math.isnan(m.p99_ms)
                and m.p99_ms < timeout_s * 1000
                and timeouts <= 0.01 * max(m.requests, 1)
                and ok_rps >= 0.5 * sat
            )
            statuses = ", ".join(f"{k}: {v}" for k, v in sorted(m.status.items()))
            sock = ", ".join(f"{k}: {v}" for k, v in m.socket_errors.items() if k != "status")
            verdict = (
                f"{ok_rps:,.0f} 2xx/s of {offered:,.0f} offered (saturating {sat:,.0f}); "
                f"p99 {m.p99_ms:.1f} ms; statuses {statuses or '—'}; "
                f"socket errors {sock or 'none'}; ready after: "
                f"{'yes' if ready_after else 'NO'}"
            )
            self.overload.append(
                {
                    "server": server.key,
                    "saturating_rps": sat,
                    "offered_rps": offered,
                    "rps": m.rps,
                    "ok_rps": ok_rps,
                    "statuses": statuses,
                    "socket_errors": sock,
                    "p50_ms": m.p50_ms,
                    "p99_ms": m.p99_ms,
                    "ready_after": ready_after,
                    "bounded": bounded,
                    "duration_s": dur,
                    "connections": connections,
                    "timeout_s": timeout_s,
                    "verdict_text": verdict,
                    "client_cpu_pct": m.client_cpu_pct,
                    "note": m.note,
                }
            )
            log(f"  {verdict}")
            time.sleep(2)

    def run_profiles(self, scenarios: list[Scenario]) -> None:
        """py-spy on oipserve while wrk loads it (tiny JSON, 1 MiB, compute-bound): first the
        whole process tree in Python frames, then the front process with native frames, which
        shows the syscalls and C code that Python-only sampling folds into their callers."""
        server = next((s for s in self.servers if s.key == "oipserve" and s.alive()), None)
        py_spy = self.pythons["tools"].parent / "py-spy"
        if server is None or not py_spy.exists():
            return
        wanted = {"tiny-json-c1", "tiny-json-c16", "matmul-binary-c4", "mib-binary-c4"}
        tree_s, native_s = (2, 2) if self.ns.quick else (4, 3)
        for scen in scenarios:
            if scen.key not in wanted or self.verify(server, scen):
                continue
            log(f"profiling oipserve under {scen.key}")
            folder = self.work / "profiles"
            folder.mkdir(parents=True, exist_ok=True)
            tree_raw = folder / f"{scen.key}.tree.txt"
            native_raw = folder / f"{scen.key}.native.txt"
            load = threading.Thread(
                target=run_wrk,
                args=(
                    server.key,
                    scen.key,
                    0,
                    server.infer_url(scen.model),
                    self.bodies[(scen.model, scen.protocol)],
                    scen.concurrency,
                    tree_s + native_s + 3,
                    self.work / "scratch-profile",
                    server.root_pid(),
                ),
            )
            load.start()
            time.sleep(1.0)
            errors = [
                record_profile(py_spy, server.root_pid(), tree_s, tree_raw),
                record_profile(
                    py_spy, server.root_pid(), native_s, native_raw, native=True, rate=100
                ),
            ]
            load.join(timeout=tree_s + native_s + 40)
            entry: dict[str, Any] = {
                "scenario": scen.key,
                "tree_s": tree_s,
                "native_s": native_s,
                "note": "; ".join(e for e in errors if e),
                "processes": [],
                "front_native": None,
            }
            if tree_raw.exists():
                for p in parse_profile(tree_raw)[:4]:
                    entry["processes"].append(
                        {"pid": p.pid, "cmd": p.cmd, "samples": p.samples, "top": p.top(8)}
                    )
            if native_raw.exists():
                front = parse_profile(native_raw, server.root_pid(), "front")
                if front:
                    entry["front_native"] = {
                        "samples": front[0].samples,
                        "idle": front[0].idle,
                        "top": front[0].top_with_callers(8),
                    }
            self.profiles.append(entry)

    def stop_all(self) -> None:
        for s in self.servers:
            s.stop()


def summarise(bench: Bench, scenarios: list[Scenario], started: float, stamp: str) -> dict:
    ns = bench.ns
    keys = [s.key for s in bench.servers]
    if any(m.server == "floor" for m in bench.measurements):
        keys.append("floor")
    cells = []
    for scen in scenarios:
        for key in keys:
            if not any(m.server == key and m.scenario == scen.key for m in bench.measurements):
                continue
            cell = aggregate(bench.measurements, key, scen.key)
            cells.append(cell.__dict__)
    servers = [
        {
            "key": s.key,
            "label": s.label,
            "settings": s.settings,
            "error": s.error,
            "unsupported": s.unsupported,
            "idle_cpu_pct": s.idle_cpu_pct,
            "scenario_filter": sorted(s.scenario_filter) if s.scenario_filter else None,
        }
        for s in bench.servers
    ]
    if "floor" in keys:
        servers.append(
            {
                "key": "floor",
                "label": "in-process ORT (floor)",
                "settings": [
                    f"{bench.tuning.instances} ORT sessions (intra="
                    f"{bench.tuning.intra_op_threads}, inter="
                    f"{bench.tuning.inter_op_threads}), each called back to back by its own "
                    "Python thread in one process; same model file and input; no server"
                ],
                "error": "",
                "unsupported": {},
                "idle_cpu_pct": None,
            }
        )
    floor_cell = next(
        (
            c
            for c in cells
            if c["server"] == "floor"
            and c["runs"]
            and c["scenario"].startswith("matmul-")
            and not c["scenario"].startswith("matmul-batched")
        ),
        None,
    )
    floor_b1 = next(
        (c for c in cells if c["server"] == "floor" and c["runs"]
         and c["scenario"] == "matmul-batched-c16"),
        None,
    )  # fmt: skip
    summary: dict[str, Any] = {
        "title": f"{stamp} ({'quick' if ns.quick else 'full'} run)",
        "command": " ".join([Path(sys.executable).name, "benchmarks/run.py", *sys.argv[1:]]),
        "rounds": ns.rounds,
        "duration_s": ns.duration,
        "warmup_s": ns.warmup,
        "wall_min": (time.monotonic() - started) / 60.0,
        "machine": bench.machine,
        "versions": bench.versions,
        "tuning": bench.tuning.__dict__,
        "servers": servers,
        "scenarios": [s.__dict__ | {"label": s.label} for s in scenarios],
        "cells": cells,
        "floor": ({"matmul": floor_cell} if floor_cell else {})
        | ({"matmul-batch1": floor_b1} if floor_b1 else {}),
        "overload": bench.overload,
        "profiles": bench.profiles,
        "notes": bench.notes,
        "method": [
            "All servers run at once, each started by the harness on 127.0.0.1 with the same "
            "model files; idle servers use ~0% CPU (listed under Settings).",
            "Scenario by scenario, servers are interleaved, the order rotating each round "
            "(A B C, B C A, C A B), and the median over rounds is reported: drift on this shared "
            "machine is 30-40% from run to run, ratios measured side by side hold better. "
            f"Before each batch the harness waits (at most {QUIET_BUDGET_S:.0f} s per run) "
            f"until other tenants use less than {QUIET_PCT:.0f}% of a core.",
            "HTTP load: wrk (one thread) with `benchmarks/lua/oip.lua`, body sent verbatim "
            "from a file; latency percentiles from wrk's histogram via the Lua `done()` hook. "
            f"Each measurement is {ns.duration} s after a {ns.warmup} s warm-up run; "
            "bounded by wrk's -d and a 5 s per-request timeout.",
            "gRPC load: `benchmarks/oipbench/grpc_client.py`, up to 2 processes × asyncio "
            "tasks, ModelInferRequest serialised once (raw_input_contents), replies not parsed; "
            "bounded in seconds and requests.",
            "Every server's answer is checked once per model and transport against in-process "
            "ORT before it is measured; a wrong answer or an unsupported transport is listed "
            "instead of measured.",
            "Client CPU: wrk's rusage from wait4 (whole run) or the gRPC workers' process time "
            "over the window; server CPU: psutil over the server's process tree.",
            "Only the loopback interface is used; every server is killed by process group at "
            "the end, also on errors.",
        ],
    }
    others = [
        m.other_cpu_pct for m in bench.measurements if m.ok and not math.isnan(m.other_cpu_pct)
    ]
    other_median = float(np.median(others)) if others else math.nan
    quiet = float(np.median(bench.quiet_samples)) if bench.quiet_samples else math.nan
    summary["machine"]["other tenants' CPU during measurements (median)"] = (
        f"{other_median:.0f}% of a core; before batches: {quiet:.0f}% (waited "
        f"{bench.quiet_waited:.0f} s in all for quieter moments, threshold {QUIET_PCT:.0f}%)"
    )
    summary["goals"] = evaluate_goals(summary)
    if other_median > 50:
        summary["headline_note"] = (
            f"Other tenants of this shared machine used a median {other_median:.0f}% of a core "
            "(of 200%) while this run measured: every figure was squeezed and the ratios are "
            "less reliable than usual (see the *other CPU* column and ‡ marks)."
        )
    oip = next((s for s in bench.servers if s.key == "oipserve"), None)
    if oip is None or oip.error:
        summary["headline_note"] = (
            "oipserve is NOT in this run ("
            + ("not requested" if oip is None else "it did not start; see Notes")
            + "): the figures compare the peers only, and no goal could be judged."
        )
    return summary


def _free_name(folder: Path, stem: str) -> Path:
    """results/<date>.md, or <date>-2.md, -3 … so a second run the same day keeps the first."""
    path, n = folder / f"{stem}.md", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.md"
    return path


def write_outputs(bench: Bench, summary: dict[str, Any], stamp: str) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    suffix = "-quick" if bench.ns.quick else ""
    base = bench.ns.output or _free_name(RESULTS_DIR, f"{stamp}{suffix}")
    base = base.resolve()
    stem = base.with_suffix("")
    thr, lat = Path(f"{stem}-throughput.png"), Path(f"{stem}-latency.png")
    json_path = base.with_suffix(".json")
    summary["charts"] = [
        ("Throughput by server and scenario", thr.name),
        ("Latency distribution", lat.name),
    ]
    json_path.write_text(json.dumps(summary, indent=1, default=str))
    res = subprocess.run(
        [
            str(bench.pythons["tools"]),
            str(BENCH_DIR / "oipbench" / "charts.py"),
            str(json_path),
            str(thr),
            str(lat),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode != 0:
        summary["charts"] = []
        summary["notes"].append("charts failed: " + res.stderr[-300:])
        json_path.write_text(json.dumps(summary, indent=1, default=str))
    base.write_text(render(summary) + "\n")
    (json_path.parent / f"{stem.name}.measurements.json").write_text(
        json.dumps([m.to_json() for m in bench.measurements], indent=0, default=str)
    )
    if not bench.ns.quick and not bench.ns.no_readme and bench.ns.output is None:
        update_readme(summary, base)
    return base


def update_readme(summary: dict[str, Any], results: Path) -> None:
    """Replace the block between the results markers in README.md with this run's table."""
    readme = BENCH_DIR / "README.md"
    if not readme.exists():
        return
    text = readme.read_text()
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    if start not in text or end not in text:
        return
    rel = results.relative_to(BENCH_DIR)
    charts = "\n\n".join(f"![{t}](results/{p})" for t, p in summary.get("charts", []))
    block = (
        f"{start}\nLatest full run: [{rel}]({rel}) — {summary['title']}"
        + (f"\n\n> {summary['headline_note']}" if summary.get("headline_note") else "")
        + f"\n\n{headline_table(summary)}\n\n{charts}\n{end}"
    )
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    readme.write_text(head + block + tail)


def rerender(ns: argparse.Namespace) -> None:
    """Rebuild goals, Markdown, charts and the README block from a saved results JSON."""
    summary = json.loads(ns.render.read_text())
    summary["goals"] = evaluate_goals(summary)
    base = ns.render.resolve().with_suffix(".md")
    stem = base.with_suffix("")
    thr, lat = Path(f"{stem}-throughput.png"), Path(f"{stem}-latency.png")
    tools = venvs.venv_python("tools")
    res = subprocess.run(
        [str(tools), str(BENCH_DIR / "oipbench" / "charts.py"), str(ns.render), str(thr), str(lat)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode != 0:
        print(res.stderr[-500:], file=sys.stderr)
    ns.render.write_text(json.dumps(summary, indent=1, default=str))
    base.write_text(render(summary) + "\n")
    if not ns.no_readme and "quick" not in base.name:
        update_readme(summary, base)
    log(f"re-rendered {base}")


def main() -> None:
    ns = parse_args()
    if ns.render:
        rerender(ns)
        return
    started = time.monotonic()
    stamp = dt.date.today().isoformat()
    procs.install_signal_cleanup()
    ensure_wrk()
    raise_fd_limit()
    wanted = [s.strip() for s in ns.servers.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in ALL_SERVERS + ["kserve-w2"]]
    if unknown:
        sys.exit(f"unknown server(s): {unknown}")
    if ns.baseline:
        wanted.insert(wanted.index("oipserve") + 1 if "oipserve" in wanted else 0, "oipserve-base")
    scenarios = (
        SCENARIOS
        if ns.scenarios == "all"
        else [s for s in SCENARIOS if s.key in ns.scenarios.split(",")]
    )
    if ns.http_workers != "none":
        # NOTE: read by every oipserve the harness starts (servers.start_oipserve passes
        #   its environment on); the flag is not given, so the variable decides.
        os.environ["OIPSERVE_HTTP_WORKERS"] = ns.http_workers
    bench = Bench(ns)
    bench.machine = machine_info()
    fronts = "" if ns.http_workers == "none" else f", OIPSERVE_HTTP_WORKERS={ns.http_workers}"
    bench.versions["oipserve"] = f"git {git_rev()} (`{ns.oipserve}`{fronts})"
    if ns.baseline:
        bench.versions["oipserve (baseline)"] = f"`{ns.baseline}`"
    bench.versions["wrk"] = wrk_version()
    try:
        log("setting up venvs")
        bench.setup_venvs(wanted)
        log("building models and payloads")
        bench.build_payloads()
        bench.start_servers(wanted)
        bench.server_versions()
        bench.run_tiny_floor()
        bench.run_scenarios(scenarios)
        if not ns.no_overload:
            bench.run_overload()
        if not ns.no_profile:
            bench.run_profiles(scenarios)
    finally:
        log("stopping servers")
        bench.stop_all()
    summary = summarise(bench, scenarios, started, stamp)
    out = write_outputs(bench, summary, stamp)
    log(f"wrote {out}")
    for g in summary["goals"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[g["met"]]
        log(f"  {verdict:12s} {g['goal']}: {g['measured']}")


if __name__ == "__main__":
    main()
