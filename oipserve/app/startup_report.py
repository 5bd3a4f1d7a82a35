"""What the server says about itself once started: the ready line and the ready file.

``ready http://HOST:PORT (N models, devices: ...) grpc=HOST:PORT metrics=HOST:PORT`` is
logged only when ``/v2/health/ready`` would answer 200. Otherwise each model loaded at start
that is not ready gets a line with its reason, then ``not ready: ... serving http://...``
gives the ports. These lines go through the logger ``oipserve.status``, which logs INFO and
above whatever ``--log-level`` says, so a port picked by ``--http-port 0`` can always be
found. ``--ready-file PATH`` receives the same facts as JSON (written to a temporary file,
then renamed) and is removed at shutdown.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import oipserve
from oipserve.models.registry import ModelRegistry
from oipserve.wire.shm import process_alive

__all__ = [
    "StartupReport",
    "not_ready_models",
    "remove_ready_file",
    "remove_stale_ready_file",
    "status_log",
]

#: The start-up summary's logger: never silenced by --log-level.
status_log = logging.getLogger("oipserve.status")
status_log.setLevel(logging.INFO)


def not_ready_models(registry: ModelRegistry) -> dict[str, str]:
    """Model loaded at start (and not unloaded since) -> why it is not ready."""
    found: dict[str, str] = {}
    for name in sorted(registry.required):
        reason = registry.failed.get(name)
        versions = registry.models.get(name)
        if reason is None and not versions:
            reason = "not loaded"
        elif reason is None and versions is not None:
            reasons = [
                f"version {v.version}: {v.reason or v.state}"
                for v in versions.values()
                if not v.ready
            ]
            reason = "; ".join(reasons) if reasons else None
        if reason is not None:
            found[name] = reason
    return found


@dataclass
class StartupReport:
    """The addresses the server listens on, and what it says once they serve."""

    host: str
    #: None with --allow-http false (the line says ``http=off``), likewise gRPC.
    http_port: int | None
    grpc_port: int | None
    metrics_port: int | None
    models: int
    devices: list[str]
    not_ready: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return not self.not_ready

    def _addresses(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        http = "http=off" if self.http_port is None else f"http://{shown}:{self.http_port}"
        text = f"{http} ({self.models} models, devices: {', '.join(self.devices)})"
        if self.grpc_port is not None:
            text += f" grpc={shown}:{self.grpc_port}"
        if self.metrics_port is not None:
            text += f" metrics={shown}:{self.metrics_port}"
        return text

    def log(self) -> None:
        # The request path's modules: compiled, or Python (slower) and why (oipserve/__init__).
        how = oipserve.compiled
        (status_log.info if how.startswith("compiled") else status_log.warning)(
            "request path %s", how
        )
        if self.ready:
            status_log.info("ready %s", self._addresses())
            return
        for name, reason in self.not_ready.items():
            status_log.warning("model '%s' is not ready: %s", name, reason)
        status_log.warning(
            "not ready: %d of %d models loaded at start are not ready (/v2/health/ready "
            "answers 503); serving %s",
            len(self.not_ready),
            self.models,
            self._addresses(),
        )

    def as_json(self) -> dict[str, object]:
        return {
            "pid": os.getpid(),
            "version": oipserve.__version__,
            "request_path": oipserve.compiled,
            "ready": self.ready,
            "host": self.host,
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "metrics_port": self.metrics_port,
            "not_ready": self.not_ready,
        }

    def write(self, path: str) -> None:
        """Write the JSON to ``path`` atomically: a reader sees all of it or nothing.
        OSError (EBUSY) when the file names another server that still runs: its file is
        left alone (a second server given the same path overwrote it, then removed it at
        its stop; found by fuzzing)."""
        owner = _another_servers(path)
        if owner is not None:
            raise OSError(errno.EBUSY, f"it names another server that still runs (pid {owner})")
        target = Path(path)
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(self.as_json(), out)
                out.write("\n")
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def ready_file_owner(path: str) -> int | None:
    """The pid a ready file names; None when there is none, or no readable file."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(path, encoding="utf-8") as handle:
            pid = json.load(handle).get("pid")
        if isinstance(pid, int) and pid > 0:
            return pid
    return None


def remove_ready_file(path: str | None) -> None:
    """Remove this server's ready file at shutdown; only a regular file that names this
    process (settings refuse other paths; one that became something else since, or that
    another server wrote, is left alone)."""
    if path is not None and os.path.isfile(path) and ready_file_owner(path) == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(path)


def remove_stale_ready_file(path: str | None) -> None:
    """At start: a ready file left by a server that is gone (killed, or whose start
    failed) said ready, with its ports, while this one loaded and refused connections,
    and after a failed start for good (found by fuzzing). It is removed unless the pid it
    names still runs (another server writing the same path: its file is left alone)."""
    if path is None or not os.path.isfile(path) or _another_servers(path) is not None:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)


def _another_servers(path: str) -> int | None:
    """The pid of the other server that still runs whose ready file ``path`` is, if any."""
    owner = ready_file_owner(path)
    if owner is not None and owner != os.getpid() and process_alive(owner):
        return owner
    return None
