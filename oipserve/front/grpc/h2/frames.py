"""HTTP/2 on the wire (RFC 9113) as a gRPC server needs it: frame layout, codes, and the
few header blocks the server sends.

Nothing here holds state. The server's own header blocks are HPACK literals that are
never indexed (RFC 7541, 6.2.2) and never Huffman-coded, so they need no encoder
state and are built once: a response's headers and a success's trailers are
constant bytes; only a failure's trailers carry a message.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final
from urllib.parse import quote

#: The 24 bytes every client connection starts with.
PREFACE: Final[bytes] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Length (24 bits, as 16 + 8), type, flags, stream id (the top bit reserved).
HEADER: Final = struct.Struct(">HBBBI")
HEADER_SIZE: Final = HEADER.size
#: RFC 9113, 4.2: the smallest SETTINGS_MAX_FRAME_SIZE, every peer's until it says more.
DEFAULT_MAX_FRAME: Final = 16_384
#: RFC 9113, 6.9.2: every window starts at this size.
DEFAULT_WINDOW: Final = 65_535
#: The largest a flow-control window may grow.
MAX_WINDOW: Final = 2**31 - 1
#: The most of ``grpc-message`` (percent-encoded) a failure's trailers carry: a message
#: may echo client input (an unknown method's path, up to a 64 KiB header list).
MAX_STATUS_MESSAGE: Final = 1024
#: A WINDOW_UPDATE's increment, a RST_STREAM's code, a PRIORITY's dependency (31 bits
#: and a flag).
U32: Final = struct.Struct(">I")
#: The 5-byte prefix of every gRPC message: compressed flag, length.
MESSAGE_PREFIX: Final = struct.Struct(">BI")


class Frame(IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


# Flags (one byte; their meaning depends on the frame type).
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20


class Setting(IntEnum):
    HEADER_TABLE_SIZE = 1
    ENABLE_PUSH = 2
    MAX_CONCURRENT_STREAMS = 3
    INITIAL_WINDOW_SIZE = 4
    MAX_FRAME_SIZE = 5
    MAX_HEADER_LIST_SIZE = 6


class ErrorCode(IntEnum):
    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    ENHANCE_YOUR_CALM = 11


class ProtocolError(Exception):
    """The peer broke HTTP/2: the connection ends with a GOAWAY carrying ``code``."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


def frame_header(length: int, kind: Frame, flags: int, stream: int) -> bytes:
    return HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream)


def frame(kind: Frame, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return frame_header(len(payload), kind, flags, stream) + payload


def settings_frame(values: dict[Setting, int]) -> bytes:
    payload = b"".join(struct.pack(">HI", key, value) for key, value in values.items())
    return frame(Frame.SETTINGS, 0, 0, payload)


def window_update(stream: int, increment: int) -> bytes:
    return frame(Frame.WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def rst_stream(stream: int, code: int) -> bytes:
    """(``code``: an ``ErrorCode``, or any other int, as a test sends.)"""
    return frame(Frame.RST_STREAM, 0, stream, struct.pack(">I", code))


def goaway(last_stream: int, code: int, debug: str = "") -> bytes:
    """(``code``: an ``ErrorCode``, or any other int, as a test sends.)"""
    return frame(Frame.GOAWAY, 0, 0, struct.pack(">II", last_stream, code) + debug.encode())


# ---- the server's header blocks (HPACK, RFC 7541) ------------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (5.1) with ``first``'s high bits above a ``prefix_bits`` prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: bytes) -> bytes:
    return _integer(len(text), 7, 0x00) + text


def _never_indexed(name: bytes, value: bytes) -> bytes:
    """A literal field, never indexed, with a literal name (6.2.3, index 0)."""
    return b"\x10" + _string(name) + _string(value)


#: ``:status: 200`` (static table entry 8), ``content-type: application/grpc`` and the
#: encodings this server reads.
RESPONSE_HEADERS: Final = (
    b"\x88"
    + _never_indexed(b"content-type", b"application/grpc")
    + _never_indexed(b"grpc-accept-encoding", b"identity,deflate,gzip")
)
#: The trailers of a call that succeeded.
TRAILERS_OK: Final = _never_indexed(b"grpc-status", b"0")


def _percent(text: str) -> str:
    # NOTE: a lone surrogate (no UTF-8 bytes) goes as its escape, never an exception here:
    #   the call would go unanswered (``errors.sendable`` says where one comes from).
    return quote(
        text,
        safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~",
        encoding="utf-8",
        errors="backslashreplace",
    )


def trailers(code: int, message: str) -> bytes:
    """The trailers of a call that ended with ``code`` (gRPC's status number).

    grpc-message is percent-encoded as the gRPC spec says: UTF-8, with every byte
    outside printable ASCII, and ``%`` itself, escaped; cut to
    ``MAX_STATUS_MESSAGE`` bytes at a character's end.
    """
    block = _never_indexed(b"grpc-status", str(code).encode())
    if message:
        text = message[:MAX_STATUS_MESSAGE]
        encoded = _percent(text)
        while len(encoded) > MAX_STATUS_MESSAGE:  # whole characters off (one: 12 at most)
            text = text[: len(text) - 1 - (len(encoded) - MAX_STATUS_MESSAGE) // 12]
            encoded = _percent(text)
        block += _never_indexed(b"grpc-message", encoded.encode("ascii"))
    return block


def trailers_only(code: int, message: str) -> bytes:
    """A call answered with its status alone (gRPC's Trailers-Only): headers and trailers
    in one block."""
    return RESPONSE_HEADERS + trailers(code, message)
