"""Peer and tool virtual environments, created by the harness with pinned requirements.

Each peer lives in its own venv under benchmarks/.venvs/<name>: MLServer and KServe cannot share
one (pip silently downgrades MLServer to 1.2.1), and PyTriton wants numpy<2. A venv is reused
while its recorded requirement list matches; a changed pin rebuilds it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from . import VENVS_DIR

FALLBACK_ORT = "1.31.1"


def host_onnxruntime_version() -> str:
    """ONNX Runtime version of the interpreter running the harness (oipserve's), so that every
    peer and the in-process floor run the same ORT release."""
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return FALLBACK_ORT


def requirements(ort_version: str) -> dict[str, list[str]]:
    """Pinned requirements per venv (versions from shared/reference/peer-setup-notes.md)."""
    ort = f"onnxruntime=={ort_version}"
    return {
        # uvloop 0.22+ breaks MLServer's inference-pool workers ("no current event loop").
        "mlserver": ["mlserver==1.7.1", "uvloop==0.21.0", ort],
        "kserve": ["kserve==0.21.0", ort],
        # nvidia-pytriton ships tritonserver 2.51 with the python backend and its stubs.
        "triton": ["nvidia-pytriton==0.7.0", ort],
        # Client side and reporting: the gRPC load generator, charts and the profiler.
        "tools": [
            "grpcio==1.85.1",
            "tritonclient[grpc]==2.73.0",
            "numpy==2.4.6",
            "matplotlib==3.11.2",
            "py-spy==0.4.3",
        ],
    }


def venv_python(name: str) -> Path:
    return VENVS_DIR / name / "bin" / "python"


def ensure_venv(name: str, reqs: list[str], log: Path, timeout_s: float = 1200.0) -> Path:
    """Create (or reuse) benchmarks/.venvs/<name> with exactly `reqs` installed."""
    root = VENVS_DIR / name
    marker = root / ".oipbench-requirements.json"
    python = venv_python(name)
    if python.exists() and marker.exists():
        try:
            if json.loads(marker.read_text()) == reqs:
                return python
        except (OSError, ValueError):
            pass
    if root.exists():
        shutil.rmtree(root)
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[setup] creating venv {name}: {' '.join(reqs)}", flush=True)
    with log.open("w") as out:
        subprocess.run(
            [_base_python(), "-m", "venv", str(root)],
            check=True,
            stdout=out,
            stderr=out,
            timeout=300,
        )
        subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *reqs],
            check=True,
            stdout=out,
            stderr=out,
            timeout=timeout_s,
        )
    marker.write_text(json.dumps(reqs))
    return python


def _base_python() -> str:
    """A non-venv interpreter of the same version (a venv of a venv works too, but this keeps
    the peers independent of whatever venv runs the harness)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(sys.base_prefix) / "bin" / f"python{version}"
    return str(base) if base.exists() else sys.executable


def package_versions(python: Path, packages: list[str]) -> dict[str, str]:
    """Installed versions of `packages` inside another interpreter's environment."""
    code = (
        "import json,sys\nfrom importlib import metadata\nout={}\n"
        "for p in sys.argv[1:]:\n"
        "    try: out[p]=metadata.version(p)\n"
        "    except metadata.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    try:
        res = subprocess.run(
            [str(python), "-c", code, *packages], capture_output=True, text=True, timeout=60
        )
        return dict(json.loads(res.stdout or "{}"))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
