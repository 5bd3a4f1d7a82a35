"""TCP connections as the kernel sees them: what a test can know of the server's reads
without a word from the server.

Loopback connections have both ends on this machine, so ``/proc/net/tcp`` shows the
server's end too: its receive queue is what the server has not read yet. A test that must
not go on before the server has read what it sent (a head before its body, a request
before the next one) waits for that instead of sleeping.
"""

from __future__ import annotations

import socket
from pathlib import Path

#: Both tables: the server may listen on IPv4 or IPv6.
_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")


def _queues() -> dict[tuple[int, int], tuple[int, int]]:
    """(local port, remote port) -> (send queue, receive queue) of every TCP socket here."""
    found = {}
    for table in _TABLES:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            ports = (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16))
            send, _, receive = queues.partition(":")
            found[ports] = (int(send, 16), int(receive, 16))
    return found


def read_by_peer(sock: socket.socket) -> bool:
    """Everything sent on ``sock`` has left it and been read by the process at the other end
    (or that end is closed: nothing of it waits any more). Loopback connections only."""
    try:
        ours, theirs = sock.getsockname()[1], sock.getpeername()[1]
    except OSError:  # reset, or closed by this side: nothing is left to be read
        return True
    queues = _queues()
    unsent = queues.get((ours, theirs), (0, 0))[0]
    unread = queues.get((theirs, ours), (0, 0))[1]
    return unsent == 0 and unread == 0
