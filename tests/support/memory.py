"""A process's memory as the kernel counts it, for tests that bound what a request costs."""

from __future__ import annotations

from pathlib import Path

MiB = 1024 * 1024


def proc_status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory figure (VmRSS, VmHWM, RssAnon), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)
