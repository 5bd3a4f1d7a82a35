"""An HTTP/2 client of raw frames over a real socket, judging the server's answers the way
h2spec (summerwind/h2spec) does: a connection error is a GOAWAY with an expected code or
the connection closing; a stream error is a RST_STREAM or GOAWAY with an expected code,
or the connection closing; an expected frame is waited for, other frames passed over.

Stricter than h2spec in one way: a GOAWAY (or, for a stream error, a RST_STREAM on the
stream in question) carrying a code other than the expected ones fails at once, where
h2spec goes on waiting and passes if the connection then closes.

``tests.support.grpc_peer`` drives a ``Connection`` in memory; this drives a server
process through its port, as an outside client would.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import hpack

from oipserve.front.grpc.h2.frames import (
    ACK,
    END_HEADERS,
    END_STREAM,
    HEADER,
    PADDED,
    PREFACE,
    PRIORITY_FLAG,
    ErrorCode,
    Frame,
    Setting,
    frame,
    settings_frame,
)
from tests.support.grpc_peer import FakeTransport

#: Seconds an expected frame is waited for (h2spec waits 2; the CI box is noisy).
TIMEOUT = 5.0
#: A valid gRPC call with no metadata of its own: ServerLive, whose request message is
#: empty and whose answer carries a message (a DATA frame of 7 bytes).
SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"
#: An empty gRPC message: its prefix alone (uncompressed, length 0).
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
#: h2spec's own SETTINGS in its handshake: INITIAL_WINDOW_SIZE at its default.
_HANDSHAKE_SETTINGS = {Setting.INITIAL_WINDOW_SIZE: 65_535}


class Received(NamedTuple):
    """One frame from the server."""

    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def code(self) -> int:
        """The error code of a RST_STREAM or GOAWAY."""
        offset = 4 if self.kind == Frame.GOAWAY else 0
        return int(struct.unpack_from(">I", self.payload, offset)[0])

    def __repr__(self) -> str:
        try:
            name = Frame(self.kind).name
        except ValueError:
            name = f"type {self.kind}"
        extra = ""
        if self.kind in (Frame.RST_STREAM, Frame.GOAWAY) and len(self.payload) >= 4:
            try:
                extra = f", {ErrorCode(self.code).name}"
            except ValueError:
                extra = f", code {self.code}"
        return f"{name}(flags={self.flags:#x}, stream={self.stream}, {len(self.payload)} B{extra})"


class Verdict(AssertionError):
    """The server did not answer as the case expects."""


def settings_payload(values: Iterable[tuple[int, int]]) -> bytes:
    """A SETTINGS payload of ``(id, value)`` pairs, in order (repeats and unknown ids
    allowed, as a test may need)."""
    return b"".join(struct.pack(">HI", key, value) for key, value in values)


def priority_payload(depends_on: int, weight: int, exclusive: bool = False) -> bytes:
    """A PRIORITY frame's payload (RFC 9113, 6.3); ``weight`` as on the wire (0-255)."""
    return struct.pack(">IB", depends_on | (0x80000000 if exclusive else 0), weight)


def grpc_headers(authority: str, path: str = SERVER_LIVE) -> list[tuple[str, str]]:
    """A well-formed gRPC request's header list."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


class H2Client:
    """One raw HTTP/2 connection to a server (``handshake`` opens it as h2spec does)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = TIMEOUT) -> None:
        self.timeout = timeout
        self.authority = f"{host}:{port}"
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.encoder = hpack.Encoder()
        self._buffer = bytearray()
        #: The server's SETTINGS, as its handshake frame said them.
        self.settings: dict[int, int] = {}
        self.closed = False

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    # ---- sending ------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def handshake(self) -> None:
        """The preface and SETTINGS; then wait for the server's SETTINGS (acknowledged)
        and its ACK of ours, frames between passed over (h2spec's handshake)."""
        self.send(PREFACE + self.settings_frame(_HANDSHAKE_SETTINGS.items()))
        theirs = ours = False
        deadline = time.monotonic() + self.timeout
        while not (theirs and ours):
            got = self.read(deadline)
            if got is None:
                raise Verdict("the handshake did not finish: the connection closed")
            if got.kind != Frame.SETTINGS:
                continue
            if got.flags & ACK:
                ours = True
            else:
                theirs = True
                for offset in range(0, len(got.payload), 6):
                    key, value = struct.unpack_from(">HI", got.payload, offset)
                    self.settings[key] = value
                self.send(frame(Frame.SETTINGS, ACK, 0))

    def open_windows(self) -> None:
        """Let the server send without waiting for WINDOW_UPDATEs: every stream's window
        and the connection's at their largest (this client reads everything it is sent,
        but gives nothing back)."""
        top = 2**31 - 1
        self.send(
            self.settings_frame([(Setting.INITIAL_WINDOW_SIZE, top)])
            + frame(Frame.WINDOW_UPDATE, 0, 0, struct.pack(">I", top - 65_535))
        )

    @staticmethod
    def settings_frame(values: Iterable[tuple[int, int]], stream: int = 0) -> bytes:
        return frame(Frame.SETTINGS, 0, stream, settings_payload(values))

    def block(self, headers: Sequence[tuple[str, str]], huffman: bool = True) -> bytes:
        """``headers`` encoded with this connection's HPACK context."""
        return bytes(self.encoder.encode(list(headers), huffman=huffman))

    def request_block(self, *extra: tuple[str, str]) -> bytes:
        """A gRPC ServerLive request's header block, with ``extra`` fields after it."""
        return self.block([*grpc_headers(self.authority), *extra])

    @staticmethod
    def headers_frame(
        stream: int,
        block: bytes,
        *,
        end_stream: bool = False,
        end_headers: bool = True,
        padding: int | None = None,
        priority: bytes | None = None,
    ) -> bytes:
        """A HEADERS frame; ``padding`` bytes of zeros (PADDED) and a ``priority``
        payload (PRIORITY) as asked."""
        flags = (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0)
        payload = block
        if priority is not None:
            flags |= PRIORITY_FLAG
            payload = priority + payload
        if padding is not None:
            flags |= PADDED
            payload = bytes([padding]) + payload + b"\x00" * padding
        return frame(Frame.HEADERS, flags, stream, payload)

    @staticmethod
    def data_frame(
        stream: int, data: bytes, *, end_stream: bool = False, padding: int | None = None
    ) -> bytes:
        flags = END_STREAM if end_stream else 0
        if padding is not None:
            flags |= PADDED
            data = bytes([padding]) + data + b"\x00" * padding
        return frame(Frame.DATA, flags, stream, data)

    @staticmethod
    def continuation(stream: int, block: bytes, *, end_headers: bool) -> bytes:
        return frame(Frame.CONTINUATION, END_HEADERS if end_headers else 0, stream, block)

    def call(self, stream: int) -> bytes:
        """A whole ServerLive call: HEADERS, then its (empty) message ending the stream."""
        return self.headers_frame(stream, self.request_block()) + self.data_frame(
            stream, EMPTY_MESSAGE, end_stream=True
        )

    # ---- receiving ----------------------------------------------------------------

    def read(self, deadline: float) -> Received | None:
        """The next frame; None once the connection closed. Verdict past ``deadline``."""
        while True:
            if len(self._buffer) >= HEADER.size:
                high, low, kind, flags, stream = HEADER.unpack_from(self._buffer)
                length = (high << 8) | low
                if len(self._buffer) >= HEADER.size + length:
                    payload = bytes(self._buffer[HEADER.size : HEADER.size + length])
                    del self._buffer[: HEADER.size + length]
                    return Received(kind, flags, stream & 0x7FFFFFFF, payload)
            if self.closed:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise Verdict("timed out waiting for the server")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise Verdict("timed out waiting for the server") from None
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                self.closed = True
            self._buffer += chunk

    def frames(self) -> Iterable[Received | None]:
        """Frames as they come, then one None if the connection closes; Verdict when
        ``timeout`` passes first."""
        deadline = time.monotonic() + self.timeout
        while True:
            got = self.read(deadline)
            yield got
            if got is None:
                return

    # ---- verdicts, as h2spec's ----------------------------------------------------

    def expect_connection_error(self, *codes: ErrorCode) -> None:
        """A GOAWAY with one of ``codes``, or the connection closing."""
        seen = []
        try:
            for got in self.frames():
                if got is None:
                    return
                seen.append(got)
                if got.kind == Frame.GOAWAY:
                    if got.code in codes:
                        return
                    raise Verdict(f"expected GOAWAY {_names(codes)}; got {seen}")
        except Verdict as exc:
            raise Verdict(f"expected GOAWAY {_names(codes)} or a close; {exc}: {seen}") from None

    def expect_stream_error(self, stream: int, *codes: ErrorCode) -> None:
        """RST_STREAM on ``stream`` or GOAWAY with one of ``codes``, or the connection
        closing."""
        seen = []
        try:
            for got in self.frames():
                if got is None:
                    return
                seen.append(got)
                if got.kind == Frame.GOAWAY or (
                    got.kind == Frame.RST_STREAM and got.stream == stream
                ):
                    if got.code in codes:
                        return
                    raise Verdict(f"expected {_names(codes)}; got {seen}")
        except Verdict as exc:
            raise Verdict(
                f"expected RST_STREAM or GOAWAY {_names(codes)} or a close; {exc}: {seen}"
            ) from None

    def expect_close(self) -> None:
        """The connection closes (a GOAWAY before it allowed)."""
        seen = []
        try:
            for got in self.frames():
                if got is None:
                    return
                seen.append(got)
        except Verdict as exc:
            raise Verdict(f"expected the connection to close; {exc}: {seen}") from None

    def expect(self, kind: Frame, stream: int | None = None) -> Received:
        """The next frame of ``kind`` (on ``stream``, if given); others passed over."""
        seen = []
        try:
            for got in self.frames():
                if got is None:
                    raise Verdict("the connection closed")
                seen.append(got)
                if got.kind == kind and (stream is None or got.stream == stream):
                    return got
        except Verdict as exc:
            raise Verdict(f"expected {kind.name} on stream {stream}; {exc}: {seen}") from None
        raise AssertionError("unreachable")

    def expect_headers(self, stream: int) -> Received:
        """The server answers ``stream`` (h2spec's VerifyHeadersFrame)."""
        return self.expect(Frame.HEADERS, stream)

    def expect_answer(self, stream: int) -> dict[str, str]:
        """The server's last header block on ``stream`` (its trailers, or Trailers-Only),
        decoded: a gRPC call's answer, ``grpc-status`` in it."""
        while True:
            got = self.expect_headers(stream)
            if got.flags & END_STREAM:
                break
        block = got.payload
        if got.flags & PADDED:
            block = block[1 : len(block) - block[0]]
        if got.flags & PRIORITY_FLAG:
            block = block[5:]
        return {str(name): str(value) for name, value in hpack.Decoder().decode(block)}

    def expect_messages(self, stream: int) -> tuple[list[bytes], dict[str, str]]:
        """The gRPC messages the server sends on ``stream`` until its trailers, and those
        trailers, decoded (what passes on other streams is passed over)."""
        body = bytearray()
        while True:
            got = self.expect_any(stream)
            if got.kind == Frame.DATA:
                body += got.payload
            elif got.flags & END_STREAM:
                break
        messages = []
        while body:
            (length,) = struct.unpack_from(">I", body, 1)
            messages.append(bytes(body[5 : 5 + length]))
            del body[: 5 + length]
        trailers = {str(k): str(v) for k, v in hpack.Decoder().decode(got.payload)}
        return messages, trailers

    def expect_any(self, stream: int) -> Received:
        """The next DATA or HEADERS frame on ``stream``."""
        return self._first_on(
            stream,
            lambda got: got.kind in (Frame.DATA, Frame.HEADERS),
            f"expected DATA or HEADERS on stream {stream}",
        )

    def _first_on(self, stream: int, wanted: Callable[[Received], bool], what: str) -> Received:
        """The first frame on ``stream`` that is ``wanted``; Verdict ``what`` (with the
        frames seen) when the connection closes or a frame breaks the rules first."""
        seen = []
        try:
            for got in self.frames():
                if got is None:
                    raise Verdict("the connection closed")
                seen.append(got)
                if got.stream == stream and wanted(got):
                    return got
        except Verdict as exc:
            raise Verdict(f"{what}; {exc}: {seen}") from None
        raise AssertionError("unreachable")

    def expect_ok(self, stream: int) -> None:
        """The call on ``stream`` was served: grpc-status 0."""
        answer = self.expect_answer(stream)
        if answer.get("grpc-status") != "0":
            raise Verdict(f"expected grpc-status 0 on stream {stream}; got {answer}")

    def expect_stream_closed(self, stream: int) -> None:
        """The server ends ``stream``: a frame with END_STREAM, or RST_STREAM NO_ERROR."""
        self._first_on(stream, _ends_stream, f"expected stream {stream} to end")

    def expect_settings_ack(self) -> None:
        got = self.expect(Frame.SETTINGS)
        if not got.flags & ACK or got.payload:
            raise Verdict(f"expected an empty SETTINGS ACK; got {got}")

    def expect_ping_ack(self, data: bytes, or_close: bool = False) -> None:
        """A PING ACK echoing ``data`` (the first PING from the server must be it); with
        ``or_close``, the connection closing passes too."""
        seen = []
        try:
            for got in self.frames():
                if got is None:
                    if or_close:
                        return
                    raise Verdict("the connection closed")
                seen.append(got)
                if got.kind == Frame.PING:
                    if got.flags & ACK and got.payload == data:
                        return
                    raise Verdict(f"expected PING ACK {data!r}; got {got} {got.payload!r}")
        except Verdict as exc:
            raise Verdict(f"expected PING ACK {data!r}; {exc}: {seen}") from None

    def expect_data_length(self, stream: int, length: int) -> None:
        """The next DATA frame on ``stream`` carries ``length`` bytes."""
        got = self.expect(Frame.DATA, stream)
        if len(got.payload) != length:
            raise Verdict(f"expected DATA of {length} bytes; got {got}")


def _names(codes: Iterable[int]) -> str:
    return "/".join(ErrorCode(code).name for code in codes)


def open_h2c(port: int, stream_open: bool = False) -> socket.socket:
    """A raw HTTP/2 client past its preface on ``port``; with ``stream_open``, a
    ModelStreamInfer call left open (HEADERS only), so the connection is in use, not idle."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = PREFACE + settings_frame({})
    if stream_open:
        block = hpack.Encoder().encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
                ("content-type", "application/grpc"),
            ]
        )
        data += frame(Frame.HEADERS, END_HEADERS, 1, block)
    sock.sendall(data)
    return sock


def frames_until_closed(sock: socket.socket, within: float) -> list[tuple[int, int, int, bytes]]:
    """The frames the server sent before it closed ``sock``; fails if it stays open."""
    sock.settimeout(within)
    got = FakeTransport()
    try:
        while chunk := sock.recv(65536):
            got.written += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {within} s") from None
    return got.frames()


def goaway_codes(frames: list[tuple[int, int, int, bytes]]) -> list[ErrorCode]:
    """The error codes of the GOAWAY frames among ``frames``."""
    return [
        ErrorCode(struct.unpack(">II", payload[:8])[1])
        for kind, _flags, _stream, payload in frames
        if kind == Frame.GOAWAY
    ]


def _ends_stream(got: Received) -> bool:
    if got.kind in (Frame.HEADERS, Frame.DATA):
        return bool(got.flags & END_STREAM)
    return got.kind == Frame.RST_STREAM and got.code == ErrorCode.NO_ERROR
