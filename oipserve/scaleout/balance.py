"""Even connections across the HTTP fronts of ``--http-workers N``, at connection time.

Why: every front binds the HTTP port with ``SO_REUSEPORT`` and the kernel hashes each new
connection (its addresses and ports) to one front's accept queue. Clients keep few,
long-lived connections, so the split is often uneven: 16 connections over two fronts
split 7/9, 6/10 or worse, and 4 (the harness's matmul rows at c=4) split 3/1 or 4/0 in
5 of 8 cases, one front then doing all the work while the other's core idles. That cost
throughput at c=4 and the p99 at c=16 (issue #40).

How: a table in shared memory (``LoadTable``: a memfd the primary creates and hands to
every front it starts, so nothing is ever left in ``/dev/shm``) holds one row per front,
written by that front only: whether it takes connections (its pid, 0: no), its open HTTP
connections, and how many connections it sent to and adopted from each other front.
When a front's protocol gets a new connection (``connection_made``, before a byte is
read) and the front holds more than the least-loaded front that takes connections, it
hands the socket to that front (``Balancer.place``): SCM_RIGHTS in one datagram to the
target's abstract Unix socket, then its own copy is closed without a shutdown, so the
client sees nothing and the bytes it already sent stay in the kernel's buffer for the
new owner, which adopts the socket with the same protocol (``loop.connect_accepted_socket``)
and counts it. A front's load is its open connections plus those sent to it and not yet
adopted, so a burst of connections arriving at one front is split evenly, not all sent
to the same stale minimum.

Robustness: a connection is handed off at most once (an adopted one is never placed
again) and counted once (by its final owner); a handoff that fails (the target gone:
its socket name is gone with it; its queue full) keeps the connection where it is; a
front that drains or dies is no target (it clears its row when it drains, the primary
when it exits: ``LoadTable.leave``); a datagram is only taken from a process of the
same user (``SO_PASSCRED``), and only a TCP socket on the HTTP port is adopted. Nothing
runs per request. With one front there is no table and none of this runs.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import mmap
import os
import socket
import struct
from collections.abc import Callable
from typing import Any, cast

from oipserve.front.http.protocol import CorkedHttpToolsProtocol
from oipserve.front.http.server import UvicornServer

__all__ = ["Balancer", "LoadTable", "balance_address", "install"]

log = logging.getLogger("oipserve.balance")

#: A row's fields before its per-front counters: the pid taking connections (0: none),
#: its open HTTP connections.
_STATE, _OPEN = 0, 1
_INT64 = 8
#: The TCP families a handed-off socket may be (the primary's HTTP server also serves a
#: private Unix socket: those connections are neither counted nor moved).
_TCP = (socket.AF_INET, socket.AF_INET6)
#: Datagrams read per wake-up of the receiving socket at most (the rest on the next).
_BATCH = 64
_CREDS = struct.calcsize("3i")
_ANCILLARY = socket.CMSG_SPACE(struct.calcsize("i")) + socket.CMSG_SPACE(_CREDS)


class LoadTable:
    """One row of int64 per front in a shared memfd: ``[pid, open, sent[N], adopted[N]]``.

    Each front writes its own row only (the primary also clears the row of a front that
    exited), so no update needs an atomic read-modify-write across processes.
    """

    def __init__(self, fd: int, fronts: int) -> None:
        self.fd = fd
        self.fronts = fronts
        self._width = 2 + 2 * fronts
        self._map = mmap.mmap(fd, self._width * fronts * _INT64)
        self._cells = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, fronts: int) -> LoadTable:
        """A new table, every row empty (nothing in ``/dev/shm``: gone with its last fd)."""
        fd = os.memfd_create("oipserve-balance")  # NOTE: close-on-exec: given by pass_fds
        os.ftruncate(fd, (2 + 2 * fronts) * fronts * _INT64)
        return cls(fd, fronts)

    def _at(self, front: int, field: int) -> int:
        return front * self._width + field

    def join(self, front: int) -> None:
        """``front`` takes connections from now on (its first or a replacement process):
        what was sent to a predecessor and never adopted is not counted against it."""
        for other in range(self.fronts):
            sent = self._cells[self._at(other, 2 + front)]
            self._cells[self._at(front, 2 + self.fronts + other)] = sent
        self._cells[self._at(front, _OPEN)] = 0
        self._cells[self._at(front, _STATE)] = os.getpid()

    def leave(self, front: int) -> None:
        """``front`` takes no more connections (it drains, or it exited)."""
        self._cells[self._at(front, _STATE)] = 0

    def taking(self, front: int) -> bool:
        return self._cells[self._at(front, _STATE)] != 0

    def opened(self, front: int, count: int = 1) -> None:
        self._cells[self._at(front, _OPEN)] += count

    def sent(self, front: int, to: int, count: int = 1) -> None:
        self._cells[self._at(front, 2 + to)] += count

    def adopted(self, front: int, source: int) -> None:
        """``front`` took a connection ``source`` sent: open first, so that a reader
        meanwhile counts it twice (and keeps a connection) rather than not at all."""
        self.opened(front)
        self._cells[self._at(front, 2 + self.fronts + source)] += 1

    def load(self, front: int) -> int:
        """``front``'s open connections and those sent to it, not yet adopted."""
        cells, width, fronts = self._cells, self._width, self.fronts
        total = cells[front * width + _OPEN]
        adopted = front * width + 2 + fronts
        for source in range(fronts):
            total += max(0, cells[source * width + 2 + front] - cells[adopted + source])
        return total

    def target(self, front: int) -> int | None:
        """Where ``front`` sends a new connection: the least-loaded front that takes
        connections, if ``front`` holds more than it (keeping the connection would put
        the two more than one apart); None: keep it."""
        best, least = None, self.load(front)
        for other in range(self.fronts):
            if other != front and self.taking(other):
                load = self.load(other)
                if load < least:
                    best, least = other, load
        return best

    def close(self) -> None:
        self._cells.release()
        self._map.close()
        os.close(self.fd)


def balance_address(prefix: str, front: int) -> str:
    """Front ``front``'s socket for connections handed to it (abstract: nothing to
    remove, gone with the process, so a send to a dead front fails at once)."""
    return f"\0{prefix}balance{front}"


class Balancer:
    """One front's side: places its new connections, adopts those handed to it."""

    def __init__(self, table: LoadTable, front: int, prefix: str, port: int) -> None:
        self.table = table
        self.front = front
        self._prefix = prefix
        self._port = port
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        self._in: socket.socket | None = None
        self._adopt: Callable[[], asyncio.Protocol] | None = None
        self._adopting: set[asyncio.Task[None]] = set()

    # ---- this front's own connections ----------------------------------------------

    def place(self, transport: asyncio.Transport) -> bool:
        """A new connection: True when it was handed to another front (its transport
        here is then closed, nothing sent); False: kept here, and counted."""
        sock = transport.get_extra_info("socket")
        if sock is None or sock.family not in _TCP:
            return False
        target = self.table.target(self.front)
        if target is not None and self._send(sock.fileno(), target):
            transport.abort()  # NOTE: a close without shutdown: the target holds it too
            return True
        self.table.opened(self.front)
        return False

    def _send(self, fd: int, target: int) -> bool:
        self.table.sent(self.front, target)  # NOTE: before: in flight is never undercounted
        try:
            # NOTE: sendmsg, not socket.send_fds, which drops its address argument.
            self._out.sendmsg(
                [bytes([self.front])],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))],
                0,
                balance_address(self._prefix, target),
            )
        except OSError as exc:  # gone (ECONNREFUSED), its queue full (EAGAIN)
            self.table.sent(self.front, target, -1)
            log.debug("cannot hand a connection to front %d: %s", target, exc)
            return False
        return True

    def closed(self) -> None:
        """A connection counted here is gone."""
        self.table.opened(self.front, -1)

    # ---- connections handed to this front ------------------------------------------

    def start(self, adopt: Callable[[], asyncio.Protocol]) -> None:
        """Take connections from now on; ``adopt`` makes the protocol of one handed here."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(balance_address(self._prefix, self.front))
        except OSError as exc:
            sock.close()
            log.warning("front %d cannot take connections from the others: %s", self.front, exc)
            return
        sock.setblocking(False)
        self._in, self._adopt = sock, adopt
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)
        self.table.join(self.front)

    def stop_taking(self) -> None:
        """Draining: no more connections from the others; those already sent are adopted
        now (before the HTTP server's shutdown looks at its connections)."""
        self.table.leave(self.front)
        if self._in is not None:
            asyncio.get_running_loop().remove_reader(self._in.fileno())
            self._readable()

    def _readable(self) -> None:
        sock = self._in
        if sock is None:
            return
        for _ in range(_BATCH):
            try:
                data, ancillary, _flags, _ = sock.recvmsg(1, _ANCILLARY)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("front %d: receiving a connection failed: %s", self.front, exc)
                return
            fds, uid = _unpack(ancillary)
            source = data[0] if len(data) == 1 else -1
            if uid != os.getuid() or len(fds) != 1 or not 0 <= source < self.table.fronts:
                for fd in fds:
                    os.close(fd)
                continue
            self._take(fds[0], source)

    def _take(self, fd: int, source: int) -> None:
        try:
            conn = socket.socket(fileno=fd)
        except OSError:  # not a socket
            os.close(fd)
            return
        try:
            ours = conn.family in _TCP and conn.type == socket.SOCK_STREAM
            ours = ours and conn.getsockname()[1] == self._port
        except OSError:
            ours = False
        if not ours or self._adopt is None:
            conn.close()
            return
        self.table.adopted(self.front, source)
        conn.setblocking(False)
        task = asyncio.get_running_loop().create_task(self._connect(conn, self._adopt))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def _connect(self, conn: socket.socket, adopt: Callable[[], asyncio.Protocol]) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(adopt, conn)
        except OSError as exc:  # NOTE: the client left meanwhile
            log.debug("front %d: a handed connection is gone: %s", self.front, exc)
            conn.close()
            self.closed()

    def close(self) -> None:
        """After serving: the sockets (a connection still queued here is closed)."""
        self.table.leave(self.front)
        self._out.close()
        if self._in is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self._in.fileno())
            self._in.close()
            self._in = None


def _unpack(ancillary: list[tuple[int, int, bytes]]) -> tuple[list[int], int]:
    """The fds and the sender's uid (-1: none) of a datagram's ancillary data."""
    fds: list[int] = []
    uid = -1
    for level, kind, data in ancillary:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_RIGHTS:
            numbers = array.array("i")
            numbers.frombytes(data[: len(data) - len(data) % numbers.itemsize])
            fds.extend(numbers)
        elif kind == socket.SCM_CREDENTIALS and len(data) >= _CREDS:
            uid = struct.unpack("3i", data[:_CREDS])[1]
    return fds, uid


def _balanced(base: type[CorkedHttpToolsProtocol], balancer: Balancer) -> type:
    """``base`` with its connections placed by ``balancer`` and counted."""

    class Balanced(base):  # type: ignore[valid-type,misc]
        #: Counted in the table (an adopted connection is counted when it arrives).
        _counted = False
        #: Handed here by another front: never placed again.
        _adopted = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if self._adopted:
                self._counted = True
            elif balancer.place(cast(asyncio.Transport, transport)):
                return
            else:
                self._counted = transport.get_extra_info("socket").family in _TCP
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._counted:
                self._counted = False
                balancer.closed()
            if hasattr(self, "_corked"):  # NOTE: not when handed off from connection_made
                super().connection_lost(exc)

        def _sniff(self, data: bytes) -> bytes:
            rest = super()._sniff(data)
            if self._counted and self not in self.connections:
                self._counted = False  # NOTE: handed to HTTP/2 (h2c): not an HTTP/1 load
                balancer.closed()
            return rest

    Balanced.__name__ = base.__name__
    return Balanced


def install(server: UvicornServer, balancer: Balancer) -> None:
    """Balance ``server``'s connections (call before it serves): its protocol places and
    counts them, and once it serves (before its front says so: the ready line, a replica's
    ``Listening``) connections handed to this front are adopted."""
    config = server.config
    protocol = config.http
    if not isinstance(protocol, type) or not issubclass(protocol, CorkedHttpToolsProtocol):
        raise TypeError("only oipserve's HTTP protocol can be balanced")
    config.http = _balanced(protocol, balancer)

    def adopted() -> asyncio.Protocol:
        made: Any = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=server.server_state, app_state=server.lifespan.state
        )
        made._adopted = True
        return made

    server.on_started = lambda: balancer.start(adopted)
