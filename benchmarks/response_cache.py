"""What the response cache costs a miss and gains a hit, measured in one server: each model
twice, with ``response_cache { enable: true }`` and without, driven in turn by wrk (the order
reversed every other round); CPU per request from /proc.

One server (``--cache-config local,size=BYTES``) serves each harness model under its name
with the cache on, and as ``<name>_nc`` with it off: the same process, workers and moment
for both, so what differs is the cache's work. (Two servers, one with the flag and one
without, differed by up to 15 % a request with no cache at all: ``--same`` shows the noise
of this design, both copies uncached.) Rows:

- ``tiny-miss`` (the tiny INT32 model, REST binary, c=16) and ``mib-miss`` (FP32 1 MiB through
  identity, REST binary, c=4): a counter in the first 8 bytes of the tensor data makes every
  request new, so every lookup misses: CPU per request, on against off;
- ``matmul-hit`` (the [8,1024] x [1024,1024] MatMul, REST binary, c=4): the same request
  again and again, all hits once stored: throughput, on against off;
- ``tiny-hit``: the tiny request again and again, for the record.

    python benchmarks/response_cache.py --rounds 8

Needs a prior `benchmarks/run.py` run (its models and request bodies under
benchmarks/.work/) and wrk. Prints a Markdown table of medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from oipbench.procs import cpu_snapshot, front_and_workers  # noqa: E402
from oipbench.servers import SourceServer, serve_from  # noqa: E402

WORK = BENCH / ".work"
LUA = BENCH / "lua" / "cache.lua"


@dataclass(frozen=True)
class Row:
    name: str
    model: str
    concurrency: int
    unique: bool


ROWS = (
    Row("tiny-miss", "simple", 16, True),
    Row("mib-miss", "identity_fp32", 4, True),
    Row("matmul-hit", "matmul_relu", 4, False),
    Row("tiny-hit", "simple", 16, False),
)


def _repository(scratch: Path) -> Path:
    """The harness's models with the response cache enabled, and each again as
    ``<name>_nc`` and ``<name>_nc2`` without it."""
    repo = scratch / "cache-repo"
    shutil.rmtree(repo, ignore_errors=True)
    for model in {row.model for row in ROWS}:
        source = WORK / "repos" / "oipserve" / model
        shutil.copytree(source, repo / model)
        config = repo / model / "config.pbtxt"
        text = config.read_text()
        config.write_text(text + "\nresponse_cache { enable: true }\n")
        for suffix in ("_nc", "_nc2"):
            shutil.copytree(source, repo / (model + suffix))
            renamed = text.replace(f'name: "{model}"', f'name: "{model}{suffix}"')
            (repo / (model + suffix) / "config.pbtxt").write_text(renamed)
    return repo


def _header_length(body: bytes) -> int:
    """Where a binary-extension body's JSON header ends."""
    _, end = json.JSONDecoder().raw_decode(body.decode("latin-1"))
    return end


def _wrk(url: str, row: Row, model: str, seconds: int) -> tuple[int, float, int, float]:
    """(requests, seconds, errors, p99 ms) of one wrk run."""
    body = WORK / "payloads" / f"{row.model}.bin"
    env = {
        **os.environ,
        "OIPC_BODY": str(body),
        "OIPC_HLEN": str(_header_length(body.read_bytes())),
        "OIPC_UNIQUE": "1" if row.unique else "0",
        "OIPC_SEED": str(random.randrange(1 << 40)),
    }
    argv = ["wrk", "-t1", f"-c{row.concurrency}", f"-d{seconds}s", "--timeout", "5s",
            "-s", str(LUA), f"http://{url}/v2/models/{model}/infer"]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 30)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("OIPC_RESULT "))
    data = json.loads(line.removeprefix("OIPC_RESULT "))
    return data["requests"], data["duration_us"] / 1e6, data["errors"], data["p99_us"] / 1000


def _cache_counts(url: str, model: str) -> tuple[int, int]:
    """(cache_hit, cache_miss) counts of a model (statistics extension)."""
    import urllib.request

    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]["inference_stats"]
    return stats["cache_hit"]["count"], stats["cache_miss"]["count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--cache-bytes", type=int, default=256 << 20)
    parser.add_argument("--rows", nargs="*", default=[row.name for row in ROWS])
    parser.add_argument(
        "--same", action="store_true", help="both copies without the cache (A/A: the noise)"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="only the cache's own CPU, in this process"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="FILE",
        help="--in-process: another response_cache.py (e.g. `git show HEAD:oipserve/dataplane/"
        "response_cache.py`) timed against the tree's, in turn, --rounds times",
    )
    parser.add_argument(
        "--front-gc",
        action="store_true",
        help="--in-process: the collector's settings a serving front uses "
        "(oipserve.runtime.collector), not Python's defaults",
    )
    ns = parser.parse_args()
    if ns.in_process:
        sys.path.insert(0, str(ROOT))
        _in_process_runs(ns)
        return
    rows = [row for row in ROWS if row.name in ns.rows]
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    repo = _repository(scratch)
    common = ["--model-repository", str(repo), "--http-port", "0", "--grpc-port", "0",
              "--instances-per-device", "2"]  # fmt: skip
    # kind -> the suffix of the model copy it asks for
    copies = {"off": "_nc", "on": "_nc2" if ns.same else ""}
    found: dict[tuple[str, str], list[tuple[float, float, float, float, float]]] = {}
    server = serve_from(ROOT, [*common, "--cache-config", f"local,size={ns.cache_bytes}"])
    try:
        for rnd in range(ns.rounds):
            for row in rows:
                for name in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
                    model = row.model + copies[name]
                    measured = _measure(server, row, model, ns.seconds)
                    found.setdefault((row.name, name), []).append(measured)
    finally:
        server.stop()
    _report(rows, found, ns)


def _measure(
    server: SourceServer, row: Row, model: str, seconds: int
) -> tuple[float, float, float, float, float]:
    """(req/s, front µs a request, workers µs a request, p99 ms, hit %) of one wrk run."""
    hits0, misses0 = _cache_counts(server.http, model)
    before = cpu_snapshot(server.proc.pid)
    requests, wall, errors, p99 = _wrk(server.http, row, model, seconds)
    front, workers = front_and_workers(before, cpu_snapshot(server.proc.pid))
    if errors or not requests:
        raise RuntimeError(f"{model} {row.name}: {errors} errors, {requests} requests")
    hits, misses = _cache_counts(server.http, model)
    looked = (hits - hits0) + (misses - misses0)
    hit_pct = 100 * (hits - hits0) / looked if looked else 0.0
    return requests / wall, front / requests * 1e6, workers / requests * 1e6, p99, hit_pct


def _in_process_runs(ns: argparse.Namespace) -> None:
    """``in_process`` once, or with ``--compare`` the tree's cache and another in turn
    (the order reversed every other round), in one process: the same moment for both."""
    if ns.front_gc:
        from oipserve.runtime.collector import settle_garbage_collector

        settle_garbage_collector()
    if ns.compare is None:
        in_process()
        return
    import importlib.util

    import oipserve.dataplane.response_cache as tree

    spec = importlib.util.spec_from_file_location("compared_response_cache", ns.compare)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{ns.compare}: not a Python file")
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    caches = {"tree": tree, str(ns.compare): other}
    for rnd in range(ns.rounds):
        for label in list(caches) if rnd % 2 == 0 else list(caches)[::-1]:
            sys.modules["oipserve.dataplane.response_cache"] = caches[label]
            print(f"round {rnd + 1}, {label}:", flush=True)
            in_process()
    sys.modules["oipserve.dataplane.response_cache"] = tree


def in_process(requests: int = 20_000, repeats: int = 7) -> None:
    """The cache's own CPU a miss and a hit, timed in this process (``time.process_time``,
    best of ``repeats``): the figure the end-to-end rows cannot resolve below their noise.

    Each request is made just before its lookup, as a front makes it (fresh objects, in
    the CPU's caches); the loop that only makes them is timed too and taken off. A miss:
    lookup and store (every tiny one; no 1 MiB one, as with new requests each time); a hit:
    lookup and answer (the 1 MiB input compared whole). Tiny: ``simple``'s 2 inputs and 2
    outputs of 64 bytes; 1 MiB: identity's one input and output."""
    import time

    from oipserve.dataplane.response_cache import ResponseCache, answer
    from oipserve.request.inference import Inference, InferResult, InputTensor, OutputTensor
    from oipserve.runtime.off_loop import nothing_to_release
    from oipserve.telemetry.stats import ModelStats

    class Model:
        serial, name, version = 1, "m", "1"

    model = Model()

    def request(i: int, inputs: list[bytearray], outputs: list[memoryview]) -> tuple:
        tensors, placements, results = [], [], []
        for n, data in enumerate(inputs):
            data[:8] = i.to_bytes(8, "little")
            tensor = InputTensor(f"INPUT{n}", "INT32", [1, len(data) // 4], raw=data)
            tensors.append(tensor)
            placements.append((tensor, tensor.shape, len(data), memoryview(data)))
            results.append(OutputTensor(f"OUTPUT{n}", "INT32", [1, len(data) // 4], outputs[n]))
        names = [o.name for o in results]
        inference = Inference(model, tensors, names, [])  # type: ignore[arg-type]
        return inference, placements, InferResult(model, results, nothing_to_release)  # type: ignore[arg-type]

    def timed(count: int, sizes: tuple[int, ...], step: object) -> float:
        inputs = [bytearray(size) for size in sizes]
        outputs = [memoryview(bytearray(size)) for size in sizes]
        began = time.process_time()
        for i in range(count):
            step(*request(i, inputs, outputs))  # type: ignore[operator]
        return (time.process_time() - began) / count * 1e6

    stats = ModelStats("m", "1")
    for label, sizes, count in (("tiny", (64, 64), requests), ("1 MiB", (1 << 20,), 400)):
        best = {"make": float("inf"), "miss": float("inf"), "hit": float("inf")}
        for _ in range(repeats):
            # NOTE: a cache that never fills: each stored entry takes new memory (a full
            #   cache reuses what it evicts: see the "full" figure below).
            cache = ResponseCache(1 << 34)

            def miss(inference, placements, result, cache=cache):  # type: ignore[no-untyped-def]
                probe = cache.lookup(inference, placements, stats)
                if probe is not None and probe.entry is None:
                    cache.store(probe, result, stats)

            def hit(inference, placements, result, cache=cache):  # type: ignore[no-untyped-def]
                probe = cache.lookup(inference, placements, stats)
                if probe is not None and probe.entry is not None:
                    answer(probe.entry, inference)

            best["make"] = min(best["make"], timed(count, sizes, lambda *_: None))
            best["miss"] = min(best["miss"], timed(count, sizes, miss))
            timed(count, sizes, miss)  # a large one is stored at its second miss
            best["hit"] = min(best["hit"], timed(count, sizes, hit))
            cache = ResponseCache(sum(sizes) * 64)  # full after a few dozen: evicting
            timed(count, sizes, miss)
            best["full"] = min(best.get("full", float("inf")), timed(count, sizes, miss))
        missed, full = best["miss"] - best["make"], best["full"] - best["make"]
        # NOTE: a 1 MiB request is stored at its second miss: "full" times those stores.
        stored = "once it is full" if sum(sizes) < 4096 else "at its second miss (stored)"
        print(f"in process, {label}: a miss {missed:.1f} µs while the cache fills, "
              f"{full:.1f} µs {stored} (lookup, store); "
              f"a hit {best['hit'] - best['make']:.1f} µs (lookup, answer)")  # fmt: skip


def _report(
    rows: list[Row],
    found: dict[tuple[str, str], list[tuple[float, float, float, float, float]]],
    ns: argparse.Namespace,
) -> None:
    print(f"{ns.rounds} rounds of {ns.seconds} s, medians; cache {ns.cache_bytes} bytes\n")
    print("| row | cache | req/s | CPU µs/request (front + workers) | p99 ms | hits |")
    print("|---|---|---:|---|---:|---:|")
    for row in rows:
        totals = {}
        for name in ("off", "on"):
            runs = found[(row.name, name)]
            rps, front, workers, p99, hits = (
                statistics.median(r[i] for r in runs) for i in range(5)
            )
            cpu = [r[1] + r[2] for r in runs]
            totals[name] = (rps, statistics.median(cpu))
            print(f"| {row.name}, c={row.concurrency} | {name} | {rps:,.0f} | "
                  f"{front:.0f} + {workers:.0f} = {statistics.median(cpu):.0f} "
                  f"(min {min(cpu):.0f}) | {p99:.2f} | {hits:.0f} % |")  # fmt: skip
        (rps_off, cpu_off), (rps_on, cpu_on) = totals["off"], totals["on"]
        print(f"| {row.name}: on/off | | {rps_on / rps_off:.2f}× | "
              f"{(cpu_on / cpu_off - 1) * 100:+.1f} % | | |")  # fmt: skip


if __name__ == "__main__":
    main()
