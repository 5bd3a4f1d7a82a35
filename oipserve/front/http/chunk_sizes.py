"""The declared sizes of a chunked request body, read from its raw bytes as they arrive.

httptools (llhttp) parses ``Transfer-Encoding: chunked`` framing but tells its
caller neither the sizes the chunk-size lines declare nor where they are; it
simply waits for that many bytes. A client that declares ``FFFFFFFFFFFFFFFF``
would be refused only once ``--max-request-bytes`` of data had arrived.
``ChunkSizes`` follows the framing alongside the parser (RFC 9112 section 7.1)
and says ``OVER`` at the size line that takes the declared total past the
limit, before the data it announces is sent.

Chunk data is skipped by arithmetic (O(1) per read, whatever its length); only
size lines and the trailer section are looked at, and each is bounded. What it
does not understand it stops following (``UNKNOWN``) and leaves to the parser,
which answers malformed framing with a 400. Pure logic: no I/O, no asyncio.
"""

from __future__ import annotations

import re

#: The longest chunk-size line (size, extensions, CRLF) followed; a longer one is ``OVER``.
MAX_SIZE_LINE = 4096
#: The longest trailer section followed; a longer one is ``OVER``.
MAX_TRAILERS = 64 * 1024

#: ``feed`` results.
MORE = 0  #: the body goes on past what was fed
END = 1  #: the body ended (``ChunkSizes.end`` says where): stop following
UNKNOWN = 2  #: framing not understood: stop following, the parser decides
OVER = 3  #: a declared size, the declared total, or a line passes its bound

_SIZE, _DATA, _TRAILERS, _DONE = range(4)

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[^"\\\r\n]|\\[^\r\n])*"'
#: chunk-size [ chunk-ext ] CRLF, as llhttp accepts it (no whitespace around ``;``/``=``).
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]+)(?:;%s(?:=(?:%s|%s))?)*\r\n" % (_TOKEN, _TOKEN, _QUOTED))
_HEX_PREFIX = re.compile(rb"[0-9A-Fa-f]+")


class ChunkSizes:
    """Follows one chunked body: ``feed`` it the bytes after the request head, in order."""

    __slots__ = ("limit", "declared", "end", "_state", "_line", "_remaining", "_trailers")

    def __init__(self, limit: int, declared: int = 0) -> None:
        #: The most body bytes allowed (``--max-request-bytes``).
        self.limit = limit
        #: Sum of the chunk sizes declared so far.
        self.declared = declared
        #: After ``END``: the offset, in the data of the last ``feed``, just past the body.
        self.end = -1
        self._state = _SIZE
        self._line = b""  # the part of a size or trailer line received so far
        self._remaining = 0  # chunk data bytes still to come, with their CRLF
        self._trailers = 0  # bytes of the trailer section so far

    def feed(self, data: bytes, start: int = 0) -> int:
        """Follow ``data[start:]``: ``MORE``, or ``END``, ``UNKNOWN``, ``OVER`` (final)."""
        if self._state == _DONE:
            raise RuntimeError("ChunkSizes.feed after a final result")
        pos = start
        size = len(data)
        while pos < size:
            state = self._state
            if state == _DATA:
                # PERF: data is skipped, never looked at.
                take = min(self._remaining, size - pos)
                self._remaining -= take
                pos += take
                if not self._remaining:
                    self._state = _SIZE
                continue
            newline = data.find(b"\n", pos)
            if newline < 0:
                self._line += data[pos:]
                return self._finish(self._partial())
            line = self._line + data[pos : newline + 1]
            self._line = b""
            pos = newline + 1
            verdict = self._size_line(line) if state == _SIZE else self._trailer_line(line)
            if verdict != MORE:
                if verdict == END:
                    self.end = pos
                return self._finish(verdict)
        return MORE

    def _finish(self, verdict: int) -> int:
        if verdict != MORE:
            self._state = _DONE
        return verdict

    def _partial(self) -> int:
        """A line is incomplete: ``OVER`` if what came already passes a bound."""
        if self._state == _TRAILERS:
            return OVER if self._trailers + len(self._line) > MAX_TRAILERS else MORE
        if len(self._line) > MAX_SIZE_LINE:
            return OVER
        digits = _HEX_PREFIX.match(self._line)
        # NOTE: more digits can only make the size larger: decide now, not at the CRLF.
        if digits is not None and self.declared + int(digits.group(), 16) > self.limit:
            return OVER
        return MORE

    def _size_line(self, line: bytes) -> int:
        if len(line) > MAX_SIZE_LINE:
            return OVER
        match = _SIZE_LINE.fullmatch(line)
        if match is None:
            return UNKNOWN
        size = int(match.group(1), 16)
        self.declared += size
        if self.declared > self.limit:
            return OVER
        if size:
            self._remaining = size + 2  # the data, then its CRLF (checked by the parser)
            self._state = _DATA
        else:
            self._state = _TRAILERS
        return MORE

    def _trailer_line(self, line: bytes) -> int:
        if line == b"\r\n":
            return END
        self._trailers += len(line)
        if self._trailers > MAX_TRAILERS:
            return OVER
        return MORE if line.endswith(b"\r\n") and b":" in line else UNKNOWN


class ChunkEvents:
    """What the parser reported of a chunked body during the read that completed its head
    (``on_chunk_header``, ``on_body``, ``on_chunk_complete``: httptools calls them for
    chunked bodies only); ``size_line_start`` places the current size line from them."""

    __slots__ = ("open", "since", "completed")

    def __init__(self) -> None:
        self.open = False  # a chunk's size line was parsed, its data not yet complete
        self.since = 0  # body bytes since that size line
        self.completed = 0  # body bytes of the chunks completed before it


def size_line_start(data: bytes, events: ChunkEvents) -> int:
    """Where in ``data``, the read in which a chunked request's head completed, the
    current size line begins; 0 when this read cannot place it (the parser alone then
    judges the framing), as in the last chunk's trailers.

    It begins after the last LF before it: the head's last byte or the CRLF ending the
    previous chunk's data, both in ``data``.
    """
    if not events.open:
        return data.rfind(b"\n") + 1  # a size line is due, or part of it came
    # In a chunk's data, or just past it with the CR of its CRLF (or in the last chunk's
    #   trailers): its size line ends ``since`` bytes before the end, or one more. At
    #   most one of the two ends in CRLF.
    end = len(data) - events.since
    if data[end - 2 : end] != b"\r\n":
        end -= 1
        if not data.endswith(b"\r") or data[end - 2 : end] != b"\r\n":
            return 0  # in trailers: nothing more to follow
    return data.rfind(b"\n", 0, end - 1) + 1
