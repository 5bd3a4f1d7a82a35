"""py-spy sampling of a server's process tree under load, reduced to the top functions.

Used to name the bottleneck behind a missed goal: which process is busy, and in which Python
functions its samples fall (self time and inclusive time). Idle threads are not sampled, so
the shares are shares of on-CPU Python time.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# Leaf frames that mean "blocked, not on CPU" in native stacks (py-spy --native keeps
# sleeping threads); they are counted apart so the shares are shares of real work.
IDLE_LEAVES = (
    "epoll_wait",
    "epoll_pwait",
    "poll ",
    "ppoll",
    "select ",
    "pselect",
    "futex",
    "pthread_cond_",
    "sem_wait",
    "sem_timedwait",
    "nanosleep",
    "clock_nanosleep",
    "accept",
    "__GI___poll",
    "do_futex",
)
_PROC = re.compile(r'process (\d+):"(.*?)"(?:;|$)')


@dataclass
class ProcessProfile:
    pid: int
    cmd: str
    samples: int = 0
    self_time: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    callers: Counter[tuple[str, str]] = field(default_factory=Counter)
    idle: int = 0

    def top(self, n: int = 8) -> list[tuple[str, float, float]]:
        """(function, self %, inclusive %) of this process's samples."""
        total = max(self.samples, 1)
        return [
            (fn, 100.0 * cnt / total, 100.0 * self.inclusive[fn] / total)
            for fn, cnt in self.self_time.most_common(n)
        ]

    def top_with_callers(self, n: int = 8) -> list[tuple[str, float, str]]:
        """(self frame, %, the Python function that most often led to it): for native
        profiles this names which Python code a syscall or C hot spot belongs to."""
        total = max(self.samples, 1)
        out = []
        for fn, cnt in self.self_time.most_common(n):
            best = max(
                ((caller, c) for (f, caller), c in self.callers.items() if f == fn),
                key=lambda item: item[1],
                default=("", 0),
            )
            out.append((fn, 100.0 * cnt / total, best[0]))
        return out


def record(
    py_spy: Path, pid: int, duration_s: int, out: Path, native: bool = False, rate: int = 200
) -> str:
    """Sample `pid` for `duration_s`; returns '' or an error description.

    Python-only sampling covers the whole tree (--subprocesses) without pausing it; native
    sampling (C frames and syscalls too) has to pause the process, so it looks at `pid` alone
    at a lower rate.
    """
    out.unlink(missing_ok=True)
    mode = ["--native"] if native else ["--subprocesses", "--nonblocking"]
    try:
        res = subprocess.run(
            [
                str(py_spy),
                "record",
                "--pid",
                str(pid),
                *mode,
                "--rate",
                str(rate),
                "--duration",
                str(duration_s),
                "--format",
                "raw",
                "--output",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=duration_s + 30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {exc}"
    if not out.exists():
        return "py-spy wrote nothing: " + (res.stderr or res.stdout).strip()[-300:]
    return ""


def _short(frame: str) -> str:
    """`func (path/to/module.py:123)` -> `func (dir/module.py)`; line numbers split samples.
    Unresolved native addresses become `<libname>`."""
    if frame.startswith("0x"):
        lib = frame.split(" ", 1)[1] if " " in frame else "?"
        return f"<unresolved {lib.strip('()')}>"
    match = re.match(r"^(.*) \((.*?)(?::\d+)?\)$", frame)
    if not match:
        return frame
    name, path = match.groups()
    parts = Path(path).parts
    where = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({where})"


def parse(raw: Path, pid: int = 0, cmd: str = "") -> list[ProcessProfile]:
    """Collapsed stacks -> per-process self/inclusive counts, busiest process first.

    With --subprocesses each stack starts with one `process PID:"cmdline"` frame per ancestor;
    command lines may contain ';' (multiprocessing's `-c` one-liners), so those frames are
    peeled off with a regex before the rest is split on ';'. Stacks without such a frame
    (single-process native profiles) belong to `pid`.
    """
    procs: dict[int, ProcessProfile] = {}
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, num = line.rpartition(" ")
        if not stack or not num.isdigit():
            continue
        owner: ProcessProfile | None = None
        while True:
            match = _PROC.match(stack)
            if not match:
                break
            owner = procs.setdefault(
                int(match.group(1)), ProcessProfile(int(match.group(1)), match.group(2)[:90])
            )
            stack = stack[match.end() :]
        if owner is None:
            owner = procs.setdefault(pid, ProcessProfile(pid, cmd[:90]))
        frames = [_short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        n = int(num)
        if frames[-1].startswith(IDLE_LEAVES):
            owner.idle += n
            continue
        owner.samples += n
        owner.self_time[frames[-1]] += n
        py_caller = next((f for f in reversed(frames) if f.endswith(".py)")), "")
        owner.callers[(frames[-1], py_caller)] += n
        for fn in set(frames):
            owner.inclusive[fn] += n
    return sorted(procs.values(), key=lambda p: p.samples, reverse=True)
