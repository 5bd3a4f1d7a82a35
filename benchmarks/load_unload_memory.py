"""Memory after load/unload cycles: oipserve against Triton 2.51, in one run (issue 39 item 4).

Each server runs in explicit model-control mode on a private repository holding the model
under test (``simple``) and two models that cannot load: ``broken_onnx`` (a model.onnx that
is not ONNX) and ``broken_config`` (a config.pbtxt that does not parse). A cycle is: load the
model, send one inference (so sessions, pools and batchers are used, not only built), unload
it. Then come the failed loads. Every ``--every`` cycles (and after the first, which is the
baseline) the script samples, after the unload has returned:

- the front's RSS (oipserve) or tritonserver's (Triton);
- each worker's RSS: the front's child processes (oipserve's workers outlive an unload, so
  the same PIDs are followed throughout; Triton's python-backend stubs exit with the unload,
  so they are sampled while the model is loaded, before the unload);
- /dev/shm: the entries with the server's prefix (``oipserve-<pid>-``; Triton's python
  backend: ``triton_python_backend_shm_region``), their count and bytes.

It prints the curve as a table and writes benchmarks/results/<date>-load-unload-memory.md.
The bound checked: the last sample within 10 % (or 20 MiB, whichever is larger) of the first,
and /dev/shm holding what it held.

    .venv/bin/python benchmarks/load_unload_memory.py                    # 200 cycles, 50 failed
    .venv/bin/python benchmarks/load_unload_memory.py --cycles 20 --failed 5 --no-triton
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402
from oipbench import REPO_DIR, RESULTS_DIR, WORK_DIR  # noqa: E402
from oipbench.models import NP_TO_OIP, ModelCase, build_models, write_oipserve_repo  # noqa: E402
from oipbench.servers import Tuning, serve_from, start_triton  # noqa: E402
from oipbench.venvs import venv_python  # noqa: E402

MiB = 1024 * 1024
BROKEN = ("broken_onnx", "broken_config")
#: The bound of issue 39: within 10 % of the first sample, or 20 MiB, whichever is larger.
REL_BOUND = 0.10
ABS_BOUND = 20 * MiB
#: The models a cycle may load (built by model-repository/build.py, as benchmarks/run.py does).
MODELS = {
    "simple": "model-repository's `simple`: two INT32 [16] inputs, a 303-byte graph",
    "matmul_relu": "a 1024x1024 FP32 MatMul + Relu: 4 MiB of weights per session",
}
TRITON_SHM = "triton_python_backend_shm_region"


def infer_body(case: ModelCase) -> bytes:
    """A JSON inference request with the case's inputs."""
    inputs = [
        {
            "name": name,
            "shape": list(array.shape),
            "datatype": NP_TO_OIP[array.dtype],
            "data": array.flatten().tolist(),
        }
        for name, array in case.inputs.items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def within(first: int, last: int) -> bool:
    """True when ``last`` is within the bound of ``first`` (growth only counts)."""
    return last - first <= max(REL_BOUND * first, ABS_BOUND)


def post(url: str, body: bytes = b"", timeout: float = 120.0) -> tuple[int, str]:
    """POST ``body``; the status and the text of the answer, errors included."""
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def shm(prefix: str) -> dict[str, int]:
    """The /dev/shm entries whose name starts with ``prefix``, with their sizes."""
    found: dict[str, int] = {}
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefix):
            try:
                found[name] = os.stat(f"/dev/shm/{name}").st_size
            except OSError:
                continue
    return found


@dataclass
class Sample:
    cycle: int
    front: int
    workers: dict[int, int]
    shm: dict[str, int]
    seconds: float


@dataclass
class Target:
    """A server under test: how to reach it and what its processes are."""

    label: str
    url: str
    model: str
    body: bytes
    front_pid: int
    shm_prefix: str
    #: True when the workers outlive an unload (sampled after it); False: sampled while loaded.
    workers_persist: bool
    stop: Callable[[], None]
    samples: list[Sample] = field(default_factory=list)
    loaded_workers: dict[int, int] = field(default_factory=dict)
    failed_answers: dict[str, str] = field(default_factory=dict)
    error: str = ""


def write_broken(root: Path, template: Path) -> None:
    """``broken_onnx`` and ``broken_config`` beside a working model, copied from ``template``."""
    for name in BROKEN:
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(template, target, symlinks=False)
        config = (target / "config.pbtxt").read_text().replace(template.name, name)
        (target / "config.pbtxt").write_text(config)
    onnx = root / "broken_onnx" / "1" / "model.onnx"
    onnx.unlink()
    onnx.write_bytes(b"this is not an ONNX file\n" * 64)
    (root / "broken_config" / "config.pbtxt").write_text("max_batch_size: [ not a number\n")


def cycle(target: Target, n: int, sample_loaded: bool) -> None:
    """One load, one inference, one unload; each must succeed."""
    base = f"{target.url}/v2/repository/models/{target.model}"
    status, text = post(f"{base}/load")
    if status != 200:
        raise RuntimeError(f"{target.label}: load {n} answered {status}: {text[:300]}")
    status, text = post(f"{target.url}/v2/models/{target.model}/infer", target.body)
    if status != 200:
        raise RuntimeError(f"{target.label}: infer {n} answered {status}: {text[:300]}")
    if sample_loaded:
        target.loaded_workers = {p: rss(p) for p in live_children(target.front_pid)}
    status, text = post(f"{base}/unload")
    if status != 200:
        raise RuntimeError(f"{target.label}: unload {n} answered {status}: {text[:300]}")
    wait_unloaded(target)


def wait_unloaded(target: Target, timeout: float = 30.0) -> None:
    """Until the model's readiness is false (an unload may finish after its answer) and,
    where the workers go with the model (Triton's stubs), until they have exited: Triton
    answers the unload before its stubs are gone."""
    deadline = time.monotonic() + timeout
    url = f"{target.url}/v2/models/{target.model}/ready"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5):
                pass
        except urllib.error.HTTPError:
            if target.workers_persist or not live_children(target.front_pid):
                return
        time.sleep(0.05)
    raise RuntimeError(f"{target.label}: {target.model} not gone {timeout:.0f} s after its unload")


def live_children(pid: int) -> list[int]:
    """The children of ``pid`` that have not exited (zombies do not count)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    alive = []
    for kid in kids:
        try:
            if kid.status() != psutil.STATUS_ZOMBIE:
                alive.append(kid.pid)
        except psutil.Error:
            continue
    return alive


def failed_load(target: Target, name: str) -> None:
    status, text = post(f"{target.url}/v2/repository/models/{name}/load")
    if status == 200:
        raise RuntimeError(f"{target.label}: the load of {name} succeeded")
    target.failed_answers.setdefault(name, f"{status} {text.strip()[:160]}")


def take_sample(target: Target, n: int, started: float) -> Sample:
    if target.workers_persist:
        workers = {p: rss(p) for p in live_children(target.front_pid)}
    else:
        workers = dict(target.loaded_workers)
    return Sample(
        cycle=n,
        front=rss(target.front_pid),
        workers=workers,
        shm=shm(target.shm_prefix),
        seconds=time.monotonic() - started,
    )


def sample_points(cycles: int, every: int) -> Iterator[int]:
    yield 1
    yield from range(every, cycles + 1, every)
    if cycles % every:
        yield cycles


def run_target(target: Target, cycles: int, failed: int, every: int) -> None:
    """The cycles, then the failed loads, sampling as it goes; errors end up in the report."""
    started = time.monotonic()
    points = set(sample_points(cycles, every))
    try:
        for n in range(1, cycles + 1):
            cycle(target, n, sample_loaded=n in points and not target.workers_persist)
            if n in points:
                target.samples.append(take_sample(target, n, started))
                print(row(target, target.samples[-1]), flush=True)
        for i in range(failed):
            failed_load(target, BROKEN[i % len(BROKEN)])
        # One more good cycle after the failures: the workers that survived them still serve.
        cycle(target, cycles + 1, sample_loaded=not target.workers_persist)
        target.samples.append(take_sample(target, cycles + 1, started))
        print(row(target, target.samples[-1], f"+{failed} failed"), flush=True)
    except Exception as err:  # noqa: BLE001 (the report says what went wrong)
        target.error = str(err)
        print(f"{target.label}: {err}", flush=True)


def row(target: Target, s: Sample, note: str = "") -> str:
    workers = ", ".join(f"{v / MiB:.1f}" for _, v in sorted(s.workers.items()))
    return (
        f"| {target.label} | {s.cycle}{' ' + note if note else ''} | {s.front / MiB:.1f} | "
        f"{workers or '-'} | {len(s.shm)} / {sum(s.shm.values()) / MiB:.1f} | {s.seconds:.0f} |"
    )


HEADER = (
    "| server, model | after cycle | front RSS (MiB) | worker RSS (MiB, by PID) "
    "| /dev/shm entries / MiB | elapsed (s) |\n|---|---|---|---|---|---|"
)


def verdict(target: Target) -> list[str]:
    """One line per bound: first sample against the last."""
    if target.error:
        return [f"- {target.label}: did not finish: {target.error}"]
    if len(target.samples) < 2:
        return [f"- {target.label}: no samples"]
    first, last = target.samples[0], target.samples[-1]
    lines = []
    ok = within(first.front, last.front)
    lines.append(
        f"- {target.label} front: {first.front / MiB:.1f} → {last.front / MiB:.1f} MiB "
        f"({(last.front - first.front) / MiB:+.1f}): {'within' if ok else 'OUTSIDE'} the bound"
    )
    survivors = sorted(set(first.workers) & set(last.workers))
    for pid in survivors:
        a, b = first.workers[pid], last.workers[pid]
        ok = within(a, b)
        lines.append(
            f"- {target.label} worker {pid}: {a / MiB:.1f} → {b / MiB:.1f} MiB "
            f"({(b - a) / MiB:+.1f}): {'within' if ok else 'OUTSIDE'} the bound"
        )
    if not survivors:
        lines.append(
            f"- {target.label} workers: none survives an unload (each load starts new ones); "
            f"while loaded: {sorted(round(v / MiB, 1) for v in first.workers.values())} MiB at "
            f"the first cycle, {sorted(round(v / MiB, 1) for v in last.workers.values())} at "
            "the last"
        )
    same = set(first.shm) == set(last.shm) and sum(first.shm.values()) == sum(last.shm.values())
    lines.append(
        f"- {target.label} /dev/shm: {len(first.shm)} entries / {sum(first.shm.values())} B → "
        f"{len(last.shm)} / {sum(last.shm.values())} B: {'unchanged' if same else 'CHANGED'}"
    )
    return lines


def start_ours(work: Path, case: ModelCase, instances: int) -> Target:
    tuning = Tuning(instances=instances)
    repo = write_oipserve_repo(
        {case.name: case}, work / "repos" / "oipserve-memory", instances, tuning.ort_params()
    )
    write_broken(repo, repo / case.name)
    args = [
        "--model-repository",
        str(repo),
        "--host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--devices",
        "cpu",
        "--instances-per-device",
        str(instances),
        "--model-control-mode",
        "explicit",
    ]
    server = serve_from(REPO_DIR, args)
    return Target(
        label=f"oipserve, {case.name}",
        url=f"http://{server.http}",
        model=case.name,
        body=infer_body(case),
        front_pid=server.proc.pid,
        shm_prefix=f"oipserve-{server.proc.pid}-",
        workers_persist=True,
        stop=server.stop,
    )


def start_theirs(work: Path, case: ModelCase, instances: int) -> Target | str:
    """Triton 2.51 from the benchmark's peer venv, or why it cannot run here."""
    python = venv_python("triton")
    if not python.exists():
        return f"no Triton venv at {python.parent.parent} (benchmarks/run.py creates it)"
    tuning = Tuning(instances=instances)
    server = start_triton(
        python.parent.parent,
        {case.name: case},
        work,
        tuning,
        extra_args=["--model-control-mode", "explicit"],
    )
    if server.error:
        server.stop()
        return f"Triton did not start: {server.error[:400]}"
    repo = work / "repos" / "triton"
    write_broken(repo, repo / case.name)
    return Target(
        label=f"Triton 2.51, {case.name}",
        url=server.http_url,
        model=case.name,
        body=infer_body(case),
        front_pid=server.root_pid(),
        shm_prefix=TRITON_SHM,
        workers_persist=False,
        stop=server.stop,
    )


def report(targets: list[Target], skipped: str, args: argparse.Namespace, out: Path) -> str:
    lines = [
        f"# Memory after load/unload cycles ({dt.date.today().isoformat()})",
        "",
        f"`benchmarks/load_unload_memory.py --cycles {args.cycles} --failed {args.failed} "
        f"--every {args.every} --instances {args.instances} --models {' '.join(args.models)}` "
        f"on {os.cpu_count()} CPUs (shared machine). A cycle: load the model, one JSON "
        "inference, unload. Then "
        f"{args.failed} failed loads alternating `broken_onnx` (a model.onnx that is not ONNX) "
        "and `broken_config` (a config.pbtxt that does not parse), then one more good cycle "
        "(the last row). Samples are taken after the unload has returned, the model reports "
        "not ready and (Triton) its stubs have exited. Bound: the last sample within 10 % "
        "(or 20 MiB, the larger) of the first.",
        "",
        *[f"- `{name}`: {MODELS[name]}" for name in args.models],
        "",
        HEADER,
    ]
    for t in targets:
        lines += [row(t, s) for s in t.samples[:-1]]
        if t.samples:
            lines.append(row(t, t.samples[-1], f"+{args.failed} failed"))
    lines += ["", "## Verdict", ""]
    for t in targets:
        lines += verdict(t)
        for name, answer in t.failed_answers.items():
            lines.append(f"- {t.label} `{name}` load answered: `{answer}`")
    if skipped:
        lines += [f"- Triton not run: {skipped}"]
    lines += [
        "",
        "Triton's workers are its python-backend stub processes: they exit with the unload, "
        "so their RSS is sampled while the model is loaded, and the front is `tritonserver`.",
        "",
    ]
    text = "\n".join(lines)
    out.write_text(text)
    return text


def run_server(
    start: Callable[[], Target | str], args: argparse.Namespace, targets: list[Target]
) -> str:
    """Start one server, run the cycles on it, stop it; why it did not start, or ""."""
    target = start()
    if isinstance(target, str):
        return target
    targets.append(target)
    try:
        run_target(target, args.cycles, args.failed, args.every)
    finally:
        target.stop()
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--failed", type=int, default=50)
    parser.add_argument("--every", type=int, default=20, help="sample every K cycles")
    parser.add_argument("--instances", type=int, default=2, help="worker processes / stubs")
    parser.add_argument(
        "--models", nargs="+", choices=sorted(MODELS), default=["simple", "matmul_relu"]
    )
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR / f"{dt.date.today()}-load-unload-memory.md"
    )
    args = parser.parse_args()
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="memory-", dir=WORK_DIR))
    targets: list[Target] = []
    skipped = "--no-triton" if args.no_triton else ""
    print(HEADER, flush=True)
    try:
        cases = build_models(work / "models")
        for name in args.models:
            case = cases[name]
            run_server(lambda case=case: start_ours(work, case, args.instances), args, targets)
            if not args.no_triton:
                why = run_server(
                    lambda case=case: start_theirs(work, case, args.instances), args, targets
                )
                skipped = skipped or why
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(targets, skipped, args, args.out)
    print("\n" + text.split("## Verdict", 1)[1].strip())
    print(f"\nwrote {args.out}")
    ours = [t for t in targets if t.label.startswith("oipserve")]
    failed = any(
        t.error or "OUTSIDE" in line or "CHANGED" in line for t in ours for line in verdict(t)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
