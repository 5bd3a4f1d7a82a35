"""CPU an idle oipserve uses: every process of its tree, read from /proc/<pid>/stat.

Issue 40's bar: a server that has had no request for a second uses less than 1 % of a
core, all its processes together (busy polling must stop, timers must not spin). For each
``--http-workers`` value asked for (``default``: the flag left out), this starts a server
on the tiny model, sends ``--requests`` REST requests (so the fronts' and workers' polling
has something to stop after), waits ``--settle`` seconds, then reads utime + stime of the
front and of every descendant twice, ``--seconds`` apart, and prints each process's share
of a core (and its resident memory) and the total. Exit status 1 when a total is at or
over ``--limit`` %.

    .venv/bin/python benchmarks/idle_cpu.py                      # default and 2 fronts
    .venv/bin/python benchmarks/idle_cpu.py --modes default --seconds 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.models import build_models, write_oipserve_repo  # noqa: E402
from oipbench.payloads import json_body  # noqa: E402
from oipbench.servers import SourceServer, Tuning, serve_from  # noqa: E402

WORK = BENCH / ".work"
REPOSITORY = WORK / "repos" / "idle"
MODEL = "simple"
TICKS = os.sysconf("SC_CLK_TCK")


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from /proc/<pid>/stat's parent field)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                parents[int(entry)] = int(stat[1])
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree.extend(frontier)
    return tree


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first); None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    stat = _stat(pid)
    return None if stat is None else (int(stat[11]) + int(stat[12])) / TICKS


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB (/proc/<pid>/statm's second field, in pages)."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def label(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in argv if w]
    module = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"), "")
    return module or (Path(words[0]).name if words else "?")


def measure(
    server: SourceServer, ns: argparse.Namespace, body: bytes
) -> dict[tuple[int, str], float]:
    """Each process's CPU (% of a core) over ``ns.seconds`` once the server has idled."""
    url = f"http://{server.http}/v2/models/{MODEL}/infer"
    for _ in range(ns.requests):
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()
    time.sleep(ns.settle)
    pids = descendants(server.proc.pid)
    before = {pid: cpu_seconds(pid) for pid in pids}
    started = time.monotonic()
    time.sleep(ns.seconds)
    after = {pid: cpu_seconds(pid) for pid in pids}
    wall = time.monotonic() - started
    shares = {}
    for pid in pids:
        start, end = before[pid], after[pid]
        if start is not None and end is not None:
            shares[(pid, f"{label(pid)} ({rss_mib(pid):.0f} MiB)")] = 100.0 * (end - start) / wall
    return shares


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="default,2", help="--http-workers values, or default")
    parser.add_argument("--seconds", type=float, default=5.0, help="window read idle")
    parser.add_argument("--settle", type=float, default=1.0, help="idle seconds before it")
    parser.add_argument("--requests", type=int, default=200, help="sent before idling")
    parser.add_argument("--instances", type=int, default=2, help="ORT workers")
    parser.add_argument("--limit", type=float, default=1.0, help="% of a core, whole tree")
    ns = parser.parse_args()
    cases = build_models(WORK / "models")
    write_oipserve_repo(
        cases, REPOSITORY, ns.instances, Tuning(instances=ns.instances).ort_params()
    )
    body = json_body(cases[MODEL], WORK / "payloads" / f"{MODEL}.json").path.read_bytes()
    over = False
    for mode in ns.modes.split(","):
        args = ["--model-repository", str(REPOSITORY), "--host", "127.0.0.1", "--http-port", "0",
                "--grpc-port", "0", "--devices", "cpu", "--instances-per-device",
                str(ns.instances)]  # fmt: skip
        if mode != "default":
            args += ["--http-workers", mode]
        server = serve_from(BENCH.parent, args)
        try:
            shares = measure(server, ns, body)
        finally:
            server.stop()
        total = sum(shares.values())
        over = over or total >= ns.limit
        verdict = "ok" if total < ns.limit else "OVER"
        print(f"--http-workers {mode}: {total:.2f} % of a core over {ns.seconds:.0f} s idle "
              f"({len(shares)} processes) [{verdict}, limit {ns.limit} %]")  # fmt: skip
        for (pid, name), share in sorted(shares.items(), key=lambda kv: -kv[1]):
            print(f"    {pid:>7} {name:44} {share:6.2f} %")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
