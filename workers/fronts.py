"""A worker's connections to the fronts of its server: the starter's, and other fronts'.

The front that started a worker talks to it over a socket pair. With ``--http-workers``
the worker also listens, and the server's other fronts connect: each connection gets
its replies on itself, its own output segments (freed when it closes) and its own
mappings of that front's input segments. Only processes of the worker's own user are
taken, and a front that stops reading is dropped after ``FRONT_SEND_TIMEOUT`` rather than
wedge the worker for every other front.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from typing import Final

from oipserve.wire.framing import FrameSplitter
from oipserve.wire.shm import BufferPool, SegmentCache

__all__ = ["FRONT_SEND_TIMEOUT", "FrontConnection", "accept_front"]

log = logging.getLogger("oipserve.worker")

#: Seconds a reply to another front may wait for room in its socket before that front is
#: dropped: a front that stopped reading must not wedge the worker for everyone else.
FRONT_SEND_TIMEOUT: Final = 5.0


class FrontConnection:
    """One front's socket to this worker: its frames, its replies, its output segments."""

    def __init__(self, sock: socket.socket, output_prefix: str, starter: bool) -> None:
        self.sock = sock
        #: The front that started this worker (its end of the socket pair).
        self.starter = starter
        #: The front's pid (for ``workers.colocation``); 0 when not known or not wanted.
        self.pid = 0
        self.splitter = FrameSplitter()
        #: This front's input segments, mapped by name (names are unique to one front; a
        #: front that leaves takes its mappings with it).
        self.inputs = SegmentCache()
        #: The replies' frames queued for the next send (``wire.framing.frame_into``).
        self.replies = bytearray()
        #: Output segments the pool dropped since the last reply (the front forgets them).
        self.dropped: list[str] = []
        self.outputs = BufferPool(output_prefix, on_drop=self.dropped.append)

    def take_dropped(self) -> list[str]:
        """The output segments dropped since the last reply, for the next reply to say."""
        dropped = self.dropped[:]
        self.dropped.clear()  # (the list the pool's on_drop appends to: kept)
        return dropped

    def flush(self) -> bool:
        """Send the queued replies; False when the front cannot take them (gone, stuck)."""
        if not self.replies:
            return True
        try:
            self.sock.sendall(self.replies)  # (blocking: done with them when it returns)
        except OSError:  # reset, broken pipe, or (another front) past FRONT_SEND_TIMEOUT
            return False
        finally:
            self.replies.clear()
        return True

    def close(self) -> None:
        self.outputs.close()
        self.sock.close()


def accept_front(listener: socket.socket) -> tuple[socket.socket, int] | None:
    """The next front that connects, and its pid; None when the accept failed or the peer
    is another user's process (refused, logged)."""
    try:
        sock, _ = listener.accept()
    except OSError:
        return None
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.getuid():
        log.warning("refused a front connection from pid %d (uid %d)", pid, uid)
        sock.close()
        return None
    sock.setblocking(True)
    sock.setsockopt(
        socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(FRONT_SEND_TIMEOUT), 0)
    )
    return sock, pid
