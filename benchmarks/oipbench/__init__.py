"""Side-by-side benchmark harness for oipserve and its OIP peers (see benchmarks/README.md)."""

from __future__ import annotations

from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent
VENVS_DIR = BENCH_DIR / ".venvs"
WORK_DIR = BENCH_DIR / ".work"
RESULTS_DIR = BENCH_DIR / "results"
PEERS_DIR = BENCH_DIR / "peers"
LUA_SCRIPT = BENCH_DIR / "lua" / "oip.lua"
