"""What moves oipserve's tiny-JSON ratio to Triton: one variable changed at a time (issue #40).

The harness's tiny JSON row (`simple`: two INT32 [1,16] inputs, two outputs, two instances,
`lua/oip.lua`) and a plain `wrk` run on a one-input FP32 model with one instance read
differently against Triton. This script measures the steps between the two as interleaved
A/Bs of oipserve in its default configuration (``OIPSERVE_HTTP_WORKERS=auto``, as the
harness runs it) against Triton 2.51 started as the harness starts it:

- ``a``: the harness's row exactly: `simple`, 2 instances, the harness's wrk script;
- ``b``: the same with 1 instance each;
- ``i32``: a one-input / one-output INT32 [1,16] identity, 1 instance, the harness's script;
- ``c``: a one-input / one-output FP32 [1,16] identity, 1 instance, the harness's script;
- ``d``: ``c`` with a plain wrk script (the body fixed in the script, no hooks), same flags;
- ``e``: ``d`` with wrk as typed by hand: its default 2 threads and 2 s timeout;
- ``np``: ``c`` with oipserve's busy polling off (front and workers);
- ``a1``, ``d1``: ``a`` and ``d`` with one front (``--http-workers 1``, the default until
  2026-11-28, which the issue's figures were taken with).

    .venv/bin/python benchmarks/row_factors.py --rounds 3 --concurrency 16,1
    .venv/bin/python benchmarks/row_factors.py --factors a,b,c,d --retries 2 --max-other 60

Each pair records the other tenants' CPU while it ran; ``--max-other`` / ``--retries``
measure a pair again when that was above the limit, and the table keeps the pairs within
it (all pairs, said so, when none was). ``--render FILE`` prints the table of a saved run.

Servers, bodies, the wrk runner and the CPU accounting are the harness's own
(`oipbench.servers`, `oipbench.payloads`, `oipbench.load.run_wrk`, `oipbench.procs`); it needs
Triton's venv from one `benchmarks/run.py` run. Every server (an oipserve per instance count
and flag set, a Triton per instance count) runs for the whole measurement; each round visits
every factor (the order rotating) and, within it, oipserve then Triton or Triton then
oipserve (alternating), so drift on this shared machine falls on both sides of each ratio.
Prints a Markdown table of medians and writes the raw measurements to ``--save``
(``benchmarks/.work/row-factors/measurements.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import numpy as np  # noqa: E402
from oipbench import WORK_DIR, procs  # noqa: E402
from oipbench.load import Measurement, run_wrk  # noqa: E402
from oipbench.models import ModelCase, load_build_module, outputs_match, reference_outputs  # noqa: E402
from oipbench.payloads import HttpBody, json_body, post  # noqa: E402
from oipbench.servers import Server, Tuning, start_oipserve, start_triton  # noqa: E402

WORK = WORK_DIR / "row-factors"
TRITON_VENV = BENCH / ".venvs" / "triton"
QUIET_PCT = 40.0  # as run.py: wait (bounded) for other tenants to drop below this


@dataclass(frozen=True)
class Factor:
    """One row of the comparison: model, instances per model, load script."""

    key: str
    what: str
    model: str
    instances: int
    script: str  # harness | plain | plain-defaults
    #: Flags for this factor's oipserve beyond the harness's (e.g. busy polling off); Triton
    #: is the same for every factor of an instance count.
    args: tuple[str, ...] = ()


FACTORS = [
    Factor("a", "`simple` (2 INT32 in, 2 out), 2 instances, harness script", "simple", 2,
           "harness"),
    Factor("b", "`simple`, 1 instance", "simple", 1, "harness"),
    Factor("i32", "1 INT32 [1,16] in, 1 out (identity), 1 instance", "identity_int32", 1,
           "harness"),
    Factor("c", "1 FP32 [1,16] in, 1 out (identity), 1 instance", "identity_fp32", 1,
           "harness"),
    Factor("d", "`c` with a plain wrk script (fixed body), same flags", "identity_fp32", 1,
           "plain"),
    Factor("e", "`d` with wrk's defaults (-t2, 2 s timeout)", "identity_fp32", 1,
           "plain-defaults"),
    Factor("np", "`c` with oipserve's busy polling off", "identity_fp32", 1, "harness",
           ("--busy-poll-us", "0", "--worker-busy-poll-us", "0")),
    Factor("a1", "`a` with one front (the default before 2026-11-28)", "simple", 2, "harness",
           ("--http-workers", "1")),
    Factor("d1", "`d` with one front", "identity_fp32", 1, "plain", ("--http-workers", "1")),
]  # fmt: skip


def build_cases(out: Path) -> dict[str, ModelCase]:
    """`simple` as the harness builds it, and [1,16] identities declared like it
    (max_batch_size 8, dims [16]), so only the number of tensors and the type change."""
    build = load_build_module()
    out.mkdir(parents=True, exist_ok=True)
    build.build_simple(out)
    build.build_identity(out, "fp32")
    build.build_identity(out, "int32")
    cases = {
        "simple": ModelCase(
            "simple",
            out / "simple" / "1" / "model.onnx",
            {
                "INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
                "INPUT1": np.full((1, 16), 3, dtype=np.int32),
            },
            ["OUTPUT0", "OUTPUT1"],
            max_batch_size=8,
            dims={"INPUT0": [16], "INPUT1": [16], "OUTPUT0": [16], "OUTPUT1": [16]},
        )
    }
    for dtype in (np.int32, np.float32):
        name = f"identity_{'int32' if dtype is np.int32 else 'fp32'}"
        cases[name] = ModelCase(
            name,
            out / name / "1" / "model.onnx",
            {"INPUT0": np.arange(16, dtype=dtype).reshape(1, 16)},
            ["OUTPUT0"],
            max_batch_size=8,
            dims={"INPUT0": [16], "OUTPUT0": [16]},
        )
    for case in cases.values():
        case.expected = reference_outputs(case)
    return cases


def plain_script(body: HttpBody, path: Path) -> Path:
    """A wrk script as one writes it by hand: method, fixed body, header; no hooks."""
    text = body.path.read_text()
    path.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = [[{text}]]\n"
        f'wrk.headers["Content-Type"] = "{body.content_type}"\n'
    )
    return path


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    return float(found.group(1)) * _UNITS[found.group(2)] if found else float("nan")


def run_plain(
    key: str, url: str, script: Path, connections: int, seconds: int, pid: int, defaults: bool
) -> Measurement:
    """wrk with the plain script and ``--latency``, read from its text output; server and
    other CPU as the harness's `run_wrk` reads them."""
    argv = ["wrk", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url]
    if not defaults:
        argv[1:1] = ["-t1", "--timeout", "5s"]
    before = procs.cpu_snapshot(pid)
    run = procs.run_client(argv, dict(os.environ), seconds + 30, WORK / "scratch")
    after = procs.cpu_snapshot(pid)
    m = Measurement(key, "plain", 0, ok=False)
    m.server_cpu_pct, _ = procs.cpu_delta(before, after)
    done = re.search(r"(\d+) requests in ([\d.]+)(ms|s)", run.stdout)
    if not done:
        m.note = "wrk failed: " + (run.stderr or run.stdout)[-300:]
        return m
    m.requests = int(done.group(1))
    m.duration_s = _ms(done.group(2) + done.group(3)) / 1e3
    m.rps = m.requests / m.duration_s
    pcts = dict(re.findall(r"^\s+(\d+)%\s+(\S+)$", run.stdout, re.M))
    m.p50_ms, m.p99_ms = _ms(pcts.get("50", "")), _ms(pcts.get("99", ""))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", run.stdout)
    m.errors = int(non2xx.group(1)) if non2xx else 0
    m.client_cpu_pct = 100.0 * run.cpu_s / max(run.wall_s, 1e-9)
    m.other_cpu_pct = max(
        0.0, procs.machine_cpu_pct(before, after) - m.server_cpu_pct - m.client_cpu_pct
    )
    m.ok = m.requests > 0 and m.errors == 0
    return m


def wait_for_quiet(budget_s: float) -> float:
    """Wait (bounded) until other tenants use < QUIET_PCT of a core; the load last seen."""
    waited, load = 0.0, 0.0
    while waited < budget_s:
        before = procs.machine_busy_seconds()
        time.sleep(1.0)
        load = 100.0 * (procs.machine_busy_seconds() - before)
        if load <= QUIET_PCT:
            break
        waited += 1.0
    return load


class Run:
    """The servers, bodies and measurements of one comparison."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.factors = [f for f in FACTORS if f.key in ns.factors.split(",")]
        self.cases = build_cases(WORK / "models")
        payloads = WORK / "payloads"
        payloads.mkdir(parents=True, exist_ok=True)
        self.bodies = {n: json_body(c, payloads / f"{n}.json") for n, c in self.cases.items()}
        self.scripts = {
            n: plain_script(b, payloads / f"{n}.plain.lua") for n, b in self.bodies.items()
        }
        self.servers: dict[tuple[str, int, tuple[str, ...]], Server] = {}
        self.rows: list[dict[str, object]] = []

    def start(self) -> None:
        """oipserve (default fronts) and Triton for every instance count the factors use."""
        for instances in sorted({f.instances for f in self.factors}):
            tuning = Tuning(instances=instances)
            work = WORK / f"i{instances}"
            names = {f.model for f in self.factors if f.instances == instances}
            cases = {n: c for n, c in self.cases.items() if n in names}
            started = []
            for args in sorted({f.args for f in self.factors if f.instances == instances}):
                key = "-".join([f"oipserve-i{instances}", *(a.strip("-") for a in args)])
                oip = start_oipserve(
                    self.ns.oipserve, cases, work / key, tuning, key=key, extra_args=args
                )
                self.servers[("oipserve", instances, args)] = oip
                started.append(oip)
            tri = start_triton(TRITON_VENV, cases, work, tuning)
            self.servers[("triton", instances, ())] = tri
            for server in (*started, tri):
                if server.error:
                    raise RuntimeError(f"{server.key} did not start: {server.error[-500:]}")
                for name in cases:
                    reply = post(server.infer_url(name), self.bodies[name])
                    why = (
                        outputs_match(cases[name], reply.outputs)
                        if reply.status == 200
                        else (f"HTTP {reply.status}: {reply.text[:200]}")
                    )
                    if why:
                        raise RuntimeError(f"{server.key} {name}: {why}")
        time.sleep(2)

    def measure(self, server: Server, factor: Factor, conc: int, rnd: int) -> Measurement:
        """A warm-up and a measurement, with the factor's script; front/worker CPU split."""
        url = server.infer_url(factor.model)
        pid = server.root_pid()
        scratch = WORK / "scratch"
        if factor.script == "harness":
            body = self.bodies[factor.model]
            run_wrk(server.key, "warm", rnd, url, body, conc, self.ns.warmup, scratch, pid)
            before = procs.cpu_snapshot(pid)
            m = run_wrk(server.key, factor.key, rnd, url, body, conc, self.ns.seconds, scratch, pid)
        else:
            script, defaults = self.scripts[factor.model], factor.script == "plain-defaults"
            run_plain(server.key, url, script, conc, self.ns.warmup, pid, defaults)
            before = procs.cpu_snapshot(pid)
            m = run_plain(server.key, url, script, conc, self.ns.seconds, pid, defaults)
        front, workers = procs.front_and_workers(before, procs.cpu_snapshot(pid))
        m.round = rnd
        per = 1e6 / max(m.requests, 1)
        self.rows.append(
            {"factor": factor.key, "server": server.key.split("-")[0], "c": conc, "round": rnd,
             "ok": m.ok, "note": m.note, "rps": m.rps, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms,
             "front_us": front * per, "workers_us": workers * per,
             "cpu_us": (front + workers) * per, "client_pct": m.client_cpu_pct,
             "other_pct": m.other_cpu_pct}
        )  # fmt: skip
        return m

    def rounds(self) -> None:
        """Every factor in every round (order rotating), oipserve and Triton back to back in
        alternating order; a pair measured while other tenants used more than
        ``--max-other`` % of a core is measured again (``--retries`` times at most)."""
        turn = 0
        for conc in (int(c) for c in self.ns.concurrency.split(",")):
            for rnd in range(self.ns.rounds):
                shift = rnd % len(self.factors)
                for factor in self.factors[shift:] + self.factors[:shift]:
                    for attempt in range(self.ns.retries + 1):
                        turn += 1
                        other = self.pair(factor, conc, rnd, attempt, turn % 2 == 1)
                        if other <= self.ns.max_other:
                            break

    def pair(self, factor: Factor, conc: int, rnd: int, attempt: int, ours_first: bool) -> float:
        """One A/B of a factor; the larger of the two measurements' other-tenant CPU."""
        load = wait_for_quiet(self.ns.quiet_wait)
        keys = [("oipserve", factor.instances, factor.args), ("triton", factor.instances, ())]
        others = []
        for key in keys if ours_first else keys[::-1]:
            m = self.measure(self.servers[key], factor, conc, rnd)
            self.rows[-1]["attempt"] = attempt
            others.append(m.other_cpu_pct)
            print(
                f"[{time.strftime('%H:%M:%S')}] c={conc} r{rnd}.{attempt} {factor.key:3s} "
                f"{key[0]:8s} {m.rps:7,.0f} req/s p50 {m.p50_ms:5.2f} p99 "
                f"{m.p99_ms:5.2f} ms cpu {self.rows[-1]['cpu_us']:4.0f} us "
                f"other {m.other_cpu_pct:3.0f}% (before {load:3.0f}%) {m.note[:60]}",
                flush=True,
            )
        worst = max(others)
        for row in self.rows[-2:]:
            row["pair_other"] = worst
        return worst

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def _med(rows: list[dict[str, object]], field: str) -> float:
    return statistics.median(float(r[field]) for r in rows)  # type: ignore[arg-type]


def _pairs(rows: list[dict[str, object]], key: str, conc: int) -> list[tuple[dict, dict]]:
    """(oipserve's row, Triton's row) of every A/B of a factor at a concurrency."""
    found: dict[tuple[object, object], dict[str, dict]] = {}
    for r in rows:
        if r["factor"] == key and r["c"] == conc and r["ok"]:
            found.setdefault((r["round"], r.get("attempt", 0)), {})[str(r["server"])] = r
    return [(p["oipserve"], p["triton"]) for p in found.values() if len(p) == 2]


def _line(label: str, conc: int, pairs: list[tuple[dict, dict]], shown: str) -> str:
    ours, theirs = [o for o, _ in pairs], [t for _, t in pairs]
    ratios = [float(o["rps"]) / float(t["rps"]) for o, t in pairs]
    cpu = [float(o["cpu_us"]) / float(t["cpu_us"]) for o, t in pairs]
    other = [max(float(o["other_pct"]), float(t["other_pct"])) for o, t in pairs]
    return (
        f"| {label} | {conc} | {shown} | {_med(ours, 'rps'):,.0f} / {_med(theirs, 'rps'):,.0f} | "
        f"**{statistics.median(ratios):.2f}×** ({min(ratios):.2f}–{max(ratios):.2f}) | "
        f"{_med(ours, 'p50_ms'):.2f} / {_med(theirs, 'p50_ms'):.2f} | "
        f"{_med(ours, 'p99_ms'):.2f} / {_med(theirs, 'p99_ms'):.2f} | "
        f"{_med(ours, 'cpu_us'):.0f} ({_med(ours, 'front_us'):.0f} + "
        f"{_med(ours, 'workers_us'):.0f}) | {_med(theirs, 'cpu_us'):.0f} "
        f"({_med(theirs, 'front_us'):.0f} + {_med(theirs, 'workers_us'):.0f}) | "
        f"{statistics.median(cpu):.2f}× | {statistics.median(other):.0f}, {max(other):.0f} |"
    )


def table(rows: list[dict[str, object]], max_other: float) -> str:
    """Markdown: per factor and concurrency, medians over the A/B pairs measured while other
    tenants used at most ``max_other`` % of a core (all pairs when none was that quiet), with
    the per-pair ratios' median and range."""
    out = [
        "| factor | c | pairs used | req/s ours / Triton | ratio, median (range) | p50 ms "
        "ours / Triton | p99 ms ours / Triton | CPU µs/req ours (front + workers) | Triton's |"
        " CPU ratio | other CPU % (median, max) |",
        "|---|---:|---|---|---|---|---|---|---|---:|---|",
    ]
    labels = {f.key: f"{f.key}: {f.what}" for f in FACTORS}
    keys = [f.key for f in FACTORS if any(r["factor"] == f.key for r in rows)]
    for conc in sorted({int(r["c"]) for r in rows}, reverse=True):  # type: ignore[call-overload]
        for key in keys:
            pairs = _pairs(rows, key, conc)
            quiet = [(o, t) for o, t in pairs if float(o["pair_other"]) <= max_other]
            if pairs:
                shown = f"{len(quiet)} quiet of {len(pairs)}" if quiet else f"all {len(pairs)}"
                out.append(_line(labels[key], conc, quiet or pairs, shown))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4, help="per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="seconds before each")
    parser.add_argument("--concurrency", default="16", help="comma list, e.g. 16,1")
    parser.add_argument("--factors", default=",".join(f.key for f in FACTORS))
    parser.add_argument(
        "--max-other",
        type=float,
        default=60.0,
        help="re-measure a pair when other tenants used more than this %% of a core",
    )
    parser.add_argument("--retries", type=int, default=0, help="re-measurements per pair")
    parser.add_argument(
        "--quiet-wait", type=float, default=10.0, help="seconds to wait for a quiet moment"
    )
    parser.add_argument("--http-workers", default="auto", help="OIPSERVE_HTTP_WORKERS")
    parser.add_argument(
        "--save", type=Path, default=WORK / "measurements.json", help="raw measurements (JSON)"
    )
    parser.add_argument("--render", type=Path, help="only print the table of a saved run")
    parser.add_argument("--oipserve", default=f"{sys.executable} -m oipserve")
    ns = parser.parse_args()
    if ns.render:
        print(table(json.loads(ns.render.read_text()), ns.max_other))
        return
    if not TRITON_VENV.exists():
        sys.exit(f"{TRITON_VENV} is missing: run benchmarks/run.py once first")
    os.environ["OIPSERVE_HTTP_WORKERS"] = ns.http_workers
    procs.install_signal_cleanup()
    run = Run(ns)
    try:
        run.start()
        run.rounds()
    finally:
        run.stop()
        ns.save.parent.mkdir(parents=True, exist_ok=True)
        ns.save.write_text(json.dumps(run.rows, indent=0))
    print(f"\nOIPSERVE_HTTP_WORKERS={ns.http_workers}, {ns.rounds} rounds of {ns.seconds} s, "
          f"medians:\n")  # fmt: skip
    print(table(run.rows, ns.max_other))


if __name__ == "__main__":
    main()
