"""The worker's side of the heartbeat: a thread that echoes every byte the front sends.

The worker's main thread runs one request at a time and may be busy for long
(a big model); the heartbeat must not depend on it. This thread answers on a socket of
its own as long as the process runs and the interpreter can schedule it: ONNX Runtime
and OpenCV release the GIL while they compute, Python code gives it up every few
milliseconds. A stopped (SIGSTOP), deadlocked or wedged process stops answering, and
the front replaces it (``oipserve.pool``).
"""

from __future__ import annotations

import socket
import threading

__all__ = ["start_heartbeat"]


def _echo(sock: socket.socket) -> None:
    with sock:
        while True:
            try:
                data = sock.recv(64)
                if not data:
                    return  # the front is gone
                sock.sendall(data)
            except OSError:
                return


def start_heartbeat(sock: socket.socket) -> threading.Thread:
    """Answer the front's heartbeats from a daemon thread (it ends with the process)."""
    sock.setblocking(True)
    thread = threading.Thread(target=_echo, args=(sock,), name="heartbeat", daemon=True)
    thread.start()
    return thread
