"""The worker's side of the heartbeat, and the rule that a worker never outlives its front.

The worker's main thread runs one request at a time and may be busy for long
(a big model); the heartbeat must not depend on it. This thread answers on a socket of
its own as long as the process runs and the interpreter can schedule it: ONNX Runtime
and OpenCV release the GIL while they compute, Python code gives it up every few
milliseconds. A stopped (SIGSTOP), deadlocked or wedged process stops answering, and
the front replaces it (``oipserve.pool.worker_pool``).

No orphan: a worker is of use to nobody once the front that started it is gone, whatever
its main thread is doing (an inference, a session being built with the GIL held, a
spin). Two ways end it:

- the kernel: ``die_with_front`` asks Linux for SIGKILL when the front dies
  (``PR_SET_PDEATHSIG``), which nothing in this process can delay; the output segments it
  leaves are swept by the next server start (``oipserve.wire.shm.sweep_stale``);
- the heartbeat socket: when the front closes it (it died, or gave this worker up), this
  thread sends the process SIGTERM (the main loop drains what it has and frees its shared
  memory) and, should the main thread not get there within ``ORPHAN_GRACE`` seconds,
  ends the process itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time

__all__ = ["ORPHAN_GRACE", "die_with_front", "start_heartbeat"]

#: Seconds a worker whose front closed its heartbeat socket has to drain and exit.
ORPHAN_GRACE = 5.0
#: Exit status of a worker that ended itself because its front was gone.
EXIT_ORPHANED = 3
#: ``prctl`` option: the signal the process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def die_with_front(front_pid: int) -> None:
    """SIGKILL this process when the front ``front_pid`` (its parent) dies.

    Called first thing in the worker. The front may have died already, before the kernel
    was asked: then this process has another parent, the front is gone, and it exits now.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            # NOTE: never seen; the heartbeat socket still ends an orphan.
            print(f"worker: prctl failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
    # NOTE: imported here, once the death signal is set: the wire contract brings asyncio
    #   (tens of milliseconds) that must not come before it.
    from oipserve.wire.shm import process_alive

    if os.getppid() != front_pid and not process_alive(front_pid):
        os._exit(EXIT_ORPHANED)


def _echo(sock: socket.socket) -> None:
    with sock:
        while True:
            try:
                data = sock.recv(64)
                if not data:
                    break  # the front is gone, or gave this worker up
                sock.sendall(data)
            except OSError:
                break
    _front_gone()


def _front_gone() -> None:
    """Nobody is left to answer: drain and exit as after SIGTERM, or exit all the same."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE)
    os._exit(EXIT_ORPHANED)


def start_heartbeat(sock: socket.socket) -> threading.Thread:
    """Answer the front's heartbeats from a daemon thread (it ends with the process)."""
    sock.setblocking(True)
    thread = threading.Thread(target=_echo, args=(sock,), name="heartbeat", daemon=True)
    thread.start()
    return thread
