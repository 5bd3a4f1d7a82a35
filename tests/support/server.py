"""Running a real ``oipserve serve`` subprocess for tests."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_REPOSITORY = ROOT / "model-repository"
READY = re.compile(r"ready http://(\S+):(\d+)")
#: Logged instead of the ready line when a model loaded at start is not ready.
NOT_READY = re.compile(r"not ready: .* serving http://(\S+):(\d+)")
#: The ready (or not-ready) line with ``--allow-http false`` (no HTTP port to name).
READY_NO_HTTP = re.compile(r"(?:ready|serving) http=off ")
GRPC = re.compile(r"grpc=(\S+):(\d+)")
METRICS = re.compile(r"metrics=(\S+):(\d+)")


class ServerProcess:
    """One server subprocess; its log is collected so failures can show it."""

    def __init__(
        self,
        repository: Path | str = SAMPLE_REPOSITORY,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        argv: Sequence[str] | None = None,
        wrap: Sequence[str] = (),
    ) -> None:
        """``argv``, when given, is the whole command line after ``oipserve`` (a manifest's
        args, say); ``repository`` and ``args`` are then not used. ``wrap`` goes before
        the command (``small_dev_shm``'s), which it must exec (the server keeps its pid)."""
        self.command = [*wrap, sys.executable, "-m", "oipserve"]
        if argv is not None:
            self.command += argv
        else:
            self.command += [
                "serve",
                "--model-repository",
                str(repository),
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                "--metrics-port",
                "0",
                *args,
            ]
        # NOTE: one HTTP front unless a test asks for more (flag or env): the default,
        #   --http-workers auto, would start two on this machine in every test's server
        #   (tests/e2e/test_http_workers.py and others run several on purpose). One worker
        #   a device too: --instances-per-device auto gives 1 below 12 CPUs, 2 from 12, and
        #   the suite's process count should not depend on the machine it runs on.
        full_env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "OIPSERVE_HTTP_WORKERS": "1",
            "OIPSERVE_INSTANCES_PER_DEVICE": "1",
            **(env or {}),
        }
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        self.port = 0
        #: ``host:port`` of the gRPC service (as tritonclient.grpc wants it).
        self.grpc_url = ""
        self.grpc_port = 0
        #: ``http://host:port`` of ``GET /metrics``; empty with ``--allow-metrics false``.
        self.metrics_url = ""
        #: True when the start-up line was ``ready ...``, False for ``not ready: ... serving``.
        self.started_ready = False
        #: The server's ``ready ...`` (or ``not ready: ...``) line, once it was logged.
        self.ready_line = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            match = READY.search(line) or NOT_READY.search(line)
            if (match or READY_NO_HTTP.search(line)) and not self._ready.is_set():
                self.ready_line = line
                self.started_ready = "not ready:" not in line
                if match:
                    self.url = f"http://{match.group(1)}:{match.group(2)}"
                    self.port = int(match.group(2))
                grpc_match = GRPC.search(line)
                if grpc_match:
                    self.grpc_url = f"{grpc_match.group(1)}:{grpc_match.group(2)}"
                    self.grpc_port = int(grpc_match.group(2))
                metrics_match = METRICS.search(line)
                if metrics_match:
                    self.metrics_url = f"http://{metrics_match.group(1)}:{metrics_match.group(2)}"
                self._ready.set()
        self._ready.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def host_port(self) -> str:
        return self.url.removeprefix("http://")

    def wait_ready(self, timeout: float = 90) -> ServerProcess:
        if not self._ready.wait(timeout) or not self.ready_line:
            self.kill()
            raise RuntimeError(f"server did not become ready:\n{self.log}")
        return self

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, wait, return the exit code (kill and fail loudly if it hangs)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"server did not stop within {timeout}s:\n{self.log}") from None
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def worker_pids(self) -> list[int]:
        """PIDs of the server's worker processes (children of the front)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            pids = [int(p) for p in children.read_text().split()]
        except OSError:
            return []
        return [p for p in pids if "-m workers" in cmdline(p)]

    def http_front_pids(self) -> list[int]:
        """PIDs of the server's other HTTP fronts (``--http-workers``)."""
        return self._children_running("oipserve.scaleout.process")

    def children(self) -> list[int]:
        """The front's child processes, whichever of its threads started them."""
        pids: list[int] = []
        for task in Path(f"/proc/{self.process.pid}/task").glob("*"):
            try:
                pids += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
        return pids

    def _children_running(self, module: str) -> list[int]:
        """The front's children running ``module``."""
        return sorted(p for p in self.children() if f"-m {module}" in cmdline(p))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def shm_entries(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"oipserve-{pid}-")]


#: TCP state ESTABLISHED in /proc/net/tcp.
ESTABLISHED = "01"


def process_state(pid: int) -> str:
    """The state letter of ``pid`` (``Z``: a zombie, exited but not reaped), or "" if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """Running (a zombie, waiting to be reaped, has exited)."""
    return process_state(pid) not in ("", "Z")


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def tcp_links(pid: int) -> list[tuple[int, int]]:
    """(local port, remote port) of the established TCP connections ``pid`` holds."""
    inodes = _socket_inodes(pid)
    links = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if state == ESTABLISHED and inode in inodes:
                links.append((int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)))
    return links


@contextmanager
def stopped_worker(proc: ServerProcess) -> Iterator[int]:
    """The server's one worker, stopped (SIGSTOP) for the block and continued (SIGCONT) at
    its end, whatever happened in it: what the front sent it stays put meanwhile. A worker
    gone by then (killed, replaced: the block's test says why) is left alone."""
    (worker,) = proc.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    try:
        yield worker
    finally:
        with suppress(ProcessLookupError):
            os.kill(worker, signal.SIGCONT)


def front_pid(proc: ServerProcess, which: str) -> int:
    """The pid of a two-front server's ``"primary"`` front, or of its ``"extra front"``."""
    if which == "primary":
        return proc.process.pid
    (pid,) = proc.http_front_pids()
    return pid


def socket_to_front(
    proc: ServerProcess, pid: int, tries: int = 64, port: int | None = None
) -> socket.socket:
    """A TCP connection to the HTTP port (or ``port``: the gRPC port, say) held by the
    front ``pid`` (``--http-workers``).

    The kernel spreads connections over the fronts (``SO_REUSEPORT``): connections are
    opened until one lands on ``pid``, the others closed.
    """
    fronts = [proc.process.pid, *proc.http_front_pids()]
    port = port or proc.port
    for _ in range(tries):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        ours = sock.getsockname()[1]
        holder: list[int] = []

        def held(ours: int = ours, holder: list[int] = holder) -> bool:
            holder[:] = [f for f in fronts if (port, ours) in tcp_links(f)]
            return bool(holder)

        if wait_for(held, timeout=10) and holder == [pid]:
            return sock
        sock.close()
    raise RuntimeError(f"no connection landed on front {pid} in {tries} tries")


def small_dev_shm(mib: int) -> list[str] | None:
    """A command prefix for ``ServerProcess(wrap=...)`` that runs the server in a mount
    namespace of its own whose ``/dev/shm`` is a tmpfs of ``mib`` MiB (its workers too;
    gone with them); None where this machine does not allow it (not root, no
    ``unshare``)."""
    wrap = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
    script = f'mount -t tmpfs -o size={mib}m tmpfs /dev/shm && exec "$@"'
    try:
        probe = subprocess.run([*wrap, script, "sh", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [*wrap, script, "sh"] if probe.returncode == 0 else None


def grpc_client_on_front(proc: ServerProcess, pid: int, tries: int = 64) -> Any:
    """A tritonclient gRPC client (``tritonclient.grpc.InferenceServerClient``) whose
    connection the front ``pid`` holds (``--http-workers``): clients are made, each with
    a connection of its own, until one's lands on ``pid``, the others closed."""
    import tritonclient.grpc as grpcclient

    fronts = [proc.process.pid, *proc.http_front_pids()]
    port = proc.grpc_port
    for _ in range(tries):
        before = {ours for ours, theirs in tcp_links(os.getpid()) if theirs == port}
        client = grpcclient.InferenceServerClient(
            proc.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
        client.is_server_live()
        mine = {ours for ours, theirs in tcp_links(os.getpid()) if theirs == port} - before
        holder: list[int] = []

        def held(mine: set[int] = mine, holder: list[int] = holder) -> bool:
            holder[:] = [f for f in fronts if any((port, m) in tcp_links(f) for m in mine)]
            return bool(holder)

        if len(mine) == 1 and wait_for(held, timeout=10) and holder == [pid]:
            return client
        client.close()
    raise RuntimeError(f"no gRPC connection landed on front {pid} in {tries} tries")


def wait_for(predicate: object, timeout: float = 30, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return False


def stays(predicate: Callable[[], bool], seconds: float, interval: float = 0.05) -> bool:
    """True when ``predicate`` held on every poll for ``seconds``; False as soon as it did not.

    The negative of ``wait_for``: that something does NOT happen over a window (a call that
    must not return, a log line that must not come). ``wait_for`` on such a condition
    returns at its first poll, before anything had the time to happen.
    """
    deadline = time.monotonic() + seconds
    while True:
        if not predicate():
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(interval)


def steadily(predicate: Callable[[], bool], times: int = 3) -> Callable[[], bool]:
    """True once ``predicate`` held on ``times`` polls in a row (a lone request is queued
    for the batcher's 2 ms delay: that must not count)."""
    hits = 0

    def check() -> bool:
        nonlocal hits
        hits = hits + 1 if predicate() else 0
        return hits >= times

    return check


def pending(proc: ServerProcess, model: str = "batched") -> int:
    """Requests of ``model`` queued in the front (Triton's pending request count)."""
    with urllib.request.urlopen(proc.metrics_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    key = f'nv_inference_pending_request_count{{model="{model}",version="1"}} '
    (line,) = [ln for ln in text.splitlines() if ln.startswith(key)]
    return int(float(line.split()[-1]))


def failures(proc: ServerProcess, reason: str, model: str = "batched") -> int:
    """Failed requests of ``model`` for ``reason`` (``REJECTED``, ``CANCELED``, ...), as
    the primary front's metrics count them."""
    with urllib.request.urlopen(proc.metrics_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    key = f'nv_inference_request_failure{{model="{model}",version="1",reason="{reason}"}} '
    (line,) = [ln for ln in text.splitlines() if ln.startswith(key)]
    return int(float(line.split()[-1]))


#: Two identity calls of 64 MiB each way, sent from a process of its own: grpc's Python
#: layer holds the GIL while it copies a message, which would stall this process's probe.
_SEND_LARGE_GRPC = """
import sys, grpc, numpy as np
from tritonclient.grpc import service_pb2
request = service_pb2.ModelInferRequest(model_name="identity_fp32")
request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16 * 1024 * 1024])
request.raw_input_contents.append(np.ones(16 * 1024 * 1024, np.float32).tobytes())
limit = [("grpc.max_send_message_length", 1 << 28), ("grpc.max_receive_message_length", 1 << 28)]
with grpc.insecure_channel(sys.argv[1], options=limit) as channel:
    if sys.argv[2] == "stream":
        infer = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        replies = list(infer(iter([request.SerializeToString()] * 2), timeout=120))
    else:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        replies = [infer(request.SerializeToString(), timeout=120) for _ in range(2)]
    assert [len(reply) > 64 * 1024 * 1024 for reply in replies] == [True, True], replies[:1]
"""


def worst_probe_during_large_grpc_calls(
    server: ServerProcess,
    stream: bool = False,
    *,
    probe: Callable[[ServerProcess, Callable[[], bool]], float],
) -> float:
    """``probe`` (e.g. ``loop_checks.most_loop_cpu_per_probe``: what the front's loop did
    while a ``/v2/health/live`` waited) while two clients each make two 64 MiB identity
    calls (unary, or two requests on one ModelStreamInfer stream)."""
    how = "stream" if stream else "unary"
    senders = [
        subprocess.Popen([sys.executable, "-c", _SEND_LARGE_GRPC, server.grpc_url, how])
        for _ in range(2)
    ]
    try:
        worst = probe(server, lambda: any(s.poll() is None for s in senders))
    finally:
        for sender in senders:
            sender.wait(120)
    assert [sender.returncode for sender in senders] == [0, 0]
    return worst
