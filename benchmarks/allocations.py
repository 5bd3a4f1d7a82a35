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
at c=1 for ``--seconds`` while ``perf stat`` counts (``--request tiny-grpc``: nghttp2's
h2load, one stream, posting the tiny ModelInfer as `benchmarks/h2load_grpc.py` does). A
probe hit costs a few microseconds, so the rate is lower than without them; counts of
anything timed (a lazy flush's timer) read higher than at full speed, and such differences
are not the build's. Needs root (the probes are added once, with ``perf probe``), perf, wrk
(h2load for gRPC), and a prior `benchmarks/run.py` run (benchmarks/.work/).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from cpu_per_request import REQUESTS, WORK, request_body, split_build  # noqa: E402
from h2load_grpc import Target, canned_body, h2load  # noqa: E402
from oipbench.load import run_wrk  # noqa: E402
from oipbench.models import ModelCase, build_models  # noqa: E402
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


def measure(spec: str, request: str, cases: dict[str, ModelCase], seconds: int) -> dict[str, float]:
    """One build's counts per request: ``front objects``, ``workers syscalls``..."""
    tree, env, extra = split_build(spec)
    args = ["--model-repository", str(WORK / "repos" / "oipserve"), "--http-port", "0",
            "--grpc-port", "0", "--instances-per-device", "2", "--http-workers", "1",
            *extra]  # fmt: skip
    server = serve_from(tree, args, env)
    try:
        front = server.proc.pid
        drive = _grpc_driver(server.grpc, cases) if request == GRPC else _rest_driver(
            spec, request, server.http, front, cases
        )  # fmt: skip
        drive(1)
        workers = [pid for pid in tree_pids(front) if pid != front]
        counters = {"front": _count([front], seconds), "workers": _count(workers, seconds)}
        requests = drive(seconds)
        per_request: dict[str, float] = {"requests": float(requests)}
        for side, counter in counters.items():
            for what, n in _read(counter).items():
                per_request[f"{side} {what}"] = n / max(requests, 1)
        return per_request
    finally:
        server.stop()


#: ``--request``: gRPC's tiny request (h2load, c=1), besides the REST ones.
GRPC = "tiny-grpc"


def _rest_driver(
    spec: str, request: str, address: str, front: int, cases: dict[str, ModelCase]
) -> Callable[[int], int]:
    """wrk at c=1 for some seconds; the requests it made."""
    model, body = request_body(request, cases)
    url = f"http://{address}/v2/models/{model}/infer"

    def drive(seconds: int) -> int:
        m = run_wrk(spec, "counted", 0, url, body, 1, seconds, WORK / "scratch", front)
        if not m.ok:
            raise RuntimeError(f"{spec}: {m.note}")
        return m.requests

    return drive


def _grpc_driver(address: str, cases: dict[str, ModelCase]) -> Callable[[int], int]:
    """h2load (one connection, one stream) posting the tiny ModelInfer for some seconds."""
    body = canned_body(cases["simple"], WORK / "payloads" / "simple.grpc")
    target = Target("oipserve", address, 0, lambda: None)
    log = WORK / "scratch" / "allocations-h2load.log"
    return lambda seconds: int(h2load(target, body, "1x1", ["-D", str(seconds)], log)["requests"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="source trees, each optionally TREE::ARGS")
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--request", choices=[*sorted(REQUESTS), GRPC], default="tiny-json")
    ns = parser.parse_args()
    add_probes()
    cases = build_models(WORK / "models")
    (WORK / "scratch").mkdir(parents=True, exist_ok=True)
    print(f"{ns.request}, c=1, one HTTP front; per request:")
    for spec in ns.builds:
        row = measure(spec, ns.request, cases, ns.seconds)
        figures = "  ".join(f"{k} {v:6.1f}" for k, v in row.items() if k != "requests")
        print(f"{spec:30s} {figures}  ({row['requests']:.0f} requests)", flush=True)


if __name__ == "__main__":
    main()
