"""The front's listening sockets: the HTTP port, and the private Unix sockets of one server.

``tcp_listener`` binds the HTTP port (with ``SO_REUSEPORT`` when several HTTP fronts share
it). ``unix_listener`` binds an abstract Unix socket (the name starts with a NUL byte):
nothing to remove from the file system, gone with the last process holding it. The
server's private channels use one each: the socket where other fronts connect to a
worker (bound here, handed to the worker), and the primary's sockets for what the other
fronts forward to it (HTTP, gRPC).
"""

from __future__ import annotations

import socket

__all__ = ["tcp_listener", "unix_listener"]


def tcp_listener(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A socket bound to ``host:port`` (``SO_REUSEPORT``: shared with the other HTTP fronts,
    the kernel spreads new connections across them). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def unix_listener(address: str, backlog: int) -> socket.socket:
    """A Unix socket listening on ``address`` (abstract: ``"\\0name"``). Raises OSError.

    Not inherited by children, unless one is handed it (``pass_fds``)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock
