"""How an HTTP/1.x request's head frames its body, and which heads this port refuses for
it (RFC 9112): the versions it speaks, and the transfer codings it applies.

``protocol.CorkedHttpToolsProtocol`` asks these when a head is complete; httptools
(llhttp) parses, and these judge what it lets through.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import httptools

__all__ = [
    "VERSIONS",
    "frame_by_transfer_encoding",
    "is_chunked",
    "transfer_coding_refusal",
    "without_content_length",
]

#: The HTTP/1.x versions this port serves (HTTP/2 comes by ``h2c``).
VERSIONS: Final = frozenset({"1.0", "1.1"})


def frame_by_transfer_encoding(parser: httptools.HttpRequestParser) -> None:
    """Set ``parser`` to read a request with both Transfer-Encoding and Content-Length by
    its Transfer-Encoding alone, as RFC 9112 6.1 allows (and Triton does: its QA's
    ``test_content_encoding_chunked_manually``), instead of llhttp's 400. The protocol
    closes the connection after the answer, which is what closes the request-smuggling
    path the 400 guarded against."""
    parser.set_dangerous_leniencies(lenient_chunked_length=True)


def transfer_coding_refusal(headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, str] | None:
    """Why a request's Transfer-Encoding cannot frame its body, with the status; None when
    it ends in ``chunked`` after nothing but ``identity``.

    RFC 9112 6.3: a request whose last transfer coding is not chunked has no length the
    server can know: 400, and the connection closed. llhttp reads such a body to the
    connection's end once ``lenient_chunked_length`` is set (``xchunked``, ``gzip``,
    ``chunked;x=1``: no answer, a pipelined request swallowed; found by fuzzing). A coding
    before chunked that this server does not apply (``gzip, chunked``) is 501, as RFC 9112
    6.1 advises, where it was read as plain chunked."""
    codings = [
        coding.strip().lower()
        for name, value in headers
        if name == b"transfer-encoding"
        for coding in value.split(b",")
        if coding.strip()
    ]
    if not codings or codings[-1] != b"chunked":
        return 400, "the request's Transfer-Encoding does not end in chunked (RFC 9112, 6.3)"
    for coding in codings[:-1]:
        if coding != b"identity":
            shown = coding.decode("ascii", "backslashreplace")
            return 501, f"transfer coding '{shown}' is not implemented (only chunked)"
    return None


def without_content_length(headers: list[tuple[bytes, bytes]]) -> bool:
    """Drop Content-Length from a Transfer-Encoding request's ``headers`` (in place: the
    scope's list): the body is framed by Transfer-Encoding, and nothing after the parser
    (the early 413, the body's lease) may take the other length for it. Whether one was
    there."""
    kept = [field for field in headers if field[0] != b"content-length"]
    dropped = len(kept) != len(headers)
    headers[:] = kept
    return dropped


def is_chunked(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a served request's body is chunked: it has a Transfer-Encoding (one that
    does not end in chunked was refused with its head, ``transfer_coding_refusal``)."""
    for name, _ in headers:
        if name == b"transfer-encoding":
            return True
    return False
