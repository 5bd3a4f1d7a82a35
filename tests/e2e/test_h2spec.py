"""h2spec's cases (summerwind/h2spec, its http2, generic and hpack sections) against the
gRPC port, from outside: raw frames over a socket, judged as h2spec judges them
(``tests.support.h2_raw``). Issue 37, item 3.

Applicable: 147 of 147 cases; passed: 147 of 147 (until REST over HTTP/2 streams came, issue
39, generic/4/1 and 4/2, a GET and a HEAD, did not apply to a gRPC-only port: they are now
answered by the REST app). Before 2026-11-28, 10 failed:
http2/5.1/5, 5.1/8, 5.1/11, 6.1/2 (DATA on a closed stream dropped in silence), 5.1/12
(HEADERS on a stream both sides ended: a stream error, not a connection error), 5.1.1/2
(HEADERS on a skipped lower id: the same), 5.3.1/1-2 (a stream depending on itself not
checked), 8.1.2.6/1-2 (content-length not checked against the DATA).

What each case sends and expects is h2spec's, with these differences:

- h2spec's request is a GET (its ``CommonHeaders``); here it is a well-formed gRPC call
  (POST, ``content-type: application/grpc``, ``te: trailers``, ServerLive), so that each
  case checks the gRPC call path (generic/4/1-2 send h2spec's GET and HEAD). Where h2spec
  needs an answer with a body (the flow-control cases), the call carries its (empty)
  message and ServerLive's answer is the body. Where a case asks only that a frame be
  accepted (the generic section), the call is a whole one and its answer must be
  grpc-status 0, not just any HEADERS frame.
- A GOAWAY (or a RST_STREAM on the stream in question) with a code other than the expected
  ones fails at once; h2spec waits on and passes if the connection then closes.
- http2/4.2/1 sends DATA of 2^14 bytes, as its title says (h2spec sends the server's
  SETTINGS_MAX_FRAME_SIZE, 256 KiB here); 4.2/2-3 go past the 256 KiB advertised.
- http2/8.1.2.3/2 leaves out ``:method`` alone (h2spec's frame also drops ``:scheme``).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator

import pytest

from oipserve.front.grpc.h2.frames import (
    ACK,
    END_HEADERS,
    PREFACE,
    ErrorCode,
    Frame,
    Setting,
    frame,
    goaway,
    rst_stream,
    window_update,
)
from tests.support.h2_raw import (
    EMPTY_MESSAGE,
    SERVER_LIVE,
    H2Client,
    Verdict,
    grpc_headers,
    priority_payload,
)
from tests.support.server import ServerProcess

PROTOCOL = ErrorCode.PROTOCOL_ERROR
STREAM_CLOSED = ErrorCode.STREAM_CLOSED
FRAME_SIZE = ErrorCode.FRAME_SIZE_ERROR
FLOW_CONTROL = ErrorCode.FLOW_CONTROL_ERROR
COMPRESSION = ErrorCode.COMPRESSION_ERROR
#: h2spec's PING payloads.
ZEROS = b"\x00" * 8
H2SPEC = b"h2spec\x00\x00"
#: h2spec's ``DummyHeaders`` value length (its --max-header-length default).
DUMMY = 4000

#: h2spec cases that do not apply to a gRPC-only server, and why.
NOT_APPLICABLE: dict[str, str] = {}

Case = Callable[[H2Client], None]
CASES: dict[str, tuple[Case, bool]] = {}


def case(name: str, handshake: bool = True) -> Callable[[Case], Case]:
    """Register an h2spec case under its id (``section/number``, as h2spec numbers)."""

    def register(run: Case) -> Case:
        CASES[name] = (run, handshake)
        return run

    return register


# ---- helpers for the cases ---------------------------------------------------------------


def _dummy(c: H2Client, count: int = 1) -> bytes:
    """h2spec's ``DummyHeaders``: ``count`` fields of ``DUMMY`` bytes each, encoded."""
    return c.block([(f"x-dummy{i}", "x" * DUMMY) for i in range(count)])


def _ping(data: bytes = ZEROS, flags: int = 0) -> bytes:
    return frame(Frame.PING, flags, 0, data)


def _priority(
    stream: int, depends_on: int = 0, weight: int = 255, exclusive: bool = False
) -> bytes:
    return frame(Frame.PRIORITY, 0, stream, priority_payload(depends_on, weight, exclusive))


def _settings(*values: tuple[int, int]) -> bytes:
    return H2Client.settings_frame(values)


def _message_of(size: int) -> bytes:
    """A gRPC message of ``size`` bytes in all (prefix included) that ServerLive takes:
    its payload one unknown length-delimited field (tag 1), which a parser skips."""
    length = size - 5 - 3  # the field's tag and a 2-byte varint length
    assert 128 <= length < 16384
    field = bytes([0x0A, (length & 0x7F) | 0x80, length >> 7]) + b"x" * length
    return struct.pack(">BI", 0, len(field)) + field


def _answered(c: H2Client, stream: int, headers_frame: bytes, *before: bytes) -> None:
    """``before`` frames, then a call whose HEADERS frame is ``headers_frame`` and whose
    message follows it; its answer must be grpc-status 0."""
    c.send(b"".join(before) + headers_frame + c.data_frame(stream, EMPTY_MESSAGE, end_stream=True))
    c.expect_ok(stream)


def _closed_stream(c: H2Client) -> bytes:
    """Stream 1 opened with END_STREAM and answered (closed both ways); its HEADERS frame."""
    opened = c.headers_frame(1, c.request_block(), end_stream=True)
    c.send(opened)
    c.expect_stream_closed(1)
    return opened


def _pseudo(c: H2Client, *extra: tuple[str, str], drop: str = "") -> bytes:
    """A request block with ``extra`` among its pseudo-headers (after :authority) and
    the pseudo-header ``drop`` left out."""
    headers = grpc_headers(c.authority)
    fields = [field for field in headers[:4] if field[0] != drop]
    return c.block([*fields, *extra, *headers[4:]])


# ---- http2/3: Starting HTTP/2 -------------------------------------------------------------


@case("http2/3.5/1", handshake=False)
def _preface(c: H2Client) -> None:
    """The server's first frame is its SETTINGS (not an ACK)."""
    c.send(PREFACE + _settings((Setting.INITIAL_WINDOW_SIZE, 65_535)))
    first = c.read(time.monotonic() + c.timeout)
    if first is None or first.kind != Frame.SETTINGS or first.flags & ACK:
        raise Verdict(f"expected SETTINGS (flags 0) first; got {first}")


@case("http2/3.5/2", handshake=False)
def _invalid_preface(c: H2Client) -> None:
    c.send(b"INVALID CONNECTION PREFACE\r\n\r\n")
    c.expect_connection_error(PROTOCOL)


# ---- http2/4: HTTP frames -----------------------------------------------------------------


@case("http2/4.1/1")
def _unknown_type(c: H2Client) -> None:
    c.send(b"\x00\x00\x08\x16\x00\x00\x00\x00\x00" + ZEROS + _ping())
    c.expect_ping_ack(ZEROS)


@case("http2/4.1/2")
def _undefined_flag(c: H2Client) -> None:
    c.send(b"\x00\x00\x08\x06\x16\x00\x00\x00\x00" + ZEROS)
    c.expect(Frame.PING)


@case("http2/4.1/3")
def _reserved_bit(c: H2Client) -> None:
    c.send(b"\x00\x00\x08\x06\x16\x80\x00\x00\x00" + ZEROS)
    c.expect(Frame.PING)


@case("http2/4.2/1")
def _data_of_2_14(c: H2Client) -> None:
    message = _message_of(2**14)
    c.send(c.headers_frame(1, c.request_block()) + c.data_frame(1, message, end_stream=True))
    c.expect_ok(1)


@case("http2/4.2/2")
def _data_over_max_frame(c: H2Client) -> None:
    size = c.settings.get(Setting.MAX_FRAME_SIZE, 16_384) + 1
    c.send(c.headers_frame(1, c.request_block()) + c.data_frame(1, b"x" * size, end_stream=True))
    c.expect_stream_error(1, FRAME_SIZE)


@case("http2/4.2/3")
def _headers_over_max_frame(c: H2Client) -> None:
    size = c.settings.get(Setting.MAX_FRAME_SIZE, 16_384)
    fields = [(f"x-dummy{i}", "x" * DUMMY) for i in range(size // DUMMY + 2)]
    block = c.block([*grpc_headers(c.authority), *fields], huffman=False)
    assert len(block) > size
    c.send(c.headers_frame(1, block, end_stream=True))
    c.expect_connection_error(FRAME_SIZE)


@case("http2/4.3/1")
def _invalid_block(c: H2Client) -> None:
    c.send(b"\x00\x00\x01\x01\x05\x00\x00\x00\x01\x40")
    c.expect_connection_error(COMPRESSION)


@case("http2/4.3/2")
def _priority_inside_block(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_headers=False)
        + _priority(1)
        + c.continuation(1, _dummy(c), end_headers=True)
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/4.3/3")
def _headers_inside_block(c: H2Client) -> None:
    block = c.request_block()
    c.send(
        c.headers_frame(1, block, end_headers=False)
        + c.headers_frame(3, block, end_stream=True)
        + c.continuation(1, _dummy(c), end_headers=True)
    )
    c.expect_connection_error(PROTOCOL)


# ---- http2/5: Streams and multiplexing ------------------------------------------------------


@case("http2/5.1/1")
def _idle_data(c: H2Client) -> None:
    c.send(c.data_frame(1, b"test", end_stream=True))
    c.expect_stream_error(1, PROTOCOL, STREAM_CLOSED)


@case("http2/5.1/2")
def _idle_rst_stream(c: H2Client) -> None:
    c.send(rst_stream(1, ErrorCode.CANCEL))
    c.expect_connection_error(PROTOCOL)


@case("http2/5.1/3")
def _idle_window_update(c: H2Client) -> None:
    c.send(window_update(1, 100))
    c.expect_connection_error(PROTOCOL)


@case("http2/5.1/4")
def _idle_continuation(c: H2Client) -> None:
    c.send(c.continuation(1, c.request_block(), end_headers=True))
    c.expect_connection_error(PROTOCOL)


@case("http2/5.1/5")
def _half_closed_data(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True)
        + c.data_frame(1, b"test", end_stream=True)
    )
    c.expect_stream_error(1, STREAM_CLOSED)


@case("http2/5.1/6")
def _half_closed_headers(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True)
        + c.headers_frame(1, c.request_block(), end_stream=True)
    )
    c.expect_stream_error(1, STREAM_CLOSED)


@case("http2/5.1/7")
def _half_closed_continuation(c: H2Client) -> None:
    block = c.request_block()
    c.send(c.headers_frame(1, block, end_stream=True) + c.continuation(1, block, end_headers=True))
    c.expect_stream_error(1, STREAM_CLOSED, PROTOCOL)


@case("http2/5.1/8")
def _reset_data(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block())
        + rst_stream(1, ErrorCode.CANCEL)
        + c.data_frame(1, b"test", end_stream=True)
    )
    c.expect_stream_error(1, STREAM_CLOSED)


@case("http2/5.1/9")
def _reset_headers(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block())
        + rst_stream(1, ErrorCode.CANCEL)
        + c.headers_frame(1, c.request_block(), end_stream=True)
    )
    c.expect_stream_error(1, STREAM_CLOSED)


@case("http2/5.1/10")
def _reset_continuation(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block())
        + rst_stream(1, ErrorCode.CANCEL)
        + c.continuation(1, _dummy(c), end_headers=True)
    )
    c.expect_stream_error(1, STREAM_CLOSED, PROTOCOL)


@case("http2/5.1/11")
def _closed_data(c: H2Client) -> None:
    _closed_stream(c)
    c.send(c.data_frame(1, b"test", end_stream=True))
    c.expect_stream_error(1, STREAM_CLOSED)


@case("http2/5.1/12")
def _closed_headers(c: H2Client) -> None:
    opened = _closed_stream(c)
    c.send(opened)
    c.expect_connection_error(STREAM_CLOSED)


@case("http2/5.1/13")
def _closed_continuation(c: H2Client) -> None:
    _closed_stream(c)
    c.send(c.continuation(1, _dummy(c), end_headers=True))
    c.expect_connection_error(STREAM_CLOSED, PROTOCOL)


@case("http2/5.1.1/1")
def _even_stream(c: H2Client) -> None:
    c.send(c.headers_frame(2, c.request_block(), end_stream=True))
    c.expect_connection_error(PROTOCOL)


@case("http2/5.1.1/2")
def _lower_stream(c: H2Client) -> None:
    c.send(
        c.headers_frame(5, c.request_block(), end_stream=True)
        + c.headers_frame(3, c.request_block(), end_stream=True)
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/5.1.2/1")
def _over_concurrency(c: H2Client) -> None:
    """MAX_CONCURRENT_STREAMS + 1 calls whose answers the client's window of 0 holds."""
    most = c.settings[Setting.MAX_CONCURRENT_STREAMS]
    c.send(_settings((Setting.INITIAL_WINDOW_SIZE, 0)))
    c.send(b"".join(c.call(1 + 2 * i) for i in range(most + 1)))
    c.expect_stream_error(1 + 2 * most, PROTOCOL, ErrorCode.REFUSED_STREAM)


@case("http2/5.3.1/1")
def _headers_depending_on_itself(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True, priority=priority_payload(1, 255))
    )
    c.expect_stream_error(1, PROTOCOL)


@case("http2/5.3.1/2")
def _priority_depending_on_itself(c: H2Client) -> None:
    c.send(_priority(1, depends_on=1))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/5.4.1/1")
def _invalid_ping_closes(c: H2Client) -> None:
    c.send(b"\x00\x00\x08\x06\x00\x00\x00\x00\x03" + ZEROS)
    c.expect_close()


@case("http2/5.4.1/2")
def _invalid_ping_goaway(c: H2Client) -> None:
    c.send(b"\x00\x00\x08\x06\x00\x00\x00\x00\x03" + ZEROS)
    got = c.expect(Frame.GOAWAY)
    if got.code != PROTOCOL:
        raise Verdict(f"expected GOAWAY PROTOCOL_ERROR; got {got}")


@case("http2/5.5/1")
def _unknown_frame(c: H2Client) -> None:
    c.send(b"\x00\x00\x08\x16\x00\x00\x00\x00\x00" + ZEROS + _ping())
    c.expect_ping_ack(ZEROS)


@case("http2/5.5/2")
def _unknown_frame_inside_block(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True, end_headers=False)
        + b"\x00\x00\x08\x16\x00\x00\x00\x00\x00"
        + ZEROS
    )
    c.expect_connection_error(PROTOCOL)


# ---- http2/6: Frame definitions -----------------------------------------------------------


@case("http2/6.1/1")
def _data_on_stream_0(c: H2Client) -> None:
    c.send(c.data_frame(0, b"test", end_stream=True))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.1/2")
def _data_not_open(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True)
        + c.data_frame(1, b"test", end_stream=True)
    )
    c.expect_stream_error(1, STREAM_CLOSED)


@case("http2/6.1/3")
def _data_bad_padding(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(("content-length", "4")))
        + b"\x00\x00\x05\x00\x09\x00\x00\x00\x01"
        + b"\x06\x54\x65\x73\x74"
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/6.2/1")
def _priority_after_headers_without_end(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_headers=False)
        + _priority(1)
        + c.continuation(1, _dummy(c), end_headers=True)
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/6.2/2")
def _headers_while_headers(c: H2Client) -> None:
    block = c.request_block()
    c.send(
        c.headers_frame(1, block, end_headers=False)
        + c.headers_frame(3, block, end_stream=True)
        + c.continuation(1, _dummy(c), end_headers=True)
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/6.2/3")
def _headers_on_stream_0(c: H2Client) -> None:
    c.send(c.headers_frame(0, c.request_block(), end_stream=True))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.2/4")
def _headers_bad_padding(c: H2Client) -> None:
    block = c.request_block()
    head = bytearray(b"\x00\x00\x00\x01\x0d\x00\x00\x00\x01")
    head[2] = len(block) + 1
    c.send(bytes(head) + bytes([len(block) + 2]) + block)
    c.expect_stream_error(1, PROTOCOL)


@case("http2/6.3/1")
def _priority_on_stream_0(c: H2Client) -> None:
    c.send(_priority(0))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.3/2")
def _priority_of_4_bytes(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True)
        + b"\x00\x00\x04\x02\x00\x00\x00\x00\x01"
        + b"\x80\x00\x00\x01"
    )
    c.expect_stream_error(1, FRAME_SIZE)


@case("http2/6.4/1")
def _rst_stream_on_stream_0(c: H2Client) -> None:
    c.send(rst_stream(0, ErrorCode.CANCEL))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.4/2")
def _rst_stream_idle(c: H2Client) -> None:
    c.send(rst_stream(1, ErrorCode.CANCEL))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.4/3")
def _rst_stream_of_3_bytes(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True)
        + b"\x00\x00\x03\x03\x00\x00\x00\x00\x01"
        + b"\x00\x00\x00"
    )
    c.expect_stream_error(1, FRAME_SIZE)


@case("http2/6.5/1")
def _settings_ack_with_payload(c: H2Client) -> None:
    c.send(b"\x00\x00\x01\x04\x01\x00\x00\x00\x00" + b"\x00")
    c.expect_connection_error(FRAME_SIZE)


@case("http2/6.5/2")
def _settings_on_a_stream(c: H2Client) -> None:
    c.send(b"\x00\x00\x06\x04\x00\x00\x00\x00\x01" + b"\x00\x03\x00\x00\x00\x64")
    c.expect_connection_error(PROTOCOL)


@case("http2/6.5/3")
def _settings_of_odd_length(c: H2Client) -> None:
    c.send(b"\x00\x00\x03\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00")
    c.expect_stream_error(0, PROTOCOL, FRAME_SIZE)


@case("http2/6.5.2/1")
def _enable_push_2(c: H2Client) -> None:
    c.send(_settings((Setting.ENABLE_PUSH, 2)))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.5.2/2")
def _initial_window_too_large(c: H2Client) -> None:
    c.send(_settings((Setting.INITIAL_WINDOW_SIZE, 2**31)))
    c.expect_connection_error(FLOW_CONTROL)


@case("http2/6.5.2/3")
def _max_frame_too_small(c: H2Client) -> None:
    c.send(_settings((Setting.MAX_FRAME_SIZE, 16_383)))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.5.2/4")
def _max_frame_too_large(c: H2Client) -> None:
    c.send(_settings((Setting.MAX_FRAME_SIZE, 2**24)))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.5.2/5")
def _unknown_setting(c: H2Client) -> None:
    c.send(_settings((0xFF, 1)) + _ping())
    c.expect_ping_ack(ZEROS)


@case("http2/6.5.3/1")
def _settings_in_order(c: H2Client) -> None:
    c.send(_settings((Setting.INITIAL_WINDOW_SIZE, 100), (Setting.INITIAL_WINDOW_SIZE, 1)))
    c.expect_settings_ack()
    c.send(c.call(1))
    c.expect_data_length(1, 1)


@case("http2/6.5.3/2")
def _settings_acknowledged(c: H2Client) -> None:
    c.send(_settings((Setting.ENABLE_PUSH, 0)))
    c.expect_settings_ack()


@case("http2/6.7/1")
def _ping_answered(c: H2Client) -> None:
    c.send(_ping(H2SPEC))
    c.expect_ping_ack(H2SPEC)


@case("http2/6.7/2")
def _ping_ack_not_answered(c: H2Client) -> None:
    c.send(_ping(b"invalid\x00", ACK) + _ping(H2SPEC))
    c.expect_ping_ack(H2SPEC)


@case("http2/6.7/3")
def _ping_on_a_stream(c: H2Client) -> None:
    c.send(b"\x00\x00\x08\x06\x00\x00\x00\x00\x01" + ZEROS)
    c.expect_connection_error(PROTOCOL)


@case("http2/6.7/4")
def _ping_of_6_bytes(c: H2Client) -> None:
    c.send(b"\x00\x00\x06\x06\x00\x00\x00\x00\x00" + b"\x00" * 6)
    c.expect_connection_error(FRAME_SIZE)


@case("http2/6.8/1")
def _goaway_on_a_stream(c: H2Client) -> None:
    c.send(b"\x00\x00\x08\x07\x00\x00\x00\x00\x01" + ZEROS)
    c.expect_connection_error(PROTOCOL)


@case("http2/6.9/1")
def _window_update_of_0(c: H2Client) -> None:
    c.send(window_update(0, 0))
    c.expect_connection_error(PROTOCOL)


@case("http2/6.9/2")
def _window_update_of_0_on_a_stream(c: H2Client) -> None:
    c.send(c.headers_frame(1, c.request_block()) + window_update(1, 0))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/6.9/3")
def _window_update_of_3_bytes(c: H2Client) -> None:
    c.send(b"\x00\x00\x03\x08\x00\x00\x00\x00\x00" + b"\x00\x00\x01")
    c.expect_connection_error(FRAME_SIZE)


@case("http2/6.9.1/1")
def _window_of_1(c: H2Client) -> None:
    c.send(_settings((Setting.INITIAL_WINDOW_SIZE, 1)))
    c.expect_settings_ack()
    c.send(c.call(1))
    c.expect_data_length(1, 1)


@case("http2/6.9.1/2")
def _connection_window_overflow(c: H2Client) -> None:
    c.send(window_update(0, 2**31 - 1) + window_update(0, 2**31 - 1))
    got = c.expect(Frame.GOAWAY)
    if got.code != FLOW_CONTROL:
        raise Verdict(f"expected GOAWAY FLOW_CONTROL_ERROR; got {got}")


@case("http2/6.9.1/3")
def _stream_window_overflow(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block())
        + window_update(1, 2**31 - 1)
        + window_update(1, 2**31 - 1)
    )
    got = c.expect(Frame.RST_STREAM, 1)
    if got.code != FLOW_CONTROL:
        raise Verdict(f"expected RST_STREAM FLOW_CONTROL_ERROR; got {got}")


@case("http2/6.9.2/1")
def _initial_window_changed(c: H2Client) -> None:
    c.send(_settings((Setting.INITIAL_WINDOW_SIZE, 0)))
    c.expect_settings_ack()
    c.send(c.call(1) + _settings((Setting.INITIAL_WINDOW_SIZE, 1)))
    c.expect_data_length(1, 1)


@case("http2/6.9.2/2")
def _negative_window(c: H2Client) -> None:
    c.send(_settings((Setting.INITIAL_WINDOW_SIZE, 3)))
    c.expect_settings_ack()
    c.send(c.call(1))
    c.expect(Frame.DATA, 1)
    c.send(_settings((Setting.INITIAL_WINDOW_SIZE, 2)))
    c.expect_settings_ack()
    c.send(window_update(1, 2))
    c.expect_data_length(1, 1)


@case("http2/6.9.2/3")
def _initial_window_over_max(c: H2Client) -> None:
    c.send(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x04\x80\x00\x00\x00")
    c.expect_connection_error(FLOW_CONTROL)


@case("http2/6.10/1")
def _continuations(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_headers=False)
        + c.continuation(1, _dummy(c), end_headers=False)
        + c.continuation(1, _dummy(c), end_headers=True)
        + c.data_frame(1, EMPTY_MESSAGE, end_stream=True)
    )
    c.expect_ok(1)


@case("http2/6.10/2")
def _continuation_then_data(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_headers=False)
        + c.continuation(1, _dummy(c), end_headers=False)
        + c.data_frame(1, b"test", end_stream=True)
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/6.10/3")
def _continuation_on_stream_0(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True, end_headers=False)
        + c.continuation(0, _dummy(c), end_headers=True)
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/6.10/4")
def _continuation_after_end_headers(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True)
        + c.continuation(1, _dummy(c), end_headers=True)
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/6.10/5")
def _continuation_after_ended_continuation(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True, end_headers=False)
        + c.continuation(1, _dummy(c), end_headers=True)
        + c.continuation(1, _dummy(c), end_headers=True)
    )
    c.expect_connection_error(PROTOCOL)


@case("http2/6.10/6")
def _continuation_after_data(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_headers=False)
        + c.data_frame(1, b"test", end_stream=True)
        + c.continuation(1, _dummy(c), end_headers=False)
        + c.continuation(0, _dummy(c), end_headers=True)
    )
    c.expect_connection_error(PROTOCOL)


# ---- http2/7: Error codes -----------------------------------------------------------------


@case("http2/7/1")
def _goaway_unknown_code(c: H2Client) -> None:
    c.send(goaway(0, 0xFF) + _ping(H2SPEC))
    c.expect_ping_ack(H2SPEC, or_close=True)


@case("http2/7/2")
def _rst_stream_unknown_code(c: H2Client) -> None:
    c.send(c.headers_frame(1, c.request_block()) + rst_stream(1, 0xFF) + _ping())
    c.expect_ping_ack(ZEROS, or_close=True)


# ---- http2/8: HTTP message exchanges ------------------------------------------------------


@case("http2/8.1/1")
def _second_headers_without_end(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block())
        + c.data_frame(1, b"test")
        + c.headers_frame(1, c.block([("x-test", "ok")]))
    )
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2/1")
def _uppercase_name(c: H2Client) -> None:
    c.send(c.headers_frame(1, c.request_block(("X-TEST", "ok")), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.1/1")
def _unknown_pseudo(c: H2Client) -> None:
    c.send(c.headers_frame(1, _pseudo(c, (":test", "ok")), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.1/2")
def _response_pseudo(c: H2Client) -> None:
    c.send(c.headers_frame(1, _pseudo(c, (":status", "200")), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.1/3")
def _pseudo_in_trailers(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block())
        + c.data_frame(1, b"test")
        + c.headers_frame(1, c.block([(":method", "POST")]))
    )
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.1/4")
def _pseudo_after_regular(c: H2Client) -> None:
    block = c.block([("x-test", "ok"), *grpc_headers(c.authority)])
    c.send(c.headers_frame(1, block, end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.2/1")
def _connection_field(c: H2Client) -> None:
    c.send(c.headers_frame(1, c.request_block(("connection", "keep-alive")), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.2/2")
def _te_not_trailers(c: H2Client) -> None:
    fields = [f for f in grpc_headers(c.authority) if f[0] != "te"]
    block = c.block([*fields, ("trailers", "test"), ("te", "trailers, deflate")])
    c.send(c.headers_frame(1, block, end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.3/1")
def _empty_path(c: H2Client) -> None:
    fields = [(n, "" if n == ":path" else v) for n, v in grpc_headers(c.authority)]
    c.send(c.headers_frame(1, c.block(fields), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.3/2")
def _no_method(c: H2Client) -> None:
    c.send(c.headers_frame(1, _pseudo(c, drop=":method"), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.3/3")
def _no_scheme(c: H2Client) -> None:
    c.send(c.headers_frame(1, _pseudo(c, drop=":scheme"), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.3/4")
def _no_path(c: H2Client) -> None:
    c.send(c.headers_frame(1, _pseudo(c, drop=":path"), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.3/5")
def _two_methods(c: H2Client) -> None:
    c.send(c.headers_frame(1, _pseudo(c, (":method", "POST")), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.3/6")
def _two_schemes(c: H2Client) -> None:
    c.send(c.headers_frame(1, _pseudo(c, (":scheme", "http")), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.3/7")
def _two_paths(c: H2Client) -> None:
    c.send(c.headers_frame(1, _pseudo(c, (":path", SERVER_LIVE)), end_stream=True))
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.6/1")
def _content_length_not_data(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(("content-length", "1")))
        + c.data_frame(1, b"test", end_stream=True)
    )
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.1.2.6/2")
def _content_length_not_datas(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(("content-length", "1")))
        + c.data_frame(1, b"test")
        + c.data_frame(1, b"test", end_stream=True)
    )
    c.expect_stream_error(1, PROTOCOL)


@case("http2/8.2/1")
def _push_promise(c: H2Client) -> None:
    payload = struct.pack(">I", 3) + c.request_block()
    c.send(frame(Frame.PUSH_PROMISE, END_HEADERS, 1, payload))
    c.expect_connection_error(PROTOCOL)


# ---- generic: frames a server must accept ---------------------------------------------------


@case("generic/1/1", handshake=False)
def _generic_preface(c: H2Client) -> None:
    c.send(PREFACE + _settings((Setting.INITIAL_WINDOW_SIZE, 65_535)))
    first = c.read(time.monotonic() + c.timeout)
    if first is None or first.kind != Frame.SETTINGS or first.flags & ACK:
        raise Verdict(f"expected SETTINGS (flags 0) first; got {first}")


@case("generic/2/1")
def _priority_idle(c: H2Client) -> None:
    c.send(_priority(1) + _ping())
    c.expect_ping_ack(ZEROS)


@case("generic/2/2")
def _window_update_half_closed(c: H2Client) -> None:
    c.send(_settings((Setting.INITIAL_WINDOW_SIZE, 0)) + c.call(1) + window_update(1, 1))
    c.expect(Frame.DATA, 1)


@case("generic/2/3")
def _priority_half_closed(c: H2Client) -> None:
    c.send(
        _settings((Setting.INITIAL_WINDOW_SIZE, 0)) + c.call(1) + _priority(1) + window_update(1, 1)
    )
    c.expect(Frame.DATA, 1)


@case("generic/2/4")
def _rst_stream_half_closed(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(), end_stream=True)
        + rst_stream(1, ErrorCode.CANCEL)
        + _ping()
    )
    c.expect_ping_ack(ZEROS, or_close=True)


@case("generic/2/5")
def _priority_closed(c: H2Client) -> None:
    _closed_stream(c)
    c.send(_priority(1) + _ping())
    c.expect_ping_ack(ZEROS)


@case("generic/3.1/1")
def _data(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block()))


@case("generic/3.1/2")
def _datas(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block())
        + c.data_frame(1, EMPTY_MESSAGE[:2])
        + c.data_frame(1, EMPTY_MESSAGE[2:], end_stream=True)
    )
    c.expect_ok(1)


@case("generic/3.1/3")
def _data_padded(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block())
        + c.data_frame(1, EMPTY_MESSAGE, end_stream=True, padding=5)
    )
    c.expect_ok(1)


@case("generic/3.2/1")
def _headers(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block()))


@case("generic/3.2/2")
def _headers_padded(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block(), padding=8))


@case("generic/3.2/3")
def _headers_priority(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block(), priority=priority_payload(0, 255)))


@case("generic/3.3/1")
def _priority_weight_1(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block()), _priority(1, weight=0))


@case("generic/3.3/2")
def _priority_weight_256(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block()), _priority(1, weight=255))


@case("generic/3.3/3")
def _priority_dependency(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block()), _priority(3, depends_on=1, weight=0))


@case("generic/3.3/4")
def _priority_exclusive(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block()), _priority(1, weight=0, exclusive=True))


@case("generic/3.3/5")
def _priority_idle_then_lower(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block()), _priority(3))


@case("generic/3.4/1")
def _rst_stream(c: H2Client) -> None:
    c.send(c.headers_frame(1, c.request_block()) + rst_stream(1, ErrorCode.CANCEL) + _ping())
    c.expect_ping_ack(ZEROS, or_close=True)


@case("generic/3.5/1")
def _settings_all(c: H2Client) -> None:
    c.send(
        _settings(
            (Setting.HEADER_TABLE_SIZE, 4096),
            (Setting.ENABLE_PUSH, 1),
            (Setting.MAX_CONCURRENT_STREAMS, 100),
            (Setting.INITIAL_WINDOW_SIZE, 65_535),
            (Setting.MAX_FRAME_SIZE, 16_384),
            (Setting.MAX_HEADER_LIST_SIZE, 100),
        )
    )
    c.expect_settings_ack()


@case("generic/3.7/1")
def _generic_ping(c: H2Client) -> None:
    c.send(_ping(H2SPEC))
    c.expect_ping_ack(H2SPEC)


@case("generic/3.8/1")
def _goaway(c: H2Client) -> None:
    c.send(goaway(0, ErrorCode.NO_ERROR, "h2spec") + _ping(H2SPEC))
    c.expect_ping_ack(H2SPEC, or_close=True)


@case("generic/3.9/1")
def _window_update_connection(c: H2Client) -> None:
    c.send(window_update(0, 1) + _ping())
    c.expect_ping_ack(ZEROS)


@case("generic/3.9/2")
def _window_update_stream(c: H2Client) -> None:
    c.send(c.call(1) + window_update(1, 1))
    c.expect_ok(1)


@case("generic/3.10/1")
def _continuation(c: H2Client) -> None:
    block = c.request_block()
    c.send(
        c.headers_frame(1, block[:5], end_headers=False)
        + c.continuation(1, block[5:], end_headers=True)
        + c.data_frame(1, EMPTY_MESSAGE, end_stream=True)
    )
    c.expect_ok(1)


@case("generic/3.10/2")
def _continuations_split(c: H2Client) -> None:
    block = c.request_block()
    c.send(
        c.headers_frame(1, block[:5], end_headers=False)
        + c.continuation(1, block[5:10], end_headers=False)
        + c.continuation(1, block[10:], end_headers=True)
        + c.data_frame(1, EMPTY_MESSAGE, end_stream=True)
    )
    c.expect_ok(1)


def _request_of(c: H2Client, method: str) -> bytes:
    """h2spec's ``CommonHeaders`` request with ``method``: not gRPC, so the REST app
    answers it (OIP REST over HTTP/2, ``front.http.h2_asgi``)."""
    fields = [(":method", method), (":scheme", "http"), (":path", "/"), (":authority", c.authority)]
    return c.headers_frame(1, c.block(fields), end_stream=True)


@case("generic/4/1")
def _get(c: H2Client) -> None:
    c.send(_request_of(c, "GET"))
    c.expect_headers(1)


@case("generic/4/2")
def _head(c: H2Client) -> None:
    c.send(_request_of(c, "HEAD"))
    c.expect_headers(1)


@case("generic/4/3")
def _post(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, c.request_block()))


@case("generic/4/4")
def _post_with_trailers(c: H2Client) -> None:
    c.send(
        c.headers_frame(1, c.request_block(("trailer", "x-test")))
        + c.data_frame(1, EMPTY_MESSAGE)
        + c.headers_frame(1, c.block([("x-test", "ok")]), end_stream=True)
    )
    c.expect_ok(1)


#: generic/5: HPACK representations h2spec appends to a request's block (its bytes).
_REPRESENTATIONS = {
    "generic/5/1": b"\xba",
    "generic/5/2": b"\x40\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    "generic/5/3": b"\x40\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    "generic/5/4": b"\x40\x06\x78\x2d\x74\x65\x73\x74\x06\x68\x32\x73\x70\x65\x63",
    "generic/5/5": b"\x40\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    "generic/5/6": b"\x00\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    "generic/5/7": b"\x00\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    "generic/5/8": b"\x00\x06\x78\x2d\x74\x65\x73\x74\x06\x68\x32\x73\x70\x65\x63",
    "generic/5/9": b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    "generic/5/10": b"\x10\x0a\x75\x73\x65\x72\x2d\x61\x67\x65\x6e\x74\x06\x68\x32\x73\x70\x65\x63",
    "generic/5/11": b"\x10\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4",
    "generic/5/12": b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    "generic/5/13": b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
}


def _representation(rep: bytes) -> Case:
    def run(c: H2Client) -> None:
        _answered(c, 1, c.headers_frame(1, c.request_block() + rep))

    return run


for _name, _rep in _REPRESENTATIONS.items():
    case(_name)(_representation(_rep))


@case("generic/5/14")
def _table_size_update(c: H2Client) -> None:
    c.encoder.header_table_size = 128
    _answered(c, 1, c.headers_frame(1, c.request_block()))


@case("generic/5/15")
def _table_size_updates(c: H2Client) -> None:
    _answered(c, 1, c.headers_frame(1, b"\x3f\x61\x3f\xe1\x1f" + c.request_block()))


# ---- hpack: decoding errors are connection errors (COMPRESSION_ERROR) ------------------------


#: (id, bytes before the request's block, bytes after it).
_DECODING_ERRORS = {
    "hpack/2.3.3/1": (b"", b"\xc6"),  # an indexed field of index 70
    "hpack/2.3.3/2": (b"", b"\x7f\x07\x00"),  # a literal's name of index 70
    "hpack/4.2/1": (b"", b"\x21"),  # a table size update at the block's end
    "hpack/5.2/1": (b"", b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x49\x50\x9f\xff"),  # padding > 7 bits
    "hpack/5.2/2": (b"", b"\x00\x85\xf2\xb2\x4a\x84\xff\x83\x49\x50\x90"),  # padded by zeros
    "hpack/5.2/3": (b"", b"\x00\x85\xf2\xb2\x4a\x84\xff\x87\x49\x51\xff\xff\xff\xfa\x7f"),  # EOS
    "hpack/6.1/1": (b"", b"\x80"),  # an indexed field of index 0
    "hpack/6.3/1": (b"\x3f\xe2\x1f", b""),  # a table size of 4097, past SETTINGS' 4096
}


def _decoding_error(before: bytes, after: bytes) -> Case:
    def run(c: H2Client) -> None:
        block = before + c.request_block() + after
        c.send(c.headers_frame(1, block, end_stream=True))
        c.expect_connection_error(COMPRESSION)

    return run


for _name, (_before, _after) in _DECODING_ERRORS.items():
    case(_name)(_decoding_error(_before, _after))


# ---- the tests -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    proc = ServerProcess().wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


@pytest.mark.parametrize("name", list(CASES))
def test_h2spec(srv: ServerProcess, name: str) -> None:
    run, handshake = CASES[name]
    with H2Client(srv.grpc_port) as client:
        if handshake:
            client.handshake()
        run(client)


def test_the_count_in_the_docstring_holds() -> None:
    """The module's docstring says how many cases apply; this keeps it true."""
    assert f"Applicable: {len(CASES)} of {len(CASES) + len(NOT_APPLICABLE)}" in (__doc__ or "")
    assert not set(CASES) & set(NOT_APPLICABLE)
