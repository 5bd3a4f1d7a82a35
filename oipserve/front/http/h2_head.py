"""The heads of a REST request and response on HTTP/2 (``h2_asgi``'s streams).

A request's header block becomes the ASGI scope HTTP/1.1 gives (``request_scope``): its
pseudo-headers the request line (RFC 9113, 8.3.1), ``:authority`` the ``host`` when the
request has none, what is malformed (8.1.1) a ``MalformedRequest`` (the stream is reset),
what HTTP/1.1's parser would refuse, and a padded field value, a ``Refusal`` (400, 405,
431), with the HTTP port's
limits (``limits.ConnectionLimits``). A response's head becomes its header block
(``response_block``): HPACK literals, no dynamic table, connection-specific fields left
out (8.2.2).
"""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import unquote

import httptools

from oipserve.front.grpc.h2.headers import Headers
from oipserve.front.header_rules import (
    CONNECTION_SPECIFIC,
    MalformedRequest,
    PaddedValue,
    h2_pseudo_header,
)
from oipserve.front.http.limits import ConnectionLimits, head_too_large, too_many_fields
from oipserve.front.http.parser_log import UNPARSABLE

__all__ = ["JSON", "Refusal", "is_grpc", "request_scope", "response_block"]

#: Connection-specific fields (RFC 9113, 8.2.2): a response never carries them.
_NOT_IN_RESPONSES = frozenset(name.encode() for name in CONNECTION_SPECIFIC)
#: A field name as HTTP/1.1's parser takes one (a token), lower case as HTTP/2 requires.
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
#: Methods HTTP/1.1's parser takes, known without asking it (``_http1_parses``).
_COMMON_METHODS = frozenset({"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"})
#: A method: a token (RFC 9110, 9.1).
_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: A control byte HTTP/1.1's parser refuses in a value (all but HTAB): a 400 there too.
_CONTROL = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: A request target HTTP/1.1's parser takes: printable ASCII.
_TARGET = re.compile(r"[\x21-\x7e]+")
#: ``:status: 200``, static table entry 8 (RFC 7541, Appendix A).
_STATUS_200 = b"\x88"
JSON = b"application/json"


def is_grpc(headers: Headers) -> bool:
    """Whether a header block is a gRPC call's (its content-type is gRPC's): read only for
    a block ``header_rules.read_call_head`` found malformed, to tell whose it is."""
    for name, value in headers:
        if name == "content-type":
            return value.startswith("application/grpc")
    return False


class Refusal(Exception):
    """A request answered at once with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def request_scope(
    headers: Headers, limits: ConnectionLimits, addresses: tuple[Any, Any]
) -> dict[str, Any]:
    """The ASGI scope of a request's header block, on a connection of (peer, own)
    ``addresses``. MalformedRequest (RFC 9113, 8.1.1) or ``Refusal`` (400, 405, 431) when
    it is not one to serve."""
    pseudo: dict[str, str] = {}
    fields: list[tuple[bytes, bytes]] = []
    regular = False
    size = 0
    host = False
    for name, value in headers:
        size += len(name) + len(value)
        try:
            if h2_pseudo_header(name, value, pseudo, regular):
                continue
        except PaddedValue as exc:
            raise Refusal(400, str(exc)) from None
        regular = True
        if _NAME.fullmatch(name) is None:
            raise MalformedRequest(f"a malformed field name {name!r} (RFC 9113, 8.2.1)")
        if _CONTROL.search(value) is not None:
            raise Refusal(400, f"a control character in the value of header {name!r}")
        host = host or name == "host"
        fields.append((name.encode(), value.encode()))
    method, path = _request_line(pseudo)
    _check_head(limits, len(fields), size)
    if not host and ":authority" in pseudo:
        fields.insert(0, (b"host", pseudo[":authority"].encode()))
    raw_path, _, query = path.partition("?")
    client, server = addresses
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "2",
        "method": method,
        "scheme": pseudo[":scheme"],
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": fields,
        "client": client,
        "server": server,
    }


def _check_head(limits: ConnectionLimits, count: int, size: int) -> None:
    """``--max-header-fields`` and ``--max-header-bytes``, as HTTP/1.1 applies them."""
    if count > limits.max_header_fields:
        raise Refusal(431, too_many_fields(limits))
    if size > limits.max_head_bytes:
        raise Refusal(431, head_too_large(limits))


def _request_line(pseudo: dict[str, str]) -> tuple[str, str]:
    """The method and path of a request's pseudo-headers (RFC 9113, 8.3.1)."""
    method = pseudo.get(":method")
    if method is None or _METHOD.fullmatch(method) is None:
        raise MalformedRequest("no :method, or one that is no token (RFC 9113, 8.3.1)")
    if method == "CONNECT":
        raise Refusal(405, "CONNECT is not served")
    if method not in _COMMON_METHODS and not _http1_parses(method):
        # NOTE: HTTP/1.1's answer, on every front: the other fronts forward a request
        #   they do not serve over HTTP/1.1, whose parser refused it in these words,
        #   where the primary's app answered in its own (found by fuzzing).
        raise Refusal(400, UNPARSABLE)
    path = pseudo.get(":path")
    if ":scheme" not in pseudo or not path:
        raise MalformedRequest("no :scheme or :path (RFC 9113, 8.3.1)")
    if _TARGET.fullmatch(path) is None or not (path[0] == "/" or path == "*"):
        raise Refusal(400, "the request target is not an absolute path of printable ASCII")
    return method, path


@functools.lru_cache(maxsize=64)
def _http1_parses(method: str) -> bool:
    """Whether HTTP/1.1's parser (llhttp, through httptools) takes ``method``: asked of it
    once per method, as httptools lists none."""
    parser = httptools.HttpRequestParser(_NoCallbacks())
    try:
        parser.feed_data(method.encode() + b" / HTTP/1.1\r\nHost: x\r\n\r\n")
    except httptools.HttpParserUpgrade:
        return True
    except httptools.HttpParserError:
        return False
    return True


class _NoCallbacks:
    """A parser's protocol that wants no callback."""


def _length(value: int) -> bytes:
    """An HPACK string length (RFC 7541, 5.1: a 7-bit prefix, no Huffman coding)."""
    if value < 127:
        return bytes([value])
    out = bytearray([127])
    value -= 127
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def response_block(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A response's header block: every field a literal without indexing (RFC 7541,
    6.2.2), so no dynamic table is kept; connection-specific fields are left out."""
    code = str(status).encode()
    parts = [_STATUS_200 if status == 200 else b"\x08" + _length(len(code)) + code]
    for name, value in headers:
        name = bytes(name).lower()
        if name in _NOT_IN_RESPONSES:
            continue
        value = bytes(value)
        parts.append(b"\x00" + _length(len(name)) + name + _length(len(value)) + value)
    return b"".join(parts)
