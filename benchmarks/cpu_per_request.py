"""CPU per request of several oipserve builds (and Triton), interleaved: where each spends.

Throughput on this shared 2-core machine drifts 30-40 % between runs; CPU time per
request, read from /proc for the front process and its workers separately, moves less
and says which process a change made costlier. Each build is a source tree (a git
worktree of some commit); all are started at once on the benchmark repository that
`benchmarks/run.py` writes, then driven in turn (order reversed every other round) by
wrk at c=16 (``--concurrency``) with one of the harness's REST requests (``--request``:
the tiny JSON one by default), and medians over rounds are printed.

    git worktree add --detach ../base <commit>
    python benchmarks/cpu_per_request.py ../base . --rounds 8

A build may carry server arguments of its own after ``::`` (``.::--busy-poll-us 0``; words
``NAME=VALUE`` before the first option are set in its environment): one tree measured with
and without a setting, in the same rounds.

``--triton`` measures Triton in the same rounds, started as the harness starts it: its
``tritonserver`` process counts as the front, its python-backend stubs as the workers.
``--rate R`` paces the requests at R a second (a server below saturation: what a
request costs when its processes sleep between requests). ``--http-workers N`` starts
each oipserve build with N HTTP fronts; their CPU is summed as "front". Each row also
says how many requests a model run served on average (``rows a run``, from the
statistics extension's ``inference_count`` over ``execution_count``, which both servers
keep): above 1 only for a model with dynamic batching.
Besides the CPU per request, each row says how much of the machine the server tree
kept busy (``busy``, % of one core): on 2 cores a server can lose to another that costs
no more per request but keeps both cores busy.

Each server (Triton too) gets one second of load, not measured, before its first round. ``--fresh``
starts every oipserve build again for each round (Triton stays up): three copies of one
tree read 5,290, 6,182 and 5,404 req/s on the MatMul batched row started once, and 6,348,
6,598 and 6,153 started each round (2026-11-28, 6 rounds each): what one server instance
draws (where its processes run, how wrk's connections fall on its fronts) then counts
once a round, not in every round.

The request bodies are written again as `benchmarks/run.py` writes them (the same bytes).
Needs a prior `benchmarks/run.py` run (for benchmarks/.work/, and its Triton venv for
``--triton``) and wrk; it drives wrk and reads CPU times with the harness's own `run_wrk`
and `cpu_snapshot`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.load import run_wrk  # noqa: E402
from oipbench.models import ModelCase, build_models  # noqa: E402
from oipbench.payloads import HttpBody, binary_body, json_body  # noqa: E402
from oipbench.servers import Tuning, serve_from, start_triton  # noqa: E402

WORK = BENCH / ".work"
TRITON_VENV = BENCH / ".venvs" / "triton"

#: --request: the model, and the harness's writer of its body.
REQUESTS: dict[str, tuple[str, Callable[[ModelCase, Path], HttpBody]]] = {
    "tiny-binary": ("simple", binary_body),
    "tiny-json": ("simple", json_body),
    "matmul-binary": ("matmul_relu", binary_body),
    "matmul-batched": ("matmul_batched", binary_body),
    "matmul-unbatched": ("matmul_unbatched", binary_body),
}


def request_body(request: str, cases: dict[str, ModelCase]) -> tuple[str, HttpBody]:
    """The model of ``request`` and its body, written as `benchmarks/run.py` writes it."""
    model, write = REQUESTS[request]
    suffix = "json" if write is json_body else "bin"
    return model, write(cases[model], WORK / "payloads" / f"{model}.{suffix}")


def _counts(url: str, model: str) -> tuple[int, int]:
    """The model's ``inference_count`` and ``execution_count`` (statistics extension)."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as answer:
        stats = json.load(answer)["model_stats"]
    return (
        sum(int(v["inference_count"]) for v in stats),
        sum(int(v["execution_count"]) for v in stats),
    )


def split_build(spec: str) -> tuple[Path, dict[str, str], list[str]]:
    """A build argument: its source tree, and the environment and server arguments after
    ``::``."""
    tree, _, extra = spec.partition("::")
    words = shlex.split(extra)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return Path(tree).resolve(), env, words


def _start(spec: str, http_workers: int) -> tuple[int, str, Callable[[], None]]:
    build, env, extra = split_build(spec)
    args = ["--model-repository", str(WORK / "repos" / "oipserve"), "--http-port", "0",
            "--grpc-port", "0", "--instances-per-device", "2",
            "--http-workers", str(http_workers), *extra]  # fmt: skip
    server = serve_from(build, args, env)
    return server.proc.pid, server.http, server.stop


def _start_triton(cases: dict[str, ModelCase]) -> tuple[int, str, Callable[[], None]]:
    if not TRITON_VENV.exists():
        raise RuntimeError(f"{TRITON_VENV} is missing: run benchmarks/run.py once first")
    server = start_triton(TRITON_VENV, cases, WORK / "cpu-triton", Tuning())
    assert server.proc is not None
    return server.root_pid(), server.http_url.removeprefix("http://"), server.proc.stop


#: One round's figures of one server: req/s, front and workers µs a request, busy %, rows a
#: run, p50 and p99 ms.
Row = tuple[float, float, float, float, float, float, float]
Server = tuple[int, str, Callable[[], None]]


def _measure(name: str, server: Server, model: str, body: HttpBody, ns: argparse.Namespace,
             rnd: int) -> Row:  # fmt: skip
    """One wrk run against ``server``, and what it cost the server."""
    pid, url, _ = server
    counted = _counts(url, model)
    m = run_wrk(name, f"{ns.request}-c{ns.concurrency}", rnd,
                f"http://{url}/v2/models/{model}/infer", body, ns.concurrency,
                ns.seconds, WORK / "scratch", pid, rate=ns.rate)  # fmt: skip
    if not m.ok:
        raise RuntimeError(f"{name}: {m.note}")
    inferences, executions = (
        now - then for now, then in zip(_counts(url, model), counted, strict=True)
    )
    busy = (m.front_cpu_s + m.workers_cpu_s) / m.duration_s * 100
    rows_a_run = inferences / max(executions, 1)
    return (m.rps, *m.cpu_us_per_request(), busy, rows_a_run, m.p50_ms, m.p99_ms)


def _warm(name: str, server: Server, model: str, body: HttpBody) -> None:
    """One second of load, not measured: a server's first requests fill its pools."""
    pid, url, _ = server
    run_wrk(name, "warm-up", 0, f"http://{url}/v2/models/{model}/infer", body, 4, 1,
            WORK / "scratch", pid)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "builds", nargs="+",
        help="source trees to compare, each optionally TREE::SERVER-ARGS",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16, help="wrk connections")
    parser.add_argument(
        "--rate", type=float, default=0.0,
        help="requests a second, paced (wrk's schedule); 0: as fast as the connections go",
    )  # fmt: skip
    parser.add_argument("--request", choices=sorted(REQUESTS), default="tiny-json")
    parser.add_argument("--triton", action="store_true", help="measure Triton too")
    parser.add_argument("--http-workers", type=int, default=1, help="oipserve's HTTP fronts")
    parser.add_argument(
        "--fresh", action="store_true",
        help="start every oipserve build again for each round (see the module's text)",
    )  # fmt: skip
    ns = parser.parse_args()
    # NOTE: servers and rows are keyed by the build's tree and arguments: one named twice
    #   would start a second server whose handle replaced the first's, left running.
    keys = {
        (tree, tuple(sorted(env.items())), tuple(extra))
        for tree, env, extra in map(split_build, ns.builds)
    }
    if len(keys) < len(ns.builds):
        parser.error("a build is named twice; name each tree and its arguments once")
    cases = build_models(WORK / "models")
    model, body = request_body(ns.request, cases)
    (WORK / "scratch").mkdir(parents=True, exist_ok=True)
    builds = list(ns.builds)
    servers: dict[str, Server] = {}
    names = [*builds, "triton"] if ns.triton else builds
    rows: dict[str, list[Row]] = {name: [] for name in names}
    try:
        if ns.triton:
            servers["triton"] = _start_triton(cases)
            _warm("triton", servers["triton"], model, body)
        for rnd in range(ns.rounds):
            for name in builds:
                if name not in servers:
                    servers[name] = _start(name, ns.http_workers)
                    _warm(name, servers[name], model, body)
            for name in names if rnd % 2 == 0 else names[::-1]:
                rows[name].append(_measure(name, servers[name], model, body, ns, rnd))
                print(f"round {rnd} {name}: {rows[name][-1][0]:,.0f} req/s", flush=True)
            if ns.fresh:
                for name in builds:
                    servers.pop(name)[2]()
    finally:
        for _, _, stop in servers.values():
            stop()
    fronts = f", {ns.http_workers} HTTP fronts" if ns.http_workers > 1 else ""
    fresh = ", each build started again every round" if ns.fresh else ""
    print(
        f"{ns.request}, c={ns.concurrency}{fronts}{fresh}, {ns.rounds} rounds of {ns.seconds} s "
        "(medians):"
    )
    for name, measured in rows.items():
        rps, front, workers, busy, batch, p50, p99 = (
            statistics.median(r[i] for r in measured) for i in range(7)
        )
        print(
            f"{name:30s} req/s {rps:8,.0f}   CPU per request: front {front:5.0f} us "
            f"(min {min(r[1] for r in measured):.0f}), workers {workers:5.0f} us, "
            f"busy {busy:4.0f}%, rows a run {batch:4.1f}, p50 {p50:.3f} ms, p99 {p99:.3f} ms"
        )


if __name__ == "__main__":
    main()
