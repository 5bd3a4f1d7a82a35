"""The request-header rules of every front, in one table, so that the fronts cannot drift.

With ``--http-workers N`` a client's connection lands on any of N fronts (``SO_REUSEPORT``),
and the client must not be able to tell which: the same request gets the same answer. A
secondary front answers inference itself and forwards the rest to the primary, HTTP/1.1
re-framed by h11 (``scaleout/forward.py``) and gRPC calls through a grpc.aio channel
(``scaleout/grpc_forward.py``). Both clients check what they send more strictly than the
servers' parsers check what they receive. Until 2026-11-28 that made the fronts answer
differently: a header the primary took as it came was refused by h11 on the other front
(400), or dropped there (403), or made grpc.aio fail the call (INTERNAL, with a traceback).

So every front applies these rules to what it receives, before any route, restriction or
forward: ``HeadChecked`` wraps both fronts' HTTP apps (``http_server``; the infer lane,
``front/http/lane.py``, takes only heads these rules leave as they are), and
``front.grpc.call`` reads every call's headers with ``read_call_head`` and ``grpc_timeout``
on both fronts. What passes them is exactly what the forwarding path can carry unchanged, and
what the primary receives again from a forward passes them unchanged (they are idempotent).

HTTP/1.1 request heads (every front parses with the same llhttp, through uvicorn):

============================================  =========================================
a field name that is not a token (whitespace  400, by the parser (RFC 9112, 5.1)
before the colon, an empty name, 8-bit bytes)
a control byte other than HTAB in a value,    400, by the parser (RFC 9110, 5.5; RFC
obs-fold, a bare CR                           9112, 5.2)
Content-Length twice (equal or not), not      400, by the parser (RFC 9112, 6.3)
digits
Content-Length beside Transfer-Encoding       the body read by Transfer-Encoding alone,
                                              Content-Length dropped, the connection
                                              closed after the answer (RFC 9112, 6.1)
a target with a byte outside printable ASCII  400, by the parser
Host more than once                           400 here (RFC 9112, 3.2)
no Host (HTTP/1.1)                            accepted, as by Triton (the forward names
                                              the front's address)
whitespace at the end of a value              stripped here (the parser strips it at the
                                              start): RFC 9110, 5.5, a value excludes it
the case of a name                            ignored (uvicorn lower-cases names)
a repeated name (other than Host)             kept, every value, in order
``HOP_BY_HOP``                                about the client's connection: not
                                              forwarded (RFC 9110, 7.6.1)
headers that ``Connection`` names             kept and forwarded: the server (all its
                                              fronts) is the recipient they are for
``Expect``                                    answered by the front that has the
                                              connection; not forwarded
Content-Length, Transfer-Encoding             the forward frames the body the front's
                                              parser delivered (``scaleout/forward.py``)
============================================  =========================================

gRPC calls (HTTP/2 header fields of a request, ``read_call_head``): a malformed request
(RFC 9113, 8.1.1) is a stream error, RST_STREAM PROTOCOL_ERROR, and no call starts (as
grpc-go answers each of these; gRPC core answers a bad ``:method`` or ``te`` with a
status instead, where the RFC is silent on the method):

============================================  =========================================
a name with upper case, a byte in 0x00-0x20   malformed (RFC 9113, 8.2.1): RST_STREAM
or 0x7f-0xff, a ``:`` past its first byte,    PROTOCOL_ERROR; not dropped, unlike a bad
or empty; a value with NUL, CR or LF, or      metadata value below
starting or ending in SP or HTAB
``connection``, ``keep-alive``,               malformed (8.2.2)
``proxy-connection``, ``transfer-encoding``,
``upgrade``; ``te`` other than ``trailers``
a pseudo-header after a regular field, one    malformed (8.3, 8.3.1)
repeated, an unknown one (``:status`` too),
no ``:method``, ``:scheme`` or ``:path``, an
empty ``:path``
``:method`` other than POST                   RST_STREAM PROTOCOL_ERROR, as grpc-go
a ``content-type`` not ``application/grpc``   HTTP 415, as gRPC servers answer

gRPC metadata (the regular fields of a well-formed call):

============================================  =========================================
pseudo-headers, ``TRANSPORT_KEYS``            the transport's: not the call's metadata
a key that is not a gRPC key (a well-formed   not metadata: dropped on arrival, so no
name with another token byte, say ``!``) or   handler, restriction or forward sees it
an ASCII value with another byte outside      (gRPC's own clients cannot send either;
``0x20-0x7e`` (a control byte, a tab inside,  grpc.aio refuses to forward them)
non-ASCII)
``-bin`` keys and ``grpc-`` keys              metadata, but not forwarded (no RPC of the
                                              service reads either; ``grpc-`` is gRPC's)
``oipserve-connection``                       read on the primary's private socket
                                              alone (which client connection of the
                                              forwarding front sent an inference); a
                                              client's own is not forwarded
``grpc-timeout``                              ``grpc_timeout``: 1-8 digits and a unit,
                                              else INTERNAL (as grpc-go); longer than
                                              ``MAX_GRPC_TIMEOUT``: no deadline (as gRPC
                                              core saturates it), on every front
============================================  =========================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NamedTuple

from oipserve.errors import InvalidInput, http_status

__all__ = [
    "App",
    "CONNECTION_SPECIFIC",
    "HOP_BY_HOP",
    "MAX_GRPC_TIMEOUT",
    "CallHead",
    "FORWARDED_CONNECTION",
    "MalformedRequest",
    "NOT_FORWARDED",
    "PaddedValue",
    "OWS",
    "TRANSPORT_KEYS",
    "HeadChecked",
    "h2_pseudo_header",
    "check_http_head",
    "forwarded_metadata",
    "grpc_timeout",
    "is_metadata",
    "read_call_head",
]

Headers = list[tuple[bytes, bytes]]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: An ASGI 3 application.
App = Callable[[Message, Receive, Send], Awaitable[None]]

# ---- HTTP/1.1 ---------------------------------------------------------------------------

#: Headers about one connection rather than the message (RFC 9110, 7.6.1): a forward is a
#: connection of the front's own, with its own framing and keep-alive, so they stop at the
#: front that received them.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
#: Not forwarded: the hop-by-hop headers, and ``Expect: 100-continue``, which the front
#: that has the client's connection answers when the body is first asked for (the
#: primary must not wait to be asked again).
NOT_FORWARDED = HOP_BY_HOP | {b"expect"}

#: What a value may end in that is not part of it (RFC 9110, 5.6.3: OWS).
OWS = (b" ", b"\t")


def check_http_head(scope: Message) -> None:
    """Apply the HTTP rules to a request's head: raise InvalidInput (400) for a Host given
    more than once; strip whitespace at the end of values (in ``scope["headers"]``).

    PERF: one pass over the headers, and a new list only when a value needs stripping
    (rare): about 0.1 us a header.
    """
    headers: Headers = scope["headers"]
    hosts = 0
    padded = False
    for name, value in headers:
        if name == b"host":
            hosts += 1
        if value.endswith(OWS):
            padded = True
    if hosts > 1:
        raise InvalidInput(
            f"the request has {hosts} Host headers; HTTP/1.1 allows one (RFC 9112, 3.2)"
        )
    if padded:
        scope["headers"] = [(name, value.rstrip(b" \t")) for name, value in headers]


class HeadChecked:
    """An ASGI app with ``check_http_head`` applied first: what every HTTP front serves.

    A refused request is answered here (its body unread, as a 403 of a restriction is)
    with the JSON error every route gives.

    PERF: ``__call__`` is a plain function returning the app's coroutine, not a coroutine
    of its own: no extra frame per request (uvicorn is told the interface, ``asgi3``).
    """

    __slots__ = ("_app",)

    def __init__(self, app: App) -> None:
        self._app = app

    def __call__(self, scope: Message, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "http":
            try:
                check_http_head(scope)
            except InvalidInput as exc:
                return _refuse(send, exc)
        return self._app(scope, receive, send)


async def _refuse(send: Send, exc: InvalidInput) -> None:
    status, message = http_status(exc)
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# ---- gRPC -------------------------------------------------------------------------------

#: Header fields of a call that are the transport's, not the call's metadata: gRPC's own
#: (besides ``grpc-timeout`` and ``grpc-encoding``, read by the call) and HTTP's
#: connection-specific ones (RFC 9113, 8.2.2), which no gRPC client sends.
TRANSPORT_KEYS = frozenset(
    {"content-type", "te", "grpc-encoding", "grpc-accept-encoding", "grpc-timeout", "user-agent"}
    | {name.decode() for name in HOP_BY_HOP}
)

#: A gRPC metadata key (lower case, digits, ``-``, ``_``, ``.``) and an ASCII value
#: (space and printable ASCII): what a gRPC client can send, and what grpc.aio forwards.
_GRPC_KEY = re.compile(r"[0-9a-z_.\-]+")
_GRPC_VALUE = re.compile(r"[\x20-\x7e]*")


def is_metadata(key: str, value: str) -> bool:
    """Whether a header field (not a pseudo-header, not in ``TRANSPORT_KEYS``) is the
    call's metadata; one that is not is dropped on arrival, on every front."""
    if _GRPC_KEY.fullmatch(key) is None:
        return False
    return key.endswith("-bin") or _GRPC_VALUE.fullmatch(value) is not None


def forwarded_metadata(
    metadata: Iterable[tuple[str, str]], mark: str = ""
) -> tuple[tuple[str, str], ...]:
    """What of a call's metadata is forwarded to the primary: all but binary (``-bin``,
    which grpc wants as bytes) and gRPC's reserved ``grpc-`` keys. No RPC the primary
    answers reads either, so its answer is the same as to the whole metadata. With a
    ``mark`` (an inference), ``FORWARDED_CONNECTION`` says which client connection of
    this front sent it; a client's own value of that key is never forwarded."""
    kept = tuple(
        (key, value)
        for key, value in metadata
        if not key.endswith("-bin") and not key.startswith("grpc-") and key != FORWARDED_CONNECTION
    )
    return (*kept, (FORWARDED_CONNECTION, mark)) if mark else kept


#: The metadata key of an inference another front forwards to the primary: which client
#: connection of that front it came from (the front's pid and the connection's serial),
#: whose share of the workers' queues the primary counts it in
#: (``runtime.worker_share.ForwardedShares``). Read on the primary's private socket
#: alone; a client's own value is not forwarded (``forwarded_metadata``).
FORWARDED_CONNECTION = "oipserve-connection"

#: ``grpc-timeout``: TimeoutValue (1 to 8 digits) and TimeoutUnit (PROTOCOL-HTTP2.md).
_TIMEOUT = re.compile(r"(\d{1,8})([HMSmun])")
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
#: Seconds: a longer ``grpc-timeout`` is no deadline at all. gRPC core saturates a
#: deadline it cannot hold to "infinite"; a forward could not carry it either (grpc.aio
#: overflows past ~292 years and fails such a call at once). 10**8 s is over 3 years,
#: and the largest timeout in seconds a client can send (99999999S).
MAX_GRPC_TIMEOUT = 1e8


def grpc_timeout(text: str) -> float | None:
    """The seconds a ``grpc-timeout`` value gives the call; None for no deadline (longer
    than ``MAX_GRPC_TIMEOUT``). ValueError when it is not one."""
    match = _TIMEOUT.fullmatch(text)
    if match is None:
        raise ValueError(f"malformed grpc-timeout {text!r}")
    seconds = int(match[1]) * _UNITS[match[2]]
    return None if seconds > MAX_GRPC_TIMEOUT else seconds


# ---- HTTP/2 requests (RFC 9113, 8.1.1-8.3) ---------------------------------------------


class MalformedRequest(ValueError):
    """A malformed HTTP/2 request (RFC 9113, 8.1.1): answered with RST_STREAM
    PROTOCOL_ERROR, and no call starts."""


class PaddedValue(MalformedRequest):
    """A regular field whose value starts or ends with SP or HTAB: malformed too (RFC 9113,
    8.2.1), but answered, not reset: a gRPC call with INVALID_ARGUMENT, a REST request with
    a 400. gRPC's own servers take such a value as it is, and HTTP/1.1 trims it, so a
    client moving here learns what to mend instead of reading "RST_STREAM error code 1"."""


class CallHead(NamedTuple):
    """What a well-formed call's header block says, read once (``read_call_head``)."""

    method: str
    path: str
    content_type: str
    encoding: str
    timeout: str
    metadata: tuple[tuple[str, str], ...]


#: The pseudo-headers a request may carry (RFC 9113, 8.3.1), each at most once.
_PSEUDO = frozenset({":method", ":scheme", ":authority", ":path"})
#: Connection-specific fields (RFC 9113, 8.2.2): a request with any is malformed, and a
#: response never carries them.
CONNECTION_SPECIFIC = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}
)
#: A name no HTTP/2 request may carry (8.2.1): upper case, a byte in 0x00-0x20 or
#: 0x7f-0xff, a colon; empty. Checked only when a name is not a gRPC key (rare).
_BAD_NAME = re.compile(r"[\x00-\x20A-Z:\x7f-\U0010ffff]|^$")
#: A value no HTTP/2 request may carry (8.2.1): NUL, CR, LF; SP or HTAB at either end.
_BAD_VALUE = re.compile(r"[\x00\r\n]|^[ \t]|[ \t]$")
#: What no value may hold anywhere (8.2.1): the stream is reset.
_FORBIDDEN_IN_VALUE = re.compile(r"[\x00\r\n]")
#: Decoded header blocks (``h2.headers`` hands back the same tuple for a block it has
#: cached) and what they read as: a client's every call after its first costs a lookup.
_HEADS: dict[tuple[tuple[str, str], ...], CallHead] = {}
_CACHED_HEADS = 64


def read_call_head(headers: tuple[tuple[str, str], ...]) -> CallHead:
    """A call's header block, checked as RFC 9113 asks of a request and read: its
    pseudo-headers, the fields gRPC reads and its metadata (``is_metadata``; what is not
    is dropped). MalformedRequest for a malformed request.

    PERF: a block seen before (a client's every call after its first) is a dict lookup.
    """
    head = _HEADS.get(headers)
    if head is not None:
        return head
    head = _read_call_head(headers)
    if len(_HEADS) >= _CACHED_HEADS:
        _HEADS.clear()
    _HEADS[headers] = head
    return head


def h2_pseudo_header(name: str, value: str, pseudo: dict[str, str], regular: bool) -> bool:
    """RFC 9113's rules for one field of an HTTP/2 request's header block, every front's
    (gRPC calls here, REST streams in ``front.http.h2_asgi``): MalformedRequest for a
    malformed value (8.2.1; ``PaddedValue`` for a regular field's padded one), a
    pseudo-header after a regular field, unknown or repeated (8.3), a connection-specific
    field (8.2.2). True for a pseudo-header (put in ``pseudo``); False for a regular field,
    whose name the caller checks as its protocol reads names."""
    if _BAD_VALUE.search(value) is not None:
        if name[:1] != ":" and _FORBIDDEN_IN_VALUE.search(value) is None:
            raise PaddedValue(
                f"the value of header {name!r} starts or ends with a space or a tab, which "
                "HTTP/2 does not allow (RFC 9113, 8.2.1)"
            )
        raise MalformedRequest(f"a malformed value of {name!r} (RFC 9113, 8.2.1)")
    if name[:1] == ":":
        if regular or name not in _PSEUDO or name in pseudo:
            raise MalformedRequest(f"a misplaced or unknown {name!r} (RFC 9113, 8.3)")
        pseudo[name] = value
        return True
    if name in CONNECTION_SPECIFIC or (name == "te" and value != "trailers"):
        raise MalformedRequest(f"a connection-specific field {name!r} (RFC 9113, 8.2.2)")
    return False


def _read_call_head(headers: tuple[tuple[str, str], ...]) -> CallHead:
    pseudo: dict[str, str] = {}
    fields: dict[str, str] = {}
    metadata = []
    regular = False
    for name, value in headers:
        if h2_pseudo_header(name, value, pseudo, regular):
            continue
        regular = True
        if _GRPC_KEY.fullmatch(name) is None and _BAD_NAME.search(name) is not None:
            raise MalformedRequest(f"a malformed field name {name!r} (RFC 9113, 8.2.1)")
        if name in _READ:
            fields[name] = value
        elif name not in TRANSPORT_KEYS and is_metadata(name, value):
            metadata.append((name, value))
    if ":method" not in pseudo or ":scheme" not in pseudo or not pseudo.get(":path"):
        raise MalformedRequest("no :method, :scheme or :path (RFC 9113, 8.3.1)")
    if pseudo.get(":method") != "POST":
        raise MalformedRequest(f":method {pseudo.get(':method')!r}, not POST (as grpc-go)")
    return CallHead(
        "POST",
        pseudo[":path"],
        fields.get("content-type", ""),
        fields.get("grpc-encoding", "identity"),
        fields.get("grpc-timeout", ""),
        tuple(metadata),
    )


#: The regular fields a call reads (besides its metadata).
_READ = frozenset({"content-type", "grpc-encoding", "grpc-timeout"})
