"""Charts for a results file (runs in the tools venv, where matplotlib lives).

    python charts.py SUMMARY.json THROUGHPUT.png LATENCY.png

SUMMARY.json is written by run.py: {"servers": [...], "scenarios": [...], "cells": [...]}.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "oipserve": "#d62728",
    "triton": "#1f77b4",
    "mlserver": "#2ca02c",
    "mlserver-pw2": "#98df8a",
    "kserve": "#9467bd",
    "kserve-w2": "#c5b0d5",
    "floor": "#7f7f7f",
}
LATENCY_PANELS = ["tiny-json-c1", "tiny-json-c16", "tiny-grpc-c16", "mib-binary-c4"]


def _ok(value: float | None) -> bool:
    return value is not None and not math.isnan(value) and value > 0


def throughput(summary: dict, out: Path) -> None:
    """Grouped bars: req/s (median of rounds) per scenario and server, log scale."""
    servers = summary["servers"]
    scenarios = [
        s
        for s in summary["scenarios"]
        if any(c["scenario"] == s["key"] and _ok(c["rps"]) for c in summary["cells"])
    ]
    cells = {(c["server"], c["scenario"]): c for c in summary["cells"]}
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(scenarios)), 4.8))
    width = 0.8 / max(len(servers), 1)
    for i, srv in enumerate(servers):
        xs, ys, lo, hi = [], [], [], []
        for j, scen in enumerate(scenarios):
            cell = cells.get((srv["key"], scen["key"]))
            if cell and _ok(cell["rps"]):
                xs.append(j + (i - (len(servers) - 1) / 2) * width)
                ys.append(cell["rps"])
                lo.append(cell["rps"] - cell["rps_min"])
                hi.append(cell["rps_max"] - cell["rps"])
        if xs:
            ax.bar(
                xs,
                ys,
                width,
                label=srv["label"],
                color=COLORS.get(srv["key"]),
                yerr=[lo, hi],
                capsize=2,
                error_kw={"elinewidth": 0.8},
            )
    ax.set_yscale("log")
    ax.set_ylabel("requests/s (median of rounds; bars: min-max)")
    ax.set_xticks(range(len(scenarios)))
    ax.set_xticklabels([s["key"] for s in scenarios], rotation=30, ha="right", fontsize=8)
    ax.set_title(f"Throughput by server and scenario — {summary['title']}", fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=min(len(servers), 6))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def latency(summary: dict, out: Path) -> None:
    """Latency percentile curves (median of rounds) for the headline scenarios."""
    panels = [
        k
        for k in LATENCY_PANELS
        if any(c["scenario"] == k and c["percentiles_ms"] for c in summary["cells"])
    ]
    if not panels:
        panels = ["tiny-json-c1"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    labels = {s["key"]: s["label"] for s in summary["servers"]}
    for ax, key in zip(axes[0], panels, strict=False):
        for cell in summary["cells"]:
            if cell["scenario"] != key or not cell["percentiles_ms"]:
                continue
            pts = [(p, v) for p, v in cell["percentiles_ms"] if _ok(v)]
            if not pts:
                continue
            ax.plot(
                [p for p, _ in pts],
                [v for _, v in pts],
                marker=".",
                label=labels.get(cell["server"], cell["server"]),
                color=COLORS.get(cell["server"]),
            )
        ax.set_yscale("log")
        ax.set_xlabel("percentile")
        ax.set_ylabel("latency, ms")
        ax.set_title(key, fontsize=10)
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Latency distribution — {summary['title']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    summary = json.loads(Path(sys.argv[1]).read_text())
    throughput(summary, Path(sys.argv[2]))
    latency(summary, Path(sys.argv[3]))


if __name__ == "__main__":
    main()
