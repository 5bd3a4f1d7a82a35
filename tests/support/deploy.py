"""What a deployment hands the server: KServe's tritonserver command line, and a way to see
that a mounted (read-only) model repository was not written to."""

from __future__ import annotations

import hashlib
from pathlib import Path

# kserve/kserve config/runtimes/kserve-tritonserver.yaml, `args` of kserve-container.
KSERVE_TRITONSERVER_ARGS = [
    "tritonserver",
    "--model-store=/mnt/models",
    "--grpc-port=9000",
    "--http-port=8080",
    "--allow-grpc=true",
    "--allow-http=true",
]


def fingerprint(root: Path) -> list[tuple[str, int, int, int, str]]:
    """Every entry under ``root``: path, size, mode, mtime (ns) and the content's sha256."""
    entries = []
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        name = str(path.relative_to(root))
        entries.append((name, stat.st_size, stat.st_mode, stat.st_mtime_ns, digest))
    stat = root.lstat()
    entries.append((".", stat.st_size, stat.st_mode, stat.st_mtime_ns, ""))
    return entries
