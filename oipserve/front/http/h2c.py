"""HTTP/2 with prior knowledge (h2c, RFC 9113 3.3) on the HTTP port: telling it apart.

A connection whose first bytes are the client preface ``PRI * HTTP/2.0...`` is handed
over, with the bytes read so far, to an ``H2Handover`` (the front's gRPC listener adopts
it: issue #39, REST and gRPC on one port; without gRPC, ``refuse_h2c`` closes it). Only a
connection's first read is looked at (``PrefaceSniffer``); the preface is never a valid
HTTP/1.1 request, so nothing served before is taken for one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from oipserve.front.grpc.h2.frames import PREFACE

__all__ = ["H2_PREFACE", "H2Handover", "PrefaceSniffer", "refuse_h2c"]

log = logging.getLogger("oipserve.http")

#: The first bytes of an HTTP/2 connection with prior knowledge (RFC 9113, 3.4): the
#: HTTP/2 package's own constant.
H2_PREFACE = PREFACE
#: Takes over a connection that opened with ``H2_PREFACE``: its transport (the protocol
#: is switched there), the bytes read so far (the preface first), and the loop time the
#: connection was made (its preface's time counts from then).
H2Handover = Callable[[asyncio.Transport, bytes, float], None]


def refuse_h2c(transport: asyncio.Transport, data: bytes, since: float) -> None:
    """HTTP/2 on a port that serves no gRPC (``--allow-grpc false``): closed at once.

    NOTE: nothing written first, as for a gRPC connection past the cap
    (``front.grpc.listener._Refused``): a gRPC client fails the call UNAVAILABLE at once,
    where a SETTINGS and GOAWAY would have it retry until its deadline.
    """
    log.debug("an HTTP/2 (h2c) connection refused: gRPC is not served (--allow-grpc false)")
    transport.close()


class PrefaceSniffer:
    """A connection's first bytes, until they show whether it speaks HTTP/2 or HTTP/1.1."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        #: The bytes of a preface begun, held until the rest of it comes.
        self.held = b""

    def feed(self, data: bytes) -> tuple[bool | None, bytes]:
        """``(True, the bytes so far)`` once they open with the whole preface; ``(False,
        the bytes so far)`` once they cannot; ``(None, b"")`` while a preface has begun
        (they are held)."""
        seen = self.held + data if self.held else data
        size = len(H2_PREFACE)
        if not H2_PREFACE.startswith(seen[:size]):
            self.held = b""
            return False, seen
        if len(seen) < size:
            self.held = seen
            return None, b""
        self.held = b""
        return True, seen
