"""Lint is part of the test command, so CI (.ci/run) fails on it: ruff check and format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=" ".join)
def test_ruff(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
