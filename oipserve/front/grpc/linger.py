"""A connection error's lingering close: its GOAWAY reaches the peer, briefly and boundedly.

A socket closed while the peer's bytes are still unread in the kernel is reset (TCP RST),
and the reset throws away what the kernel had not sent yet. A flooding peer always has
frames unread, and one that reads slowly (or only once its sends stall) has a full window:
the GOAWAY that says why it was cut (RFC 9113, 5.4.1) died in our send queue, and the peer
saw only a reset (test_grpc_abuse's continuation-flood case, now and then; a client that
reads only once its sends stall got no GOAWAY in 30 tries of 30, and every one with this).

So ``Lingering.take`` ends our side (``write_eof``: the GOAWAY, then a FIN, leave as the
peer reads), stops reading (nothing more of the peer's is parsed or buffered here), and
aborts the socket once the peer has closed too, or ``LINGER_SECONDS`` later at most; the
connection meanwhile releases everything it held at once, its ``--grpc-max-connections``
slot included (``h2.connection``'s ``_abort``). At most ``MAX_LINGERING`` sockets of a
front linger at once; past that, and for a transport that cannot end one side, a
connection error closes at once, as before: lingering is never a resource a hostile peer
can grow. ``close`` (the listener's stop) aborts those left, so a shutdown waits on none.

NOTE: with reading stopped, the peer's FIN waits behind its unread frames: its close is
seen in the socket's TCP state instead (``TCP_INFO``, one look at every lingering socket
each ``_LOOK`` seconds, by one timer while any lingers). Once the peer has closed and
taken all we sent, a reset loses nothing (a kernel keeps what it received). A socket
without that state (a Unix one) lingers the whole time.

A connection that ends well (a shutdown's, or an idle one's, second GOAWAY once its last
call is answered: ``Lingering.take_gracefully``) lingers too, and for the same reason: a
socket closed with the peer's bytes unread is reset, and the reset drops the answers the
peer had not taken yet. Its peer is no flooder: its last frames (WINDOW_UPDATEs for our
DATA, the PING's answer, calls sent before it heard the GOAWAY) came a moment after our
close. Such a socket keeps reading (what comes is dropped), so the peer's FIN ends it
as a close (nothing unread), or ``GRACEFUL_SECONDS`` later, more while the peer still
takes what is left at ``GRACEFUL_MIN_RATE``. At most ``MAX_GRACEFUL`` linger so (and a
quarter of the connection cap), past that a graceful end closes at once, as before. (Found
by fuzzing: REST over h2c at SIGTERM, 4 of 6 clients saw the tail of an answer and the
last GOAWAY reset away.) A shutdown waits for them within its grace: a client that
reads closes at our FIN; one that does not read holds the stop 10 s at most.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios

#: Seconds at most a socket lingers after a connection error's GOAWAY and FIN, the peer
#: not having closed: time for a peer that reads at all to read the GOAWAY, on a loaded
#: box too (a test client reading only once its sends stalled missed a 250 ms linger
#: under a load of 10 on 2 cores); a peer that closes ends it sooner. Short enough that
#: the ``MAX_LINGERING`` sockets of a front hold descriptors and kernel buffers briefly.
#: (bcf517e lingered 1 s too, but kept reading and kept its cap slot: reconnecting
#: flooders starved other clients.)
LINGER_SECONDS = 1.0
#: Sockets one front lets linger at once; past it a connection error closes at once.
MAX_LINGERING = 64
#: Seconds a socket ending well lingers after its last GOAWAY and FIN, and again while
#: its peer takes what is left at ``GRACEFUL_MIN_RATE`` or more (a slow reader of a
#: large answer was cut at 10 s, found by fuzzing); a shutdown waits for it no longer than
#: ``--shutdown-timeout`` (``listener.stop``).
GRACEFUL_SECONDS = 10.0
#: Bytes a second a lingering peer takes to keep its socket (``--min-transfer-rate``'s
#: default: a client reading slower is dropped while the server serves too).
GRACEFUL_MIN_RATE = 64 * 1024
#: Sockets ending well that one front lets linger at once, and at most a quarter of its
#: connection cap (``Lingering``'s ``graceful_bound``): they hold descriptors beside the
#: connections the cap counts (a client ending 1,100 connections with a GOAWAY, each
#: then silent, took every descriptor of a front at 1,024; found by fuzzing).
MAX_GRACEFUL = 1024
#: Seconds between two looks at the lingering sockets' TCP state.
_LOOK = 0.05
#: TCP states (``tcp_states.h``) in which the peer has closed and acknowledged all we
#: sent, FIN included (TIME_WAIT, CLOSE: also after a reset). Not FIN_WAIT2 (our FIN
#: acknowledged, the peer still open): what its kernel acknowledged its program may not
#: have read, and a reset then loses it (gRPC's C core drops it: a stream's last status
#: lost at shutdown, 3 runs of 6, found by fuzzing).
_PEER_DONE = frozenset({6, 7})
_TCP_INFO = getattr(socket, "TCP_INFO", None)


def _peer_done(transport: asyncio.Transport) -> bool:
    """Whether the peer closed its side and took all of ours (False where unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None or _TCP_INFO is None:
        return False
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 8)[0] in _PEER_DONE
    except OSError:  # not TCP
        return False


def _untaken(transport: asyncio.Transport) -> int:
    """Bytes written that the peer has not taken yet: in the transport's buffer, and in
    the kernel's send queue (``TIOCOUTQ``: not sent, or not acknowledged)."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            size += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        except OSError:
            pass
    return size


class _Lingering(asyncio.Protocol):
    """A lingering socket's protocol: drops what it reads (after a connection error only
    what was in flight when reading paused), forgets the socket when it goes."""

    def __init__(self, owner: Lingering, transport: asyncio.Transport) -> None:
        self._owner = owner
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        """Dropped."""

    def eof_received(self) -> bool:
        return False  # the peer ended its side: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner.forget(self._transport)


class Lingering:
    """The sockets of one front that linger: after a connection error's GOAWAY, or after
    their connection ended well."""

    def __init__(self, graceful_bound: int = MAX_GRACEFUL) -> None:
        # NOTE: the module's values read here, not as defaults: a test may lower them.
        self._seconds = LINGER_SECONDS
        self._bound = MAX_LINGERING
        self._graceful_seconds = GRACEFUL_SECONDS
        self._graceful_bound = min(MAX_GRACEFUL, graceful_bound)
        #: Lingering transport -> the loop time it is aborted at the latest.
        self._held: dict[asyncio.Transport, float] = {}
        #: Those that ended well -> the bytes their peer had still to take at the last
        #: look that gave them more time.
        self._graceful: dict[asyncio.Transport, int] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._held)

    def take(self, transport: asyncio.Transport) -> bool:
        """Linger ``transport`` after a connection error (what was written to it goes
        first, then a FIN; nothing more is read), its protocol replaced; False, nothing
        done, where it is not lingered (the bound is reached, it is closing, or it cannot
        end one side): the caller closes it."""
        if len(self._held) - len(self._graceful) >= self._bound:
            return False
        if not self._ended(transport):
            return False
        transport.pause_reading()
        self._hold(transport, self._seconds)
        return True

    def take_gracefully(self, transport: asyncio.Transport) -> bool:
        """Linger ``transport`` whose connection ended well: as ``take``, but reading
        on (dropped), ended by the peer's close, or after ``GRACEFUL_SECONDS``."""
        if len(self._graceful) >= self._graceful_bound or not self._ended(transport):
            return False
        self._graceful[transport] = _untaken(transport)
        self._hold(transport, self._graceful_seconds)
        # It may have been held (a connection stops reading while its clients' calls
        # are abandoned): the peer's FIN and last frames are read from here on.
        transport.resume_reading()
        return True

    @staticmethod
    def _ended(transport: asyncio.Transport) -> bool:
        """Our side ended (a FIN after what was written): False where it could not be."""
        if transport.is_closing() or not transport.can_write_eof():
            return False
        try:
            transport.write_eof()
        except (OSError, RuntimeError):
            return False
        return True

    def _hold(self, transport: asyncio.Transport, seconds: float) -> None:
        transport.set_protocol(_Lingering(self, transport))
        loop = asyncio.get_running_loop()
        self._held[transport] = loop.time() + seconds
        if self._timer is None:
            self._timer = loop.call_later(_LOOK, self._look, loop)

    def _look(self, loop: asyncio.AbstractEventLoop) -> None:
        """Abort the sockets whose peer is done or whose time is up: aborted, not closed
        (a close waits, unbounded, for what the peer has not read)."""
        self._timer = None
        now = loop.time()
        for transport, until in list(self._held.items()):
            if now >= until and self._still_taking(transport):
                self._held[transport] = now + self._graceful_seconds
            elif now >= until or _peer_done(transport):
                self.forget(transport)
                transport.abort()
        if self._held:
            self._timer = loop.call_later(_LOOK, self._look, loop)

    def _still_taking(self, transport: asyncio.Transport) -> bool:
        """Whether a socket that ended well had its peer take, since it was last given
        time, what ``GRACEFUL_MIN_RATE`` asks for (then it gets that time again)."""
        before = self._graceful.get(transport)
        if before is None:
            return False
        left = _untaken(transport)
        self._graceful[transport] = left
        return left > 0 and before - left >= GRACEFUL_MIN_RATE * self._graceful_seconds

    def forget(self, transport: asyncio.Transport) -> None:
        """``transport`` went (an error, the peer's close, or the stop): no longer counted."""
        self._held.pop(transport, None)
        self._graceful.pop(transport, None)

    def close(self) -> None:
        """Abort every lingering socket now (a stop waits no longer)."""
        held, self._held = self._held, {}
        self._graceful = {}
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for transport in held:
            transport.abort()
