"""A connection's request headers: HPACK decoding (the ``hpack`` library) with a cache.

A gRPC client sends nearly the same header block on every call: once its dynamic table
holds the path, the authority and the user agent, each call's block is a few index
bytes, the same bytes call after call. Decoding them with ``hpack`` costs ~20 us
a call in Python; a block seen before is looked up instead, which is right only while
the decoder's dynamic table is as it was. The table counts its changes (an entry
added, its size changed) and the cache is keyed on that count: a block decoded again
under the same count decodes to the same headers.

The cache is bounded in decoded bytes too (``_CACHED_BYTES``), not only in blocks: a
block of a few index bytes may stand for a 4 KB header, and 64 such blocks held ~4 MB
per connection (issue 37). A gRPC call's header list is a few hundred bytes, so the
bound costs the calls that the cache is for nothing.

Each block's ``content-length`` (RFC 9113, 8.1.1), which gRPC clients never send, is
read once, when the block is decoded, and cached with it: the connection checks DATA
against it without reading a call's headers again.
"""

from __future__ import annotations

from typing import Final

from hpack import Decoder, HPACKError
from hpack.table import HeaderTable

from oipserve.front.grpc.h2.frames import ErrorCode, ProtocolError

#: Decoded blocks remembered per connection; past this, the cache starts again.
_CACHED_BLOCKS: Final = 64
#: Decoded bytes (names and values) remembered per connection; past this, the cache
#: starts again, and a header list larger than a quarter of it is never cached.
_CACHED_BYTES: Final = 32 * 1024
#: The largest decoded header list a client may send (SETTINGS_MAX_HEADER_LIST_SIZE).
MAX_HEADER_LIST: Final = 64 * 1024

Headers = tuple[tuple[str, str], ...]
#: ``HeaderDecoder.content_length`` of a block without one, and of one whose value is no
#: length (a malformed request).
NO_LENGTH: Final = -1
BAD_LENGTH: Final = -2

#: hpack's ``maxsize`` property object, from the class's namespace: mypy does not type
#: ``HeaderTable.maxsize`` (a property read from its class) as one.
_HPACK_MAXSIZE: Final[property] = vars(HeaderTable)["maxsize"]


class _CountingTable(HeaderTable):
    """HPACK's dynamic table, counting every change to it."""

    def __init__(self) -> None:
        super().__init__()
        self.changes = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        super().add(name, value)

    @property
    def maxsize(self) -> int:
        return super().maxsize

    @maxsize.setter
    def maxsize(self, newmax: int) -> None:
        self.changes += 1
        _HPACK_MAXSIZE.__set__(self, newmax)


class HeaderDecoder:
    """Decodes one connection's header blocks, in the order they arrive."""

    __slots__ = ("_decoder", "_table", "_cache", "_cached_at", "_cached_bytes", "content_length")

    def __init__(self) -> None:
        self._decoder = Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._table = _CountingTable()
        # NOTE: ``header_table`` is the attribute hpack's decoder reads and writes;
        #   tests/unit/test_grpc_h2.py fails if a new hpack renames it.
        self._decoder.header_table = self._table
        self._cache: dict[bytes, tuple[Headers, int]] = {}
        self._cached_at = 0
        self._cached_bytes = 0
        #: The last decoded block's content-length: ``NO_LENGTH``, ``BAD_LENGTH`` or bytes.
        self.content_length = NO_LENGTH

    def decode(self, block: bytes) -> Headers:
        changes = self._table.changes
        if changes != self._cached_at:
            self._cache.clear()
            self._cached_bytes = 0
            self._cached_at = changes
        cached = self._cache.get(block)
        if cached is not None:
            headers, self.content_length = cached
            return headers
        try:
            # hpack types decode() as giving bytes pairs; without raw=True they are str.
            headers = tuple(self._decoder.decode(block))  # type: ignore[arg-type]
        except (HPACKError, UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(f"bad header block: {exc}", ErrorCode.COMPRESSION_ERROR) from None
        self.content_length = _content_length(headers)
        if self._table.changes == changes:
            self._remember(block, headers)
        return headers

    def _remember(self, block: bytes, headers: Headers) -> None:
        """Cache ``headers`` within both bounds (a miss: its cost is the decode's)."""
        size = sum(len(name) + len(value) for name, value in headers)
        if size > _CACHED_BYTES // 4:
            return
        if len(self._cache) >= _CACHED_BLOCKS or self._cached_bytes + size > _CACHED_BYTES:
            self._cache.clear()
            self._cached_bytes = 0
        self._cache[block] = (headers, self.content_length)
        self._cached_bytes += size


def _content_length(headers: Headers) -> int:
    """A header list's content-length: ``NO_LENGTH`` without one; ``BAD_LENGTH`` if it is
    no decimal number, or given twice with different values (RFC 9110, 8.6)."""
    found = NO_LENGTH
    for name, value in headers:
        if name == "content-length":
            if not value.isdigit() or not value.isascii():
                return BAD_LENGTH
            if found not in (NO_LENGTH, int(value)):
                return BAD_LENGTH
            found = int(value)
    return found
