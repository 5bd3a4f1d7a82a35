"""The type checker is part of the test command, so CI (.ci/run) fails on a type error.

mypy runs with pyproject.toml's ``[tool.mypy]``: every module of oipserve/, workers/ and
hardware/ checked, ``wire/`` and the HTTP/2 package (``front/grpc/h2``) strict. A
``# type: ignore`` is only for a library whose types are wrong, with its error code and
why (``warn_unused_ignores`` reports one that is no longer needed).

A cold run takes ~6 s on 2 cores (mypy 2.4); its cache (.mypy_cache/, ignored by git)
makes the next one take about one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Only stops a run that hangs.
TIMEOUT = 300


def test_mypy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
