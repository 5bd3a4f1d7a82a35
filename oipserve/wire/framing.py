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

__all__ = ["FrameSplitter", "frame", "frame_into"]


def frame(encoder: msgspec.msgpack.Encoder, message: object) -> bytes:
    """One message as it goes on the socket: its length, then its msgpack body."""
    body = encoder.encode(message)
    return LENGTH_PREFIX.pack(len(body)) + body


def frame_into(encoder: msgspec.msgpack.Encoder, message: object, out: bytearray) -> None:
    """``frame(encoder, message)`` added to the end of ``out``.

    PERF: no object made: ``frame`` makes three (the body, its length, the two joined),
    and the writer's list of them and their join more.
    """
    start = len(out)
    encoder.encode_into(message, out, start + 4)  # (out grows to hold it)
    LENGTH_PREFIX.pack_into(out, start, len(out) - start - 4)


class FrameSplitter:
    """Accumulates bytes from a stream and yields complete frame bodies."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frame bodies ``data`` completes; what it leaves of a frame is kept.

        PERF: with nothing kept from before (the usual case) the bodies are cut from
        ``data`` itself, one object each (through the buffer: a bytearray slice and its
        copy, and the length's tuple).
        """
        buffer = self._buffer
        if buffer:
            buffer += data
            return _split(buffer)
        frames: list[bytes] = []
        pos = 0
        end = len(data)
        while end - pos >= 4:
            length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16 | data[pos + 3] << 24
            if end - pos - 4 < length:
                break
            frames.append(data[pos + 4 : pos + 4 + length])
            pos += 4 + length
        if pos < end:
            buffer += data
            del buffer[:pos]
        return frames


def _split(buffer: bytearray) -> list[bytes]:
    """The complete frame bodies at the start of ``buffer``, taken out of it."""
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
