"""Python allocations and system calls per request of oipserve builds, front and workers.

CPU time per request at c=1 moves by 10-20 % between runs on this shared machine, and a
change that saves one object a request is below that noise. What a request allocates
does not move: this counts, with ``perf`` user probes on libpython's ``PyObject_Malloc``
and ``PyMem_Malloc`` (every Python object, compiled or interpreted, comes from one of
them) and the ``raw_syscalls:sys_enter`` tracepoint, what one tiny request costs the
front and the workers, builds side by side. At c=1 a front's work costs ~2.7x what it
costs under load (its caches are cold when it wakes; docs/performance.md, "Why the
missed rows miss"): the memory a request touches is what to cut.

    python benchmarks/allocations.py ../base . --requests 3000

Each build (a source tree, optionally ``TREE::NAME=VALUE --flag value`` as in
`benchmarks/cpu_per_request.py`) is started with one HTTP front, warmed, then driven by wrk
at c=1 for ``--seconds`` while ``perf stat`` counts. A probe hit costs a few microseconds,
so the rate is lower than without them; counts of anything timed (a lazy flush's timer)
read higher than at full speed, and such differences are not the build's. Needs root (the
probes are added once, with ``perf probe``), perf, wrk, and a prior `benchmarks/run.py`
run (benchmarks/.work/).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from cpu_per_request import REQUESTS, WORK, request_body, split_build  # noqa: E402
from oipbench.load import run_wrk  # noqa: E402
from oipbench.models import build_models  # noqa: E402
from oipbench.payloads import HttpBody  # noqa: E402
from oipbench.procs import tree_pids  # noqa: E402
from oipbench.servers import serve_from  # noqa: E402

#: The libpython functions counted: every object and every interpreter buffer comes
#: from one of them.
PROBED = ("PyObject_Malloc", "PyMem_Malloc")
EVENTS = (*(f"probe_libpython3:{name}" for name in PROBED), "raw_syscalls:sys_enter")
LABELS = {EVENTS[0]: "objects", EVENTS[1]: "buffers", EVENTS[2]: "syscalls"}


def _libpython() -> str:
    return str(Path(sysconfig.get_config_var("LIBDIR")) / sysconfig.get_config_var("LDLIBRARY"))


def add_probes() -> None:
    """The user probes, added once (``perf probe`` refuses one that exists)."""
    listed = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
    for name in PROBED:
        if f"probe_libpython3:{name} " not in listed:
            subprocess.run(["perf", "probe", "-q", "-x", _libpython(), "--add", name], check=True)


def _count(pids: list[int], seconds: float) -> subprocess.Popen[str]:
    """``perf stat`` over ``pids`` for ``seconds``, its CSV on stderr."""
    return subprocess.Popen(
        ["perf", "stat", "-x,", "-e", ",".join(EVENTS), "-p", ",".join(map(str, pids)),
         "--", "sleep", str(seconds)],  # fmt: skip
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _read(counter: subprocess.Popen[str]) -> dict[str, float]:
    _, err = counter.communicate()
    counts: dict[str, float] = {}
    for line in err.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] in LABELS and fields[0].replace(".", "").isdigit():
            counts[LABELS[fields[2]]] = float(fields[0])
    return counts


def measure(spec: str, model: str, body: HttpBody, seconds: int) -> dict[str, float]:
    """One build's counts per request: ``front objects``, ``workers syscalls``..."""
    tree, env, extra = split_build(spec)
    args = ["--model-repository", str(WORK / "repos" / "oipserve"), "--http-port", "0",
            "--grpc-port", "0", "--instances-per-device", "2", "--http-workers", "1",
            *extra]  # fmt: skip
    server = serve_from(tree, args, env)
    try:
        url = f"http://{server.http}/v2/models/{model}/infer"
        front = server.proc.pid
        run_wrk(spec, "warm-up", 0, url, body, 1, 1, WORK / "scratch", front)
        workers = [pid for pid in tree_pids(front) if pid != front]
        counters = {"front": _count([front], seconds), "workers": _count(workers, seconds)}
        m = run_wrk(spec, "counted", 0, url, body, 1, seconds, WORK / "scratch", front)
        if not m.ok:
            raise RuntimeError(f"{spec}: {m.note}")
        per_request: dict[str, float] = {"requests": float(m.requests)}
        for side, counter in counters.items():
            for what, n in _read(counter).items():
                per_request[f"{side} {what}"] = n / max(m.requests, 1)
        return per_request
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="source trees, each optionally TREE::ARGS")
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--request", choices=sorted(REQUESTS), default="tiny-json")
    ns = parser.parse_args()
    add_probes()
    model, body = request_body(ns.request, build_models(WORK / "models"))
    (WORK / "scratch").mkdir(parents=True, exist_ok=True)
    print(f"{ns.request}, c=1, one HTTP front; per request:")
    for spec in ns.builds:
        row = measure(spec, model, body, ns.seconds)
        figures = "  ".join(f"{k} {v:6.1f}" for k, v in row.items() if k != "requests")
        print(f"{spec:30s} {figures}  ({row['requests']:.0f} requests)", flush=True)


if __name__ == "__main__":
    main()
