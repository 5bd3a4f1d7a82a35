"""Starting a worker process: ``python -m workers`` with one end of a socket pair.

A fresh interpreter runs the worker program; nothing of the front is imported
there (multiprocessing's spawn would import the front's ``__main__`` module in
every worker, and with it everything the front imports). A pidfd is the
process's sentinel: it becomes readable when the process exits, so the event
loop notices a death at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


class WorkerProcess:
    """A running worker program: its sentinel, liveness, kill and reaping."""

    def __init__(
        self, sock: socket.socket, heartbeat: socket.socket, segment_prefix: str, log_level: str
    ) -> None:
        fd = sock.fileno()
        beat_fd = heartbeat.fileno()
        self._popen = subprocess.Popen(
            [
                sys.executable,
                # NOTE: -P and the front's own sys.path: the worker imports the same
                #   ``workers`` and ``oipserve.wire`` the front did, never a ``workers``
                #   folder that happens to lie in the current directory.
                "-P",
                "-m",
                "workers",
                "--socket-fd",
                str(fd),
                "--heartbeat-fd",
                str(beat_fd),
                "--segment-prefix",
                segment_prefix,
                "--log-level",
                log_level,
            ],
            pass_fds=(fd, beat_fd),
            env={**os.environ, "PYTHONPATH": os.pathsep.join(_import_path())},
            # NOTE: its own process group: Ctrl-C in a terminal, or a supervisor that
            #   signals the front's group, reaches only the front, which drains first
            #   and then stops the workers.
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


def _import_path() -> list[str]:
    """The front's sys.path with relative entries made absolute (as multiprocessing does)."""
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
