"""Node's @grpc/grpc-js as a test client: its packages installed once, outside the repository.

The packages are pinned and installed with npm into ``~/.cache/oipserve-tests/grpc-js/<pins>``
(``OIPSERVE_TEST_CACHE`` moves the root), reused while the directory holds a finished
install. A lock file serialises the install, so parallel test runs neither clash nor install
twice. Only a missing ``node`` or ``npm`` is a reason to skip (the caller decides); a failed
install raises, because CI has both and a broken install must not look like a pass.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.server import ROOT

#: The packages and their versions (bump both here; the cache directory follows).
PINS = {"@grpc/grpc-js": "1.14.7", "@grpc/proto-loader": "0.8.1"}
CLIENT = ROOT / "tests" / "support" / "grpc_js_client.js"
PROTO_DIR = ROOT / "proto"
#: Written last by an install; a directory without it is an interrupted install, redone.
_DONE = ".installed.json"


def missing_tools() -> list[str]:
    """The tools of ``node`` and ``npm`` that are not on PATH."""
    return [tool for tool in ("node", "npm") if shutil.which(tool) is None]


def cache_root() -> Path:
    base = os.environ.get("OIPSERVE_TEST_CACHE") or str(Path.home() / ".cache" / "oipserve-tests")
    return Path(base) / "grpc-js"


def install_dir() -> Path:
    """``node_modules``' parent for the pinned versions, installed on first use."""
    key = "_".join(f"{name.split('/')[-1]}-{version}" for name, version in PINS.items())
    target = cache_root() / key
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = target / _DONE
        if done.exists() and json.loads(done.read_text()) == PINS:
            return target
        _install(target)
        done.write_text(json.dumps(PINS))
    return target


def _install(target: Path) -> None:
    """npm install of the pins into a fresh ``target``; raises with npm's output on failure."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    (target / "package.json").write_text(json.dumps({"name": "oipserve-grpc-js", "private": True}))
    specs = [f"{name}@{version}" for name, version in PINS.items()]
    argv = ["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--save-exact"]
    done = subprocess.run(
        [*argv, *specs], cwd=target, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"npm install {' '.join(specs)} failed:\n{done.stdout}\n{done.stderr}")


def run_client(target: str, timeout_s: float = 180.0) -> dict[str, object]:
    """Runs ``grpc_js_client.js`` against the gRPC ``target`` (host:port); its JSON report."""
    env = {**os.environ, "NODE_PATH": str(install_dir() / "node_modules")}
    done = subprocess.run(
        ["node", str(CLIENT), target, str(PROTO_DIR)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"grpc_js_client.js exited {done.returncode}:\n{done.stderr}")
    report: dict[str, object] = json.loads(done.stdout)
    return report
