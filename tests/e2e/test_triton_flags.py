"""Triton's deployment flags: what kserve-tritonserver passes works after an image swap.

`tritonserver` as an alias of `serve`, `--model-store` as an alias of `--model-repository`,
`--allow-http` / `--allow-grpc` (true/false), Triton's default ports without flags, Triton
flags we do not implement refused by name, and a repository that is not written to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from oipserve.config.settings import (
    STRICT_MODEL_CONFIG_DEPRECATED,
    STRICT_MODEL_CONFIG_OVERRIDDEN,
    auto_complete_enabled,
    deprecation_warnings,
    load_settings,
)
from tests.support.cli import run_cli
from tests.support.deploy import KSERVE_TRITONSERVER_ARGS, fingerprint
from tests.support.grpc_health import NOT_SERVING, health_check
from tests.support.http import request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess


def test_kserve_tritonserver_args_parse_to_the_same_server() -> None:
    command, settings = load_settings(KSERVE_TRITONSERVER_ARGS, {})
    assert command == "tritonserver"
    assert settings.model_repository == "/mnt/models"
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8080, 9000, 8002)
    assert settings.allow_http and settings.allow_grpc and settings.allow_metrics


def test_no_flags_keep_tritons_ports() -> None:
    _, settings = load_settings(["serve", "--model-store", "/m"], {})
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
    assert settings.allow_http and settings.allow_grpc


@pytest.mark.parametrize(
    ("given", "expected"), [("false", False), ("true", True), ("0", False), ("1", True)]
)
def test_allow_flags_take_tritons_booleans(given: str, expected: bool) -> None:
    _, settings = load_settings(["serve", "--model-store=/m", f"--allow-grpc={given}"], {})
    assert settings.allow_grpc is expected
    _, settings = load_settings(["serve", "--model-store=/m"], {"OIPSERVE_ALLOW_HTTP": given})
    assert settings.allow_http is expected


def test_bad_allow_value_names_the_flag() -> None:
    result = run_cli("serve", "--model-store", str(SAMPLE_REPOSITORY), "--allow-http=maybe")
    assert result.returncode == 2 and "--allow-http" in result.stderr, result.stderr


@pytest.mark.parametrize(
    "flag",
    [
        # Triton flags seen in KServe and Triton deployments that oipserve does not implement:
        # refused by name (exit 2), never silently ignored. docs/deploy.md lists them.
        "--log-verbose=1",
        "--model-load-thread-count=4",
        "--strict-readiness=false",
        "--model-control-mode=poll",
    ],
)
def test_unimplemented_triton_flags_are_refused_by_name(flag: str) -> None:
    result = run_cli("tritonserver", f"--model-store={SAMPLE_REPOSITORY}", flag)
    assert result.returncode == 2, result.stderr
    assert flag.split("=")[0] in result.stderr or "poll" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("flags", "enabled", "warnings"),
    [
        ([], True, []),
        (["--disable-auto-complete-config"], False, []),
        (["--strict-model-config=true"], False, [STRICT_MODEL_CONFIG_DEPRECATED]),
        (["--strict-model-config=false"], True, [STRICT_MODEL_CONFIG_DEPRECATED]),
        (
            ["--strict-model-config=false", "--disable-auto-complete-config"],
            False,
            [STRICT_MODEL_CONFIG_DEPRECATED, STRICT_MODEL_CONFIG_OVERRIDDEN],
        ),
    ],
)
def test_auto_complete_flags_as_triton_takes_them(
    flags: list[str], enabled: bool, warnings: list[str]
) -> None:
    """Triton's --disable-auto-complete-config and its deprecated --strict-model-config
    (KServe's older manifests pass the latter), with Triton's warnings."""
    _, settings = load_settings(["tritonserver", "--model-store=/m", *flags], {})
    assert auto_complete_enabled(settings) is enabled
    assert deprecation_warnings(settings) == warnings
    _, settings = load_settings(
        ["serve", "--model-store=/m"], {"OIPSERVE_DISABLE_AUTO_COMPLETE_CONFIG": "true"}
    )
    assert not auto_complete_enabled(settings)


@pytest.mark.parametrize(
    "given",
    [
        ("--model-repository", "a", "--model-repository", "b"),
        ("--model-store", "a", "--model-repository", "b"),
    ],
)
def test_a_second_repository_is_refused(given: tuple[str, ...]) -> None:
    """Triton serves several; the second replaced the first without a word here (its
    models 404; found by fuzzing): exit 2, saying so."""
    result = run_cli("tritonserver", *given)
    assert result.returncode == 2, result.stderr
    assert "a model repository was given already (a)" in result.stderr, result.stderr


def test_an_empty_host_is_refused() -> None:
    """--host "" bound every interface, where the default is the loopback one (an unset
    template variable gives it; found by fuzzing)."""
    result = run_cli("serve", f"--model-repository={SAMPLE_REPOSITORY}", "--host", "")
    assert result.returncode == 2, result.stderr
    assert "--host" in result.stderr, result.stderr


def test_http_and_grpc_both_off_is_refused() -> None:
    result = run_cli(
        "serve", "--model-store", str(SAMPLE_REPOSITORY), "--allow-http=false", "--allow-grpc=0"
    )
    assert result.returncode == 3
    assert "--allow-http and --allow-grpc are both false" in result.stderr


@pytest.fixture()
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for name in ("simple", "identity_fp32"):
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
    # Read-only for everyone; as root (tests often are) the mode stops nothing, so the
    # fingerprint (sizes, modes, mtimes, contents, the entries themselves) is what checks.
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & 0o555)
    return root


def test_allow_http_false_serves_grpc_only_and_writes_nothing(repository: Path) -> None:
    before = fingerprint(repository)
    srv = ServerProcess(
        argv=[
            "tritonserver",
            f"--model-store={repository}",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
            "--allow-http=false",
            "--allow-grpc=true",
            "--model-control-mode=explicit",  # repository control below
            "--load-model=*",
        ]
    ).wait_ready()
    try:
        assert srv.ready_line.split("ready ", 1)[1].startswith("http=off ("), srv.ready_line
        assert srv.url == "" and srv.grpc_url and srv.metrics_url
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("simple")
        # Repository control (reads the directory again) over gRPC, still nothing written.
        client.unload_model("identity_fp32")
        client.load_model("identity_fp32")
        assert client.is_model_ready("identity_fp32")
        client.close()
    finally:
        assert srv.stop() == 0, srv.log
    assert "Traceback" not in srv.log, srv.log
    assert fingerprint(repository) == before


def test_allow_grpc_false_serves_http_only(repository: Path) -> None:
    srv = ServerProcess(repository, ["--allow-grpc=false"]).wait_ready()
    try:
        assert " grpc=" not in srv.ready_line and srv.grpc_url == "", srv.ready_line
        status, _, body = request(srv, "GET", "/v2/health/ready")
        assert (status, json.loads(body)) == (200, {"ready": True})
    finally:
        assert srv.stop() == 0, srv.log


def test_allow_http_false_with_a_failed_model_says_not_ready_and_names_grpc(
    tmp_path: Path,
) -> None:
    # The not-ready summary (#16) and --allow-http false (#17) together: no HTTP address to
    # name, the gRPC one still there, and gRPC's readiness agrees with the line.
    root = tmp_path / "models"
    shutil.copytree(SAMPLE_REPOSITORY / "simple", root / "simple")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    srv = ServerProcess(root, ["--allow-http=false"]).wait_ready()
    try:
        assert not srv.started_ready, srv.ready_line
        assert "serving http=off (" in srv.ready_line and srv.grpc_url, srv.ready_line
        assert "model 'broken' is not ready:" in srv.log
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        assert client.is_model_ready("simple") and not client.is_server_ready()
        client.close()
        # gRPC's standard health check says the same (it was UNIMPLEMENTED; Triton answers it)
        assert health_check(srv.grpc_url) == NOT_SERVING
    finally:
        assert srv.stop() == 0, srv.log


def test_server_name_is_what_clients_written_for_triton_check(repository: Path) -> None:
    """`--server-name triton`: Triton's health/metadata example clients require that name."""
    srv = ServerProcess(repository, ["--server-name", "triton"]).wait_ready()
    try:
        status, _, body = request(srv, "GET", "/v2")
        assert status == 200 and json.loads(body)["name"] == "triton"
        with grpcclient.InferenceServerClient(srv.grpc_url) as client:
            assert client.get_server_metadata().name == "triton"
    finally:
        assert srv.stop() == 0, srv.log


def test_server_name_from_the_environment_and_never_empty() -> None:
    _, settings = load_settings(["serve", "--model-repository", "m"], {"OIPSERVE_SERVER_NAME": "t"})
    assert settings.server_name == "t"
    _, settings = load_settings(["serve", "--model-repository", "m"], {})
    assert settings.server_name == "oipserve"
    result = run_cli("serve", "--model-repository", str(SAMPLE_REPOSITORY), "--server-name=")
    assert result.returncode == 2 and "--server-name" in result.stderr, result.stderr
