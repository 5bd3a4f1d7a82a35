"""Process plumbing: start servers in their own process group, stop them for sure, time-box
every wait, and account CPU for a server's whole process tree or for one client process."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

_LIVE_GROUPS: set[int] = set()


def free_port() -> int:
    """A loopback port that was free a moment ago (peers without port-0 support need one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after `grace_s`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    _LIVE_GROUPS.discard(pgid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies of the group leader still count for killpg; reap-aware check via psutil.
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def _kill_all_at_exit() -> None:
    for pgid in list(_LIVE_GROUPS):
        kill_group(pgid, grace_s=5.0)


atexit.register(_kill_all_at_exit)


def install_signal_cleanup() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so that atexit kills every server we started."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


class ManagedProcess:
    """A child in its own session whose combined output goes to a log file.

    Lines are also offered to `on_line` (used to spot oipserve's `ready <url>` line).
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w", encoding="utf-8", errors="replace")
        self._log.write("$ " + " ".join(self.argv) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        self.pgid = self.proc.pid
        _LIVE_GROUPS.add(self.pgid)
        self._on_line = on_line
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", errors="replace")
            self._log.write(line)
            self._log.flush()
            if self._on_line is not None:
                with contextlib.suppress(Exception):
                    self._on_line(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        kill_group(self.pgid, grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._reader.join(timeout=2)
        self._log.close()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    """GET a URL; the status code, or None when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.25) -> bool:
    """Poll `predicate` until it holds or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def tree_pids(root_pid: int) -> list[int]:
    """The pid and every live descendant."""
    try:
        root = psutil.Process(root_pid)
        return [root_pid] + [p.pid for p in root.children(recursive=True)]
    except psutil.Error:
        return []


@dataclass
class CpuSnapshot:
    """CPU seconds per process of a tree at one instant, plus the machine's /proc/stat."""

    at: float
    per_pid: dict[int, tuple[str, float]]
    machine_busy_s: float = 0.0


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (other tenants included)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        ticks = [int(x) for x in fields]
    except (OSError, ValueError):
        return 0.0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    busy = sum(ticks[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(root_pid: int) -> CpuSnapshot:
    per_pid: dict[int, tuple[str, float]] = {}
    for pid in tree_pids(root_pid):
        try:
            proc = psutil.Process(pid)
            times = proc.cpu_times()
            per_pid[pid] = (_short_name(proc), times.user + times.system)
        except psutil.Error:
            continue
    return CpuSnapshot(time.monotonic(), per_pid, machine_busy_seconds())


def machine_cpu_pct(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """The whole machine's CPU use over the interval, % of one core (2 cores = 200%)."""
    wall = max(after.at - before.at, 1e-9)
    return 100.0 * (after.machine_busy_s - before.machine_busy_s) / wall


def _short_name(proc: psutil.Process) -> str:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        cmd = []
    name = proc.name()
    if cmd:
        tail = " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd[:3]))
        name = tail[:60]
    return name


def cpu_delta(before: CpuSnapshot, after: CpuSnapshot) -> tuple[float, list[tuple[str, float]]]:
    """Whole-tree CPU % of one core over the interval, and the busiest processes."""
    wall = max(after.at - before.at, 1e-9)
    rows: list[tuple[str, float]] = []
    for pid, (name, cpu) in after.per_pid.items():
        start = before.per_pid.get(pid, (name, 0.0))[1]
        rows.append((f"{name} [{pid}]", 100.0 * (cpu - start) / wall))
    rows.sort(key=lambda r: r[1], reverse=True)
    return sum(r[1] for r in rows), rows


#: An argument of the processes that run models: oipserve's workers (``python -m workers``)
#: and Triton's python-backend stubs. Every other process of a server's tree is a front.
_MODEL_RUNNERS = ("workers", "triton_python_backend_stub")


def _runs_models(pid: int) -> bool:
    try:
        command = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return any(os.path.basename(part) in _MODEL_RUNNERS for part in command)


def front_and_workers(before: CpuSnapshot, after: CpuSnapshot) -> tuple[float, float]:
    """CPU seconds the fronts (every process that runs no model: oipserve's HTTP fronts,
    ``tritonserver``) and the workers of a tree spent in between."""
    front = workers = 0.0
    for pid, (_, seconds) in after.per_pid.items():
        spent = seconds - before.per_pid.get(pid, ("", 0.0))[1]
        if _runs_models(pid):
            workers += spent
        else:
            front += spent
    return front, workers


@dataclass
class ClientRun:
    """Outcome of a bounded client process: output, exit code, own CPU time, wall time."""

    stdout: str
    stderr: str
    returncode: int
    cpu_s: float
    wall_s: float
    timed_out: bool


def run_client(
    argv: Sequence[str], env: dict[str, str] | None, timeout_s: float, work: Path
) -> ClientRun:
    """Run a client to completion, reaping it with wait4 for its exact CPU use (children it
    waited for included), and kill it if it overruns `timeout_s`."""
    work.mkdir(parents=True, exist_ok=True)
    out_path, err_path = work / "client.out", work / "client.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        _LIVE_GROUPS.add(proc.pid)
        timed_out = False
        status, usage = 0, None
        deadline = start + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.monotonic() > deadline:
                timed_out = True
                kill_group(proc.pid, grace_s=2.0)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.monotonic() - start
        _LIVE_GROUPS.discard(proc.pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = (usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
    return ClientRun(
        out_path.read_text(encoding="utf-8", errors="replace"),
        err_path.read_text(encoding="utf-8", errors="replace"),
        proc.returncode,
        cpu,
        wall,
        timed_out,
    )
