"""``python -m oipserve`` run to its end, for tests of start-up refusals and messages.

A server that should start and serve is a ``ServerProcess`` (tests/support/server.py);
these run a command line that should exit, and hand back what it printed.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.server import ROOT, SAMPLE_REPOSITORY


def run_cli(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m oipserve ARGS`` to its end; ``env`` adds to the environment."""
    # NOTE: the metrics port defaults to 8002; a test must not depend on it being free.
    return subprocess.run(
        [sys.executable, "-m", "oipserve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        # (one HTTP front and one worker a device, as tests/support/server.py)
        env={
            **os.environ,
            "OIPSERVE_METRICS_PORT": "0",
            "OIPSERVE_HTTP_WORKERS": "1",
            "OIPSERVE_INSTANCES_PER_DEVICE": "1",
            **(env or {}),
        },
    )


def run_serve(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``oipserve serve`` on the sample repository, free HTTP and gRPC ports, then ARGS."""
    fixed = ["--model-repository", str(SAMPLE_REPOSITORY), "--http-port", "0", "--grpc-port", "0"]
    return run_cli("serve", *fixed, *args, timeout=timeout, env=env)
