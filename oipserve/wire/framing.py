"""The frames of the sockets between processes: a message's 4-byte little-endian length,
then its msgpack body.

Both sides frame with these: the front and a worker (``oipserve.wire.messages``), the
primary and the other HTTP fronts (``oipserve.scaleout``). A module of its own so that it
is compiled (pyproject.toml's ``[tool.oipserve] compiled``: each request writes one frame
and reads one): ``messages`` defines msgspec Structs, which mypyc cannot compile.
"""

from __future__ import annotations

import msgspec

from oipserve.wire.datatypes import LENGTH_PREFIX

__all__ = ["FrameSplitter", "frame"]


def frame(encoder: msgspec.msgpack.Encoder, message: object) -> bytes:
    """One message as it goes on the socket: its length, then its msgpack body."""
    body = encoder.encode(message)
    return LENGTH_PREFIX.pack(len(body)) + body


class FrameSplitter:
    """Accumulates bytes from a stream and yields complete frame bodies."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        pos = 0
        end = len(buffer)
        while end - pos >= 4:
            (length,) = LENGTH_PREFIX.unpack_from(buffer, pos)
            if end - pos - 4 < length:
                break
            frames.append(bytes(buffer[pos + 4 : pos + 4 + length]))
            pos += 4 + length
        if pos:
            del buffer[:pos]
        return frames
