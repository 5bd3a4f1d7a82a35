"""Starting the front's child programs: workers (``python -m workers``), other HTTP fronts.

A fresh interpreter runs each child program; nothing of the front is imported
there that the program does not import itself (multiprocessing's spawn would
import the front's ``__main__`` module in every child, and with it everything
the front imports). A pidfd is the
process's sentinel: it becomes readable when the process exits, so the event
loop notices a death at once.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import NamedTuple


class ChildProcess:
    """A child program, ``python -P -m <module> <args>``: its sentinel, liveness, kill, reaping."""

    def __init__(self, module: str, args: list[str], pass_fds: tuple[int, ...]) -> None:
        self._popen = subprocess.Popen(
            # NOTE: -P and the front's own sys.path: the child imports the same
            #   ``workers`` and ``oipserve`` the front did, never a folder of that
            #   name that happens to lie in the current directory.
            [sys.executable, "-P", "-m", module, *args],
            pass_fds=pass_fds,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(_import_path())},
            # NOTE: its own process group: Ctrl-C in a terminal, or a supervisor that
            #   signals the front's group, reaches only the front, which drains first
            #   and then stops its children.
            process_group=0,
        )
        self.pid = self._popen.pid
        #: Readable once the process has exited.
        self.sentinel = os.pidfd_open(self.pid)

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    @property
    def returncode(self) -> int | None:
        """Exit status once reaped (``-N``: ended by signal N); None while it runs."""
        return self._popen.returncode

    def join(self, timeout: float) -> None:
        """Reap the process (waiting up to ``timeout`` seconds) and close the sentinel."""
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        if self.sentinel >= 0:  # NOTE: after the event loop stopped watching it
            os.close(self.sentinel)
            self.sentinel = -1


class WorkerOptions(NamedTuple):
    """What every worker of a server is started with, from its settings."""

    log_level: str = "info"
    #: Microseconds a worker polls for its next request after a reply, instead of
    #: sleeping (``--worker-busy-poll-us``; ``workers.busy_poll``). 0 never polls.
    busy_poll_us: int = 0
    #: At low load the worker runs on its front's CPU (``--low-load-colocation``;
    #: ``workers.colocation``).
    colocate: bool = False


class WorkerProcess(ChildProcess):
    """A worker program (``python -m workers``) on its two sockets, and optionally a
    listening socket where other fronts connect.

    It must be started from the thread that runs the event loop and lives as long as the
    front (the main thread): Linux's parent-death signal, which kills a worker whose
    front died, follows the thread that started it.
    """

    def __init__(
        self,
        sock: socket.socket,
        heartbeat: socket.socket,
        segment_prefix: str,
        options: WorkerOptions,
        fronts: socket.socket | None = None,
    ) -> None:
        fd = sock.fileno()
        beat_fd = heartbeat.fileno()
        args = ["--socket-fd", str(fd), "--heartbeat-fd", str(beat_fd)]
        # NOTE: the worker dies with this process (workers.heartbeat.die_with_front).
        args += ["--front-pid", str(os.getpid())]
        args += ["--segment-prefix", segment_prefix, "--log-level", options.log_level]
        args += ["--busy-poll-us", str(options.busy_poll_us)]
        if options.colocate:
            args.append("--colocate")
        fds = [fd, beat_fd]
        if fronts is not None:
            args += ["--fronts-fd", str(fronts.fileno())]
            fds.append(fronts.fileno())
        super().__init__("workers", args, tuple(fds))


def exit_status(code: int | None) -> str:
    """How a child process ended, for the log: `` (killed by SIGKILL)``, `` (exit status 1)``."""
    if code is None:
        return ""
    if code < 0:
        try:
            return f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f" (killed by signal {-code})"
    return f" (exit status {code})"


def _import_path() -> list[str]:
    """The front's sys.path with relative entries made absolute (as multiprocessing does)."""
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
