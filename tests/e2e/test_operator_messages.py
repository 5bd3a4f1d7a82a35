"""What the server tells an operator: the ready line, the ready file, and mistakes that speak up.

Every test runs the real command line (subprocesses, real sockets).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import tritonclient.grpc as grpcclient

import oipserve
from oipserve.config.settings import Settings
from tests.support.cli import run_cli as lifecycle_cli
from tests.support.http import placements, request
from tests.support.server import ROOT, SAMPLE_REPOSITORY, ServerProcess, wait_for


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The CLI with every port free to choose (gRPC's too: these servers may start)."""
    return lifecycle_cli(*args, timeout=timeout, env={"OIPSERVE_GRPC_PORT": "0"})


def serve_args(repository: Path, *args: str) -> list[str]:
    """Free HTTP and gRPC ports (another test's server may hold the default ones; the
    metrics port is free through run_cli's environment), then ``args``, which win."""
    free = ["--http-port", "0", "--grpc-port", "0"]
    return ["serve", "--model-repository", str(repository), *free, *args]


def one_model(root: Path, name: str = "identity_fp32") -> Path:
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / name)
    return root


# ---- the ready line and the ready file -------------------------------------------------


def test_ready_line_survives_any_log_level_and_the_ready_file_has_the_ports(
    tmp_path: Path,
) -> None:
    ready_file = tmp_path / "run" / "ready.json"
    ready_file.parent.mkdir()
    repo = one_model(tmp_path / "repo")
    proc = ServerProcess(
        repo, ["--log-level", "critical", "--ready-file", str(ready_file)]
    ).wait_ready()
    try:
        assert proc.started_ready
        facts = json.loads(ready_file.read_text())
        assert facts == {
            "pid": proc.process.pid,
            "version": importlib.metadata.version("oipserve"),
            # the same install as this test's: compiled as it is here
            "request_path": oipserve.compiled,
            "ready": True,
            "host": "127.0.0.1",
            "http_port": proc.port,
            "grpc_port": proc.grpc_port,
            "metrics_port": int(proc.metrics_url.rsplit(":", 1)[1]),
            "not_ready": {},
        }
        assert [p.name for p in ready_file.parent.iterdir()] == ["ready.json"]  # no temp left
        status, _, _ = request(proc, "GET", "/v2/health/ready")
        assert status == 200
    finally:
        assert proc.stop() == 0, proc.log
    assert not ready_file.exists()
    # --log-level critical: the status lines are the only ones logged, how the request
    #   path runs among them.
    assert all("oipserve.status" in line for line in proc.lines), proc.log
    assert any(f"request path {oipserve.compiled}" in line for line in proc.lines), proc.log


def test_a_ready_file_left_by_a_server_gone_is_removed_at_the_start(tmp_path: Path) -> None:
    """A SIGKILLed server's ready file said ready, with its ports, through the next start's
    loading, and for good after a start that failed (found by fuzzing). A file whose pid
    still runs (another server writing there) is left alone."""
    ready_file = tmp_path / "ready.json"
    stale = {"pid": 2**22 + 7, "ready": True, "http_port": 1}  # beyond pid_max: gone
    ready_file.write_text(json.dumps(stale))
    _fail_to_start_with(ready_file)
    assert not ready_file.exists()
    alive = {"pid": os.getpid(), "ready": True}
    ready_file.write_text(json.dumps(alive))
    _fail_to_start_with(ready_file)
    assert json.loads(ready_file.read_text()) == alive


def test_a_second_server_on_the_same_ready_file_leaves_the_first_ones_alone(
    tmp_path: Path,
) -> None:
    """It overwrote the running server's file with its own ports, then removed it at its
    stop (found by fuzzing): it writes none now, says so, and removes nothing."""
    ready_file = tmp_path / "ready.json"
    repo = one_model(tmp_path / "repo")
    first = ServerProcess(repo, ["--ready-file", str(ready_file)]).wait_ready()
    try:
        written = json.loads(ready_file.read_text())
        assert written["pid"] == first.process.pid
        second = ServerProcess(repo, ["--ready-file", str(ready_file)]).wait_ready()
        assert second.stop() == 0, second.log
        assert f"cannot write --ready-file {ready_file}" in second.log, second.log
        assert json.loads(ready_file.read_text()) == written
    finally:
        assert first.stop() == 0, first.log
    assert not ready_file.exists()


def _fail_to_start_with(ready_file: Path) -> None:
    """A start with ``--ready-file`` that fails (exit 3): its HTTP port is taken."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = lifecycle_cli(
            "serve", "--model-repository", str(SAMPLE_REPOSITORY), "--http-port", port,
            "--metrics-port", "0", "--grpc-port", "0", "--ready-file", str(ready_file),
        )  # fmt: skip
    assert result.returncode == 3, result.stderr


def test_no_ready_line_when_a_model_failed_but_one_line_per_model_and_a_summary(
    tmp_path: Path,
) -> None:
    repo = one_model(tmp_path / "repo")
    (repo / "garbage" / "1").mkdir(parents=True)
    (repo / "garbage" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    ready_file = tmp_path / "ready.json"
    proc = ServerProcess(
        repo, ["--log-level", "critical", "--ready-file", str(ready_file)]
    ).wait_ready()
    try:
        assert not proc.started_ready
        status, _, _ = request(proc, "GET", "/v2/health/ready")
        assert status == 503  # and the summary gave the right port
        facts = json.loads(ready_file.read_text())
        assert facts["ready"] is False and list(facts["not_ready"]) == ["garbage"]
        assert facts["http_port"] == proc.port and facts["grpc_port"] == proc.grpc_port
    finally:
        assert proc.stop() == 0, proc.log
    log = proc.log
    assert "ready http://" not in log.replace("not ready", "")
    assert "model 'garbage' is not ready: version 1:" in log
    assert "not ready: 1 of 2 models loaded at start are not ready" in log
    assert (
        f"serving http://127.0.0.1:{proc.port}" in log and f"grpc=127.0.0.1:{proc.grpc_port}" in log
    )


def test_a_ready_file_in_a_missing_directory_stops_start_up(tmp_path: Path) -> None:
    repo = one_model(tmp_path / "repo")
    result = run_cli(*serve_args(repo, "--ready-file", str(tmp_path / "nope" / "ready.json")))
    assert result.returncode == 3
    assert "--ready-file" in result.stderr and "does not exist" in result.stderr


# ---- KIND_CPU with GPUs ----------------------------------------------------------------


def test_kind_cpu_runs_on_the_cpu_when_the_devices_are_gpus(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    one_model(repo, "on_cpu")
    (repo / "on_cpu" / "config.pbtxt").write_text(
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
    one_model(repo, "anywhere")
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"gpus": [{"name": "NVIDIA A10"}]}))
    args = ["--devices", "auto", "--hardware-inventory", str(inventory)]
    proc = ServerProcess(repo, args).wait_ready()
    try:
        assert proc.started_ready, proc.log
        where = placements(proc)
        assert [d for d, _ in where["on_cpu"]] == ["cpu"]
        assert [d for d, _ in where["anywhere"]] == ["cuda:0"]  # not on the extra CPU worker
        body = json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        )
        status, _, raw = request(proc, "POST", "/v2/models/on_cpu/infer", body)
        assert status == 200, raw
    finally:
        assert proc.stop() == 0, proc.log
    assert "starting 1 CPU worker(s) for KIND_CPU instance groups" in proc.log


# ---- worker stops ----------------------------------------------------------------------


def test_a_worker_stopped_by_sigterm_is_info_a_killed_one_is_error() -> None:
    proc = ServerProcess(SAMPLE_REPOSITORY, ["--model-control-mode", "explicit"]).wait_ready()
    try:
        (worker,) = proc.worker_pids()
        os.kill(worker, signal.SIGTERM)
        assert wait_for(lambda: "worker 1 replaced" in proc.log, 60), proc.log
        (worker,) = proc.worker_pids()
        os.kill(worker, signal.SIGKILL)
        assert wait_for(lambda: proc.log.count("worker 1 replaced") == 2, 60), proc.log
    finally:
        assert proc.stop() == 0, proc.log
    lines = proc.lines
    sigterm = [line for line in lines if "was stopped by SIGTERM" in line]
    assert len(sigterm) == 1 and " INFO " in sigterm[0], proc.log
    died = [line for line in lines if " died: " in line]
    assert len(died) == 1 and " ERROR " in died[0] and "SIGKILL" in died[0], proc.log
    stopped = [line for line in lines if "worker 1 (pid" in line and line.endswith("stopped\n")]
    assert len(stopped) == 1 and " INFO " in stopped[0], proc.log  # at shutdown


# ---- repositories that serve nothing -----------------------------------------------------


def test_an_empty_repository_warns_loudly_and_strict_refuses_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(SAMPLE_REPOSITORY / "identity_fp32" / "1" / "model.onnx", repo / "model.onnx")
    proc = ServerProcess(repo, ["--log-level", "error"]).wait_ready()
    try:
        assert proc.started_ready  # nothing failed: an empty server is ready
    finally:
        assert proc.stop() == 0, proc.log
    assert "holds no model directory, so no model will be served" in proc.log
    assert f"the expected layout is {repo}/<model>/<version>/model.onnx" in proc.log
    assert f"move model.onnx to {repo}/model/1/model.onnx" in proc.log

    started = time.monotonic()
    result = run_cli(*serve_args(repo, "--strict"))
    assert result.returncode == 3, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("oipserve: error")]
    assert len(errors) == 1 and "refusing to start" in errors[0] and "no model" in errors[0]
    assert time.monotonic() - started < 30


def test_a_flat_model_file_names_the_layout_and_exit_on_error_refuses_it(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    (repo / "flat").mkdir(parents=True)
    shutil.copy(SAMPLE_REPOSITORY / "identity_fp32" / "1" / "model.onnx", repo / "flat")
    one_model(repo)
    proc = ServerProcess(repo, ["--log-level", "critical"]).wait_ready()
    try:
        assert not proc.started_ready
    finally:
        assert proc.stop() == 0, proc.log
    line = next(line for line in proc.lines if "model 'flat' is not ready" in line)
    assert "expected layout DIR/<model>/<version>/model.onnx" in line
    assert "move it to flat/1/model.onnx" in line

    result = run_cli(*serve_args(repo, "--exit-on-error", "true"))
    assert result.returncode == 3
    errors = [line for line in result.stderr.splitlines() if line.startswith("oipserve: error")]
    assert len(errors) == 1 and "1 of 2 models failed to load (flat:" in errors[0], errors
    assert "refusing to start" in errors[0]
    assert "stopped" in result.stderr  # workers were stopped cleanly, not left behind


# ---- flags ---------------------------------------------------------------------------------


def test_load_model_without_explicit_mode_is_refused() -> None:
    result = run_cli(*serve_args(SAMPLE_REPOSITORY, "--load-model", "simple"), timeout=30)
    assert result.returncode == 2
    assert "--load-model" in result.stderr and "--model-control-mode explicit" in result.stderr
    result = run_cli(
        *serve_args(
            SAMPLE_REPOSITORY, "--model-control-mode", "explicit", "--load-model", "*,simple"
        ),
        timeout=30,
    )
    assert result.returncode == 2 and "must be the only --load-model" in result.stderr


@pytest.mark.parametrize("flag", ["--grpc-port", "--metrics-port", "--http-port"])
def test_a_port_in_use_stops_start_up_before_any_model_loads(flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = run_cli(*serve_args(SAMPLE_REPOSITORY, flag, str(port)), timeout=60)
        elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert result.stderr.splitlines() == [
        f"oipserve: error: cannot listen on 127.0.0.1:{port} ({flag} {port}): "
        "Address already in use"
    ]
    assert elapsed < 15


def test_help_lists_every_flag_with_its_default_and_variable() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    assert "One frozen settings" not in top.stdout
    assert "serve" in top.stdout and "--version" in top.stdout
    serve = run_cli("serve", "--help")
    assert serve.returncode == 0
    text = " ".join(serve.stdout.split())  # argparse wraps lines
    for field in msgspec.structs.fields(Settings):
        assert f"--{field.name.replace('_', '-')}" in text, field.name
        assert f"OIPSERVE_{field.name.upper()}" in text, field.name
    assert "(default: 8000; env OIPSERVE_HTTP_PORT)" in text
    assert "(default: 512 MiB; env OIPSERVE_GRPC_MAX_MESSAGE_BYTES)" in text


def test_version_flag_and_server_metadata(server: ServerProcess) -> None:
    expected = importlib.metadata.version("oipserve")
    result = run_cli("--version")
    assert (result.returncode, result.stdout) == (0, f"oipserve {expected}\n")
    status, _, raw = request(server, "GET", "/v2")
    assert status == 200 and json.loads(raw)["version"] == expected
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.get_server_metadata().version == expected


# ---- scripts run without an activated venv -------------------------------------------------

SYSTEM_PYTHON = Path("/usr/bin/python3")


def _system_python_lacks(module: str) -> bool:
    if not SYSTEM_PYTHON.exists():
        return False
    found = subprocess.run([SYSTEM_PYTHON, "-c", f"import {module}"], capture_output=True)
    return found.returncode != 0


def _checkout_with_venv(tmp_path: Path, *parts: str) -> Path:
    """A copy of the given parts of the repository, with .venv pointing at the test's venv."""
    checkout = tmp_path / "checkout"
    for part in parts:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, checkout / part, ignore=shutil.ignore_patterns("*.onnx"))
        else:
            (checkout / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, checkout / part)
    (checkout / ".venv").symlink_to(sys.prefix)
    return checkout


@pytest.mark.skipif(not _system_python_lacks("onnx"), reason="needs a python3 without onnx")
def test_build_py_runs_from_a_python_without_onnx(tmp_path: Path) -> None:
    checkout = _checkout_with_venv(tmp_path, "model-repository/build.py")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    result = subprocess.run(
        [SYSTEM_PYTHON, checkout / "model-repository" / "build.py", "--out", out],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (out / "simple" / "1" / "model.onnx").is_file()


@pytest.mark.skipif(not _system_python_lacks("grpc_tools"), reason="needs a python3 without it")
def test_generate_grpc_runs_without_an_activated_venv(tmp_path: Path) -> None:
    checkout = _checkout_with_venv(tmp_path, "scripts/generate_grpc.sh", "proto")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON")}
    env["PATH"] = f"{SYSTEM_PYTHON.parent}:/bin"
    result = subprocess.run(
        ["bash", checkout / "scripts" / "generate_grpc.sh"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    generated = checkout / "oipserve" / "grpc_generated"
    assert (generated / "grpc_service_pb2.py").read_text() == (
        ROOT / "oipserve" / "grpc_generated" / "grpc_service_pb2.py"
    ).read_text()
