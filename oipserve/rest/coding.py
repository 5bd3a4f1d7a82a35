"""HTTP content coding of request and response bodies: gzip and deflate, both ways.

Kept apart from body reading and rendering because both use it and neither is
about it: a body is decompressed after it is read, a response compressed after
it is rendered.
"""

from __future__ import annotations

import zlib

from oipserve.errors import InvalidInput, PayloadTooLarge


def decompress(data: bytes, encoding: str, limit: int) -> bytes:
    """``data`` decoded from ``encoding`` (gzip or deflate); 413 past ``limit`` bytes."""
    if encoding == "gzip":
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    else:  # deflate: zlib-wrapped as RFC 9110 says; raw deflate as browsers sometimes send
        decompressor = zlib.decompressobj(
            zlib.MAX_WBITS if data[:1] == b"\x78" else -zlib.MAX_WBITS
        )
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"the {encoding} request body cannot be decompressed: {exc}") from None
    if len(out) > limit or decompressor.unconsumed_tail:
        raise PayloadTooLarge(f"the decompressed body is larger than the limit of {limit} bytes")
    if not decompressor.eof:
        raise InvalidInput(f"the {encoding} request body is truncated")
    return out


def choose_encoding(accept: str | None) -> str:
    """Pick gzip, deflate or identity from Accept-Encoding by q-value (first wins ties)."""
    if not accept:
        return "identity"
    best, best_q = "identity", 0.0
    for item in accept.split(","):
        name, _, params = item.strip().partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate", "identity"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        if q > best_q:
            best, best_q = name, q
    return best


def compress(parts: list[bytes | memoryview], encoding: str) -> bytes:
    """``parts``, in order, as one gzip or zlib-wrapped deflate stream."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    out = [compressor.compress(part) for part in parts]
    out.append(compressor.flush())
    return b"".join(out)
