"""The Prometheus text format (0.0.4), written here so that Triton's names survive.

prometheus_client's ``generate_latest`` renames every counter to ``<name>_total``
(in the ``# TYPE`` line and, for its own counters, in the samples), while
dashboards and autoscalers built for Triton query ``nv_inference_request_success``
exactly. So the per-model and host families are written by ``render`` below;
prometheus_client still provides the process collector (appended as it renders
it) and, in the tests, the parser.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

MetricType = Literal["counter", "gauge", "histogram", "summary"]
Labels = tuple[tuple[str, str], ...]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Family:
    """One metric: its name, type, help text and samples (name suffix, labels, value).

    A counter's or gauge's samples have no suffix; a histogram's are ``_bucket`` (with
    ``le``), ``_sum`` and ``_count``, a summary's none (with ``quantile``), ``_sum`` and
    ``_count``.
    """

    __slots__ = ("name", "type", "help", "samples", "suffixes")

    def __init__(self, name: str, type: MetricType, help: str) -> None:
        self.name = name
        self.type = type
        self.help = help
        self.samples: list[tuple[Labels, int | float]] = []
        #: Each sample's name suffix, in step with ``samples``.
        self.suffixes: list[str] = []

    def add(self, labels: Labels, value: int | float, suffix: str = "") -> None:
        self.samples.append((labels, value))
        self.suffixes.append(suffix)


def escape_label_value(value: str) -> str:
    """Backslash, double quote and newline escaped, as the text format requires."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: int | float) -> str:
    """Integers exactly; floats in Go's spelling of the special values."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def format_bound(bound: float) -> str:
    """A bucket bound or quantile as a label value: ``100`` for 100.0 (as Triton writes
    it), ``0.5``, ``+Inf``."""
    if math.isinf(bound):
        return "+Inf"
    return str(int(bound)) if bound == int(bound) else repr(bound)


def render(families: Iterable[Family]) -> str:
    """Every family as ``# HELP``, ``# TYPE`` and one line per sample, names unchanged."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for suffix, (labels, value) in zip(family.suffixes, family.samples, strict=True):
            if labels:
                text = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
                lines.append(f"{family.name}{suffix}{{{text}}} {format_value(value)}")
            else:
                lines.append(f"{family.name}{suffix} {format_value(value)}")
    lines.append("")
    return "\n".join(lines)
