"""Would a second front process pay on this machine? One server against two, same cores.

The front is one Python thread. At c=16 a tiny request saturates it while the machine
still has idle time (results/2026-11-27-cpu-vs-triton.md). ``--http-workers`` (several
front processes over one worker pool, docs/scaling.md) is not built. This measures its
nearest stand-in, with the same clients and the same number of processes:

- **one front**: one server with two workers, driven by two wrk processes at c=8 each;
- **two fronts**: two servers with one worker each, each driven by one wrk at c=8;
- with ``--triton``, Triton (as the harness starts it) driven by the same two clients.

Rounds are interleaved, the order reversed every other round, and the medians of the
summed req/s are printed, with each configuration's errors.

    python benchmarks/front_replicas.py --rounds 6 [--request tiny-binary] [--triton]

Needs a prior `benchmarks/run.py` run (for benchmarks/.work/, and its Triton venv for
``--triton``) and wrk.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from cpu_per_request import REQUESTS, TRITON_VENV, WORK, request_body  # noqa: E402
from oipbench.load import Measurement, run_wrk  # noqa: E402
from oipbench.models import build_models  # noqa: E402
from oipbench.payloads import HttpBody  # noqa: E402
from oipbench.servers import Server, Tuning, start_oipserve, start_triton  # noqa: E402

#: Connections of each of the two wrk processes.
CONNECTIONS = 8


def _drive(
    name: str, targets: list[Server], model: str, body: HttpBody, seconds: int, rnd: int
) -> tuple[float, int]:
    """Two wrk processes at once, spread over ``targets``: summed req/s and errors."""

    def one_client(index: int) -> Measurement:
        server = targets[index % len(targets)]
        scratch = WORK / "scratch" / f"replicas-{index}"
        return run_wrk(name, f"replicas-{index}", rnd, server.infer_url(model), body,
                       CONNECTIONS, seconds, scratch, server.root_pid())  # fmt: skip

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(one_client, range(2)))
    for m in runs:
        if not m.ok:
            raise RuntimeError(f"{name}: {m.note}")
    return sum(m.rps for m in runs), sum(m.errors for m in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--request", choices=sorted(REQUESTS), default="tiny-binary")
    parser.add_argument("--triton", action="store_true", help="measure Triton too")
    parser.add_argument(
        "--oipserve",
        default=f"{sys.executable} -P -m oipserve",
        help="command that runs oipserve (default: this interpreter, this checkout)",
    )
    ns = parser.parse_args()
    model, body = request_body(ns.request)
    cases = build_models(WORK / "models")
    # NOTE: -P keeps the current directory off sys.path; this checkout comes first instead.
    cmd = f"env PYTHONPATH={shlex.quote(str(BENCH.parent))} {ns.oipserve}"
    work = WORK / "replicas"
    configs: dict[str, list[Server]] = {}
    try:
        configs["one front, 2 workers"] = [
            start_oipserve(cmd, cases, work / "one", Tuning(instances=2))
        ]
        configs["two fronts, 1 worker each"] = [
            start_oipserve(cmd, cases, work / f"two-{i}", Tuning(instances=1)) for i in (0, 1)
        ]
        if ns.triton:
            configs["Triton"] = [start_triton(TRITON_VENV, cases, work / "triton", Tuning())]
        for name, servers in configs.items():
            failed = [s.error for s in servers if not s.http_url]
            if failed:
                raise RuntimeError(f"{name}: {failed[0]}")
        names = list(configs)
        results: dict[str, list[tuple[float, int]]] = {name: [] for name in names}
        for rnd in range(ns.rounds):
            for name in names if rnd % 2 == 0 else names[::-1]:
                results[name].append(_drive(name, configs[name], model, body, ns.seconds, rnd))
    finally:
        for servers in configs.values():
            for server in servers:
                server.stop()
    base = statistics.median(r[0] for r in results[names[0]])
    print(f"{ns.request}, 2 wrk x c={CONNECTIONS}, {ns.rounds} rounds of {ns.seconds} s:")
    for name in names:
        rates = [r[0] for r in results[name]]
        rps = statistics.median(rates)
        print(
            f"{name:28s} req/s {rps:8,.0f} (range {min(rates):,.0f}-{max(rates):,.0f}), "
            f"{rps / base:.2f}x one front, errors {sum(r[1] for r in results[name])}"
        )


if __name__ == "__main__":
    main()
