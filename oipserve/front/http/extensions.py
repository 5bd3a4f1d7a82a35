"""What the HTTP fronts give the REST app beyond ASGI: the contract both sides import.

The HTTP/1.1 protocol (``protocol``) and the REST app on HTTP/2 streams (``h2_asgi``) put
these in a request's scope; the REST app (``oipserve.front.rest``) reads them. Neither
side imports the other for them.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

__all__ = [
    "BODY_REFUSED",
    "NO_EXTENSIONS",
    "ON_DISCONNECT",
    "RECEIVE_INTO",
    "TOO_LARGE",
    "ClientDisconnected",
]

#: ASGI extension: ``scope["extensions"][RECEIVE_INTO](target)`` receives the rest of the
#: request's body into the writable memoryview ``target`` (sized from Content-Length: a
#: shared-memory segment) and returns the byte count; the body skips the server's buffers.
RECEIVE_INTO: Final = "oipserve.receive_into"
#: ASGI extension: ``scope["extensions"][ON_DISCONNECT](callback)`` calls ``callback``
#: if the client goes away before the response is complete (a queued request can be
#: dropped before it runs); at once if it already has.
ON_DISCONNECT: Final = "oipserve.on_disconnect"
#: What a scope without ``extensions`` reads as (one object, not an empty dict a read).
NO_EXTENSIONS: Final[MappingProxyType[str, object]] = MappingProxyType({})
#: Scope key set, to the 413's message, when a chunked body was refused by its declared size.
BODY_REFUSED: Final = "oipserve.body_refused"
#: The message of every 413 for a body past ``--max-request-bytes``.
TOO_LARGE: Final = "the request body is larger than the limit of {} bytes"


class ClientDisconnected(Exception):
    """The client went away before its request body was complete."""
