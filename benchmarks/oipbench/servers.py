"""How each server under test is configured, started on 127.0.0.1, checked and stopped.

Every server gets the same ONNX Runtime session settings (intra/inter-op threads, sequential
execution) and, where it has such a knob, the same number of model instances / worker
processes. What each one was given is written into `settings` and ends up in the results file.
"""

from __future__ import annotations

import collections
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import PEERS_DIR
from .models import (
    ModelCase,
    write_mlserver_repo,
    write_oipserve_repo,
    write_triton_repo,
)
from .procs import ManagedProcess, free_port, http_status, wait_until


@dataclass(frozen=True)
class Tuning:
    """The knobs every server gets the same value for."""

    intra_op_threads: int = 1
    inter_op_threads: int = 1
    instances: int = 2

    def ort_params(self) -> dict[str, str]:
        return {
            "intra_op_thread_count": str(self.intra_op_threads),
            "inter_op_thread_count": str(self.inter_op_threads),
        }


@dataclass
class Server:
    """A started (or failed) server and what the report needs to know about it."""

    key: str
    label: str
    protocols: set[str]
    settings: list[str]
    unsupported: dict[str, str] = field(default_factory=dict)
    http_url: str = ""
    grpc_target: str | None = None
    proc: ManagedProcess | None = None
    error: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    scenario_filter: set[str] | None = None  # None: every scenario
    idle_cpu_pct: float | None = None

    def infer_url(self, model: str) -> str:
        return f"{self.http_url}/v2/models/{model}/infer"

    def ready_url(self) -> str:
        return f"{self.http_url}/v2/health/ready"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def root_pid(self) -> int:
        return self.proc.proc.pid if self.proc else -1

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


#: Seconds ``serve_from`` waits for a server's ready line before it stops the server.
SERVE_START_S = 120.0
#: ``oipserve serve``'s ready line: its HTTP address and, when it serves gRPC, its gRPC one.
_READY = re.compile(r"ready http://(\S+).*?(?: grpc=(\S+)|$)")


@dataclass
class SourceServer:
    """``oipserve serve`` run from a source tree by a benchmark script (``serve_from``)."""

    proc: subprocess.Popen[str]
    #: host:port of its HTTP and gRPC listeners ("" for gRPC when it serves none).
    http: str
    grpc: str

    def stop(self) -> None:
        """SIGTERM (the server drains and frees its shared memory), and wait for it."""
        self.proc.terminate()
        self.proc.wait(30)


def serve_from(
    code: Path, args: Sequence[str], extra_env: Mapping[str, str] | None = None
) -> SourceServer:
    """``python -P -m oipserve serve ARGS`` with the oipserve of the source tree ``code``
    (first on ``PYTHONPATH``, before the caller's own entries), metrics off, returned once
    its ready line is logged. The rest of its log is read in a thread: a full pipe would
    stall the server."""
    # NOTE: -P: the current directory's oipserve (another build) must not come first.
    path = os.pathsep.join(filter(None, (str(code), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path, "OIPSERVE_METRICS_PORT": "0", **(extra_env or {})}
    argv = [sys.executable, "-P", "-m", "oipserve", "serve", *args]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    # NOTE: a server whose workers cannot start (a build whose worker fails at once) never
    #   logs its ready line and never exits: stopped after SERVE_START_S, not waited for.
    deadline = threading.Timer(SERVE_START_S, proc.terminate)
    deadline.start()
    tail: collections.deque[str] = collections.deque(maxlen=20)
    try:
        for line in proc.stdout:
            tail.append(line)
            found = _READY.search(line)
            if found:
                threading.Thread(target=proc.stdout.read, daemon=True).start()
                return SourceServer(proc, found.group(1), found.group(2) or "")
    finally:
        deadline.cancel()
    proc.wait(30)
    raise RuntimeError(
        f"oipserve serve {' '.join(args)} (from {code}) did not start within "
        f"{SERVE_START_S:.0f} s:\n{''.join(tail)}"
    )


def _wait_ready(server: Server, timeout_s: float) -> None:
    def ready() -> bool:
        if not server.alive():
            return True
        return http_status(server.ready_url(), timeout_s=1.0) == 200

    wait_until(ready, timeout_s, interval_s=0.5)
    if not server.alive():
        server.error = "exited during start-up:\n" + (server.proc.log_tail() if server.proc else "")
    elif http_status(server.ready_url(), timeout_s=2.0) != 200:
        server.error = f"not ready after {timeout_s:.0f} s:\n" + (
            server.proc.log_tail() if server.proc else ""
        )


# --- oipserve -----------------------------------------------------------------------------

READY_URL = re.compile(r"(https?://(?:127\.0\.0\.1|localhost|\[::1\]):\d+)")


#: What an unset OIPSERVE_HTTP_WORKERS means (docs/scaling.md, "The default number of fronts").
_AUTO_FRONTS = "unset (auto: from the CPUs, one for a repository with a batching model)"


def start_oipserve(
    cmd: str,
    cases: dict[str, ModelCase],
    work: Path,
    tuning: Tuning,
    timeout_s: float = 90.0,
    key: str = "oipserve",
    label: str = "oipserve",
    extra_args: Sequence[str] = (),
) -> Server:
    """`oipserve serve` on port 0; the URL comes from its `ready <url>` log line.

    `extra_args` go after the harness's own flags (e.g. `--allow-client-shm true`)."""
    repo = write_oipserve_repo(
        cases, work / "repos" / "oipserve", tuning.instances, tuning.ort_params()
    )
    server = Server(
        key=key,
        label=label,
        protocols={"json", "binary", "grpc", "jpeg"},
        settings=[
            f"`{cmd} serve --model-repository … --host 127.0.0.1 --http-port 0 --grpc-port P "
            f"--instances-per-device {tuning.instances}`",
            f"{tuning.instances} ORT worker processes, each session with intra-op threads = "
            f"logical cores ÷ instances = {max(1, (os.cpu_count() or 1) // tuning.instances)}, "
            "inter-op 1, sequential, spinning off (oipserve's own rule; the config.pbtxt the "
            f"harness writes also says instance_group count {tuning.instances} and "
            f"intra_op_thread_count={tuning.intra_op_threads})",
            "front processes (Falcon ASGI on uvicorn, HTTP/2 for gRPC) handing tensors to the "
            "workers through shared memory: OIPSERVE_HTTP_WORKERS="
            f"{os.environ.get('OIPSERVE_HTTP_WORKERS', _AUTO_FRONTS)} (unless the command sets it)",
        ],
    )
    grpc_port = free_port()
    base = [
        *shlex.split(cmd),
        "serve",
        "--model-repository",
        str(repo),
        "--host",
        "127.0.0.1",
        "--http-port",
        "0",
    ]
    tail = ["--instances-per-device", str(tuning.instances), *extra_args]
    attempts = [base + ["--grpc-port", str(grpc_port)] + tail, base + tail]
    for i, argv in enumerate(attempts):
        found = threading.Event()
        url: list[str] = []

        def on_line(line: str, found: threading.Event = found, url: list[str] = url) -> None:
            if "ready" in line.lower():
                match = READY_URL.search(line)
                if match and not url:
                    url.append(match.group(1).replace("localhost", "127.0.0.1"))
                    found.set()

        # NOTE: /metrics on a free port (8002 by default), so two builds can run side by
        #   side; a build without metrics ignores the variable.
        env = {**os.environ, "OIPSERVE_METRICS_PORT": "0"}
        proc = ManagedProcess(argv, work / "logs" / f"{key}-{i}.log", env=env, on_line=on_line)
        server.proc = proc
        wait_until(
            lambda found=found, proc=proc: found.is_set() or not proc.alive(),
            timeout_s,
            interval_s=0.2,
        )
        if found.is_set():
            server.http_url = url[0]
            server.grpc_target = f"127.0.0.1:{grpc_port}" if "--grpc-port" in argv else None
            if server.grpc_target is None:
                server.protocols.discard("grpc")
                server.unsupported["grpc"] = "`--grpc-port` not accepted by this build"
            server.error = ""
            wait_until(lambda: http_status(server.ready_url()) == 200, 30.0)
            return server
        server.error = "no `ready <url>` line:\n" + proc.log_tail()
        rejected_grpc = "--grpc-port" in argv and "grpc" in proc.log_tail().lower()
        proc.stop()
        if not rejected_grpc:
            break
    return server


# --- Triton -------------------------------------------------------------------------------


def start_triton(
    venv: Path,
    cases: dict[str, ModelCase],
    work: Path,
    tuning: Tuning,
    timeout_s: float = 120.0,
    extra_args: Sequence[str] = (),
) -> Server:
    """tritonserver from the nvidia-pytriton wheel, python-backend models calling ORT.

    `extra_args` go after the harness's own flags (e.g. `--model-control-mode explicit`)."""
    site = next((venv / "lib").glob("python3.*/site-packages"))
    dist = site / "pytriton" / "tritonserver"
    backends = work / "triton-backends"
    py_dir = backends / "python"
    py_dir.mkdir(parents=True, exist_ok=True)
    for item in (dist / "backends" / "python").iterdir():
        if item.is_file() and not (py_dir / item.name).exists():
            (py_dir / item.name).symlink_to(item)
    stub = (
        dist
        / "python_backend_stubs"
        / sysconfig.get_python_version()
        / ("triton_python_backend_stub")
    )
    if not (py_dir / stub.name).exists():
        (py_dir / stub.name).symlink_to(stub)
    repo = write_triton_repo(
        cases,
        work / "repos" / "triton",
        PEERS_DIR / "triton_model.py",
        tuning.instances,
        tuning.ort_params(),
    )
    http_port, grpc_port = free_port(), free_port()
    env = dict(os.environ)
    # The stub links libpython3.11.so.1.0: it must be this interpreter's, not Debian's copy.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = ":".join(
        p for p in (libdir, str(site / "nvidia_pytriton.libs"), env.get("LD_LIBRARY_PATH", "")) if p
    )
    # The stub's embedded interpreter finds the venv (numpy<2, onnxruntime) via `python3` on
    # PATH, as PyTriton arranges it.
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    argv = [
        str(dist / "bin" / "tritonserver"),
        "--model-repository",
        str(repo),
        "--backend-directory",
        str(backends),
        "--http-address",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--grpc-address",
        "127.0.0.1",
        "--grpc-port",
        str(grpc_port),
        "--allow-metrics",
        "false",
        "--disable-auto-complete-config",
        "--log-verbose",
        "0",
        *extra_args,
    ]
    server = Server(
        key="triton",
        label="Triton",
        protocols={"json", "binary", "grpc"},
        unsupported={"jpeg": "no image decoding in Triton's python/onnxruntime backends"},
        settings=[
            "`tritonserver` 2.51 from the nvidia-pytriton 0.7.0 wheel, python backend (the wheel "
            "has no onnxruntime backend); `benchmarks/peers/triton_model.py` runs ORT",
            f"instance_group count {tuning.instances} (KIND_CPU) = {tuning.instances} python "
            "stub processes per model; no dynamic batching; metrics off",
            f"ORT intra={tuning.intra_op_threads}, inter={tuning.inter_op_threads}, sequential",
            "run directly, not through PyTriton's Python proxy (which adds ~2 ms a request)",
        ],
        http_url=f"http://127.0.0.1:{http_port}",
        grpc_target=f"127.0.0.1:{grpc_port}",
    )
    server.proc = ManagedProcess(argv, work / "logs" / "triton.log", env=env)
    _wait_ready(server, timeout_s)
    return server


# --- MLServer -----------------------------------------------------------------------------


def start_mlserver(
    venv: Path,
    cases: dict[str, ModelCase],
    work: Path,
    tuning: Tuning,
    parallel_workers: int,
    key: str,
    timeout_s: float = 120.0,
) -> Server:
    """`mlserver start` with the custom ONNX Runtime runtime in benchmarks/peers."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    settings = {
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "parallel_workers": parallel_workers,
        "debug": False,
        "metrics_endpoint": None,
        "load_models_at_startup": True,
    }
    ort = {"intra_op_threads": tuning.intra_op_threads, "inter_op_threads": tuning.inter_op_threads}
    repo = write_mlserver_repo(cases, work / "repos" / key, settings, ort)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PEERS_DIR)
    env.pop("MLSERVER_PARALLEL_WORKERS", None)
    server = Server(
        key=key,
        label="MLServer" if parallel_workers == 0 else f"MLServer pw={parallel_workers}",
        protocols={"json", "grpc"},
        unsupported={
            "binary": "MLServer has no REST binary tensor extension",
            "jpeg": "no image decoding in MLServer",
        },
        settings=[
            f"`mlserver start` with settings.json parallel_workers={parallel_workers}"
            + (
                " (its fastest setting: inference in the front process)"
                if parallel_workers == 0
                else f" ({parallel_workers} inference-pool processes)"
            ),
            "debug=false, metrics endpoint off, no adaptive batching",
            "runtime `benchmarks/peers/mlserver_onnx.py` (NumpyCodec in/out), ORT "
            f"intra={tuning.intra_op_threads}, inter={tuning.inter_op_threads}",
        ],
        http_url=f"http://127.0.0.1:{http_port}",
        grpc_target=f"127.0.0.1:{grpc_port}",
    )
    server.proc = ManagedProcess(
        [str(venv / "bin" / "mlserver"), "start", str(repo)],
        work / "logs" / f"{key}.log",
        env=env,
        cwd=repo,
    )
    _wait_ready(server, timeout_s)
    return server


# --- KServe -------------------------------------------------------------------------------


def start_kserve(
    venv: Path,
    cases: dict[str, ModelCase],
    work: Path,
    tuning: Tuning,
    workers: int,
    key: str,
    timeout_s: float = 120.0,
) -> Server:
    """KServe's ModelServer with a kserve.Model around ORT, forced onto 127.0.0.1."""
    http_port, grpc_port = free_port(), free_port()
    argv = [
        str(venv / "bin" / "python"),
        str(PEERS_DIR / "kserve_onnx.py"),
        "--bench-http-port",
        str(http_port),
        "--bench-grpc-port",
        str(grpc_port),
        "--bench-workers",
        str(workers),
        "--bench-intra",
        str(tuning.intra_op_threads),
        "--bench-inter",
        str(tuning.inter_op_threads),
    ]
    for case in cases.values():
        argv += ["--bench-model", f"{case.name}={case.onnx_path.resolve()}"]
    server = Server(
        key=key,
        label="KServe" if workers == 1 else f"KServe workers={workers}",
        protocols={"json", "binary", "grpc"},
        unsupported={"jpeg": "no image decoding in KServe's v2 data plane"},
        settings=[
            f"`kserve.ModelServer(workers={workers})`"
            + (" (its default: one uvicorn process)" if workers == 1 else ""),
            "`benchmarks/peers/kserve_onnx.py`: sync predict (as KServe's own sklearn server), "
            f"ORT intra={tuning.intra_op_threads}, inter={tuning.inter_op_threads}",
            "REST/gRPC listeners patched from 0.0.0.0/[::] to 127.0.0.1; per-request access "
            "and trace logs off",
        ],
        http_url=f"http://127.0.0.1:{http_port}",
        grpc_target=f"127.0.0.1:{grpc_port}",
    )
    server.proc = ManagedProcess(argv, work / "logs" / f"{key}.log")
    _wait_ready(server, timeout_s)
    return server
