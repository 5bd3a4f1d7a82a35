"""Randomised HTTP/2 frames at the gRPC port: whatever a client sends, the server answers
with a status, resets the stream or closes the connection; it logs no traceback and keeps
serving.

Each connection sends the preface and a random run of frames: gRPC call headers (some
broken: missing or odd pseudo-headers, timeouts, encodings), DATA with gRPC messages
(valid prefixes over random bodies, lengths that lie, cuts across frames, DATA after
END_STREAM), CONTINUATION, padding and priority fields, SETTINGS, WINDOW_UPDATE, PING,
RST_STREAM, GOAWAY, PUSH_PROMISE and unknown types with random payloads, and frame
headers that promise more than is sent. Found so far: an undecodable message answered
INTERNAL with a traceback, and DATA after END_STREAM failing the call's run in the log.
"""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Iterator

import grpc
import hpack
import numpy as np
import tritonclient.grpc as grpcclient

from oipserve.front.grpc.h2.frames import END_HEADERS, END_STREAM, PADDED, PRIORITY_FLAG, Frame
from tests.support.server import ServerProcess
from tests.support.tensors import simple_inputs

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SERVICE = "/inference.GRPCInferenceService/"
PATHS = [
    SERVICE + "ModelInfer",
    SERVICE + "ServerLive",
    SERVICE + "ModelMetadata",
    SERVICE + "ModelStreamInfer",
    SERVICE + "RepositoryModelLoad",
    "/x/y",
    "",
]
#: What the server's log must not say, whatever it was sent.
FAILURES = ("Traceback", "unexpected error", "Task exception was never retrieved")


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def header_block(rng: random.Random, encoder: hpack.Encoder) -> bytes:
    headers = [
        (":method", rng.choice(["POST", "POST", "POST", "GET"])),
        (":scheme", "http"),
        (":path", rng.choice(PATHS)),
        (":authority", "fuzz"),
        ("content-type", rng.choice(["application/grpc", "application/grpc+proto", "text/plain"])),
        ("te", "trailers"),
    ]
    if rng.random() < 0.3:
        headers.append(("grpc-encoding", rng.choice(["gzip", "deflate", "identity", "zstd", ""])))
    if rng.random() < 0.3:
        headers.append(("grpc-timeout", rng.choice(["1S", "10m", "0n", "x", "99999999H", ""])))
    if rng.random() < 0.1:
        headers = headers[rng.randrange(len(headers)) :]
    if rng.random() < 0.1:
        headers.append((rng.choice([":path", ":method", "connection", ":status"]), "v"))
    if rng.random() < 0.1:
        rng.shuffle(headers)
    return encoder.encode(headers)


def grpc_message(rng: random.Random) -> bytes:
    size = rng.choice([0, 1, 5, 20, 100, 70_000])
    body = rng.randbytes(size)
    if rng.random() < 0.5:  # starts as a ModelInferRequest for 'simple' would
        body = b"\x0a\x06simple" + body[: rng.randrange(40)]
    compressed = rng.choice([0, 0, 0, 1, 2])
    length = len(body) if rng.random() < 0.8 else rng.randrange(2**32)
    return bytes([compressed]) + struct.pack(">I", length) + body


def well_formed_calls(rng: random.Random, encoder: hpack.Encoder) -> Iterator[bytes]:
    """Calls on streams 1, 3, ...: right headers, a random message, sometimes DATA after
    the client's END_STREAM. Sent first, before frames that may end the connection."""
    for stream in range(1, 2 * rng.randrange(1, 4), 2):
        method = rng.choice(["ModelInfer", "ServerLive", "ModelMetadata", "ModelStreamInfer"])
        headers = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method)]
        headers += [(":authority", "fuzz"), ("content-type", "application/grpc")]
        yield frame(Frame.HEADERS, END_HEADERS, stream, encoder.encode(headers))
        body = rng.randbytes(rng.choice([0, 3, 20, 70_000]))
        yield frame(Frame.DATA, END_STREAM, stream, struct.pack(">BI", 0, len(body)) + body)
        if rng.random() < 0.3:
            yield frame(Frame.DATA, rng.choice([0, END_STREAM]), stream, rng.randbytes(8))


def random_frames(rng: random.Random, encoder: hpack.Encoder) -> Iterator[bytes]:
    stream = 7

    def near() -> int:  # mostly this stream; sometimes 0, an even id or one not opened
        return rng.choice([stream, stream, stream, 0, 2, stream + 2, 2**31 - 1])

    for _ in range(rng.randrange(1, 12)):
        pick = rng.random()
        if pick < 0.3:  # HEADERS: padded, with a priority field, continued, or not ended
            block = header_block(rng, encoder)
            flags = rng.choice(
                [END_HEADERS, END_HEADERS | END_STREAM, 0, END_STREAM]
                + [END_HEADERS | PRIORITY_FLAG, END_HEADERS | PRIORITY_FLAG | PADDED]
            )
            payload = block
            if flags & PADDED:
                pad = rng.randrange(10)
                padded = bytes([pad]) + block + b"\0" * pad
                payload = padded if rng.random() < 0.8 else b"\xff" + block  # pad too long
            if flags & PRIORITY_FLAG:
                priority = struct.pack(">IB", rng.choice([0, stream, 3]), 16)
                if flags & PADDED:
                    payload = payload[:1] + priority + payload[1:]
                else:
                    payload = priority + payload
            if flags == 0 and rng.random() < 0.7:
                cut = rng.randrange(len(block) + 1)
                yield frame(Frame.HEADERS, 0, stream, block[:cut])
                yield frame(Frame.CONTINUATION, rng.choice([END_HEADERS, 0]), near(), block[cut:])
            else:
                yield frame(Frame.HEADERS, flags, near(), payload)
        elif pick < 0.6:  # DATA: a message, maybe cut across frames, padded, elsewhere
            message = grpc_message(rng)
            if rng.random() < 0.3 and len(message) > 2:
                cut = rng.randrange(1, len(message))
                yield frame(Frame.DATA, 0, stream, message[:cut])
                message = message[cut:]
            flags = rng.choice([END_STREAM, 0, END_STREAM, END_STREAM | PADDED])
            if flags & PADDED:
                message = bytes([rng.randrange(4)]) + message + b"\0" * 3
            yield frame(Frame.DATA, flags, near(), message)
            if rng.random() < 0.5:  # or the next DATA lands after this END_STREAM
                stream += 2
        elif pick < 0.7:  # frames of the connection, and types a client may not send
            kind = rng.choice([*Frame, 10, 0xFF])
            payload = rng.randbytes(rng.choice([0, 3, 4, 5, 6, 8, 12, 100]))
            if kind == Frame.SETTINGS and rng.random() < 0.7:
                payload = b"".join(
                    struct.pack(
                        ">HI",
                        rng.choice([1, 2, 3, 4, 5, 6, 8, 99]),
                        rng.choice([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 16_384, 2**24]),
                    )
                    for _ in range(rng.randrange(1, 4))
                )
            if kind == Frame.WINDOW_UPDATE and rng.random() < 0.7:
                payload = struct.pack(">I", rng.choice([0, 1, 2**31 - 1, 2**31 + 5, 65_535]))
            yield frame(kind, rng.choice([0, 1]), rng.choice([0, stream, 7]), payload)
        elif pick < 0.8:
            code = struct.pack(">I", rng.randrange(14))
            yield frame(Frame.RST_STREAM, 0, rng.choice([stream, 1, 99]), code)
            stream += 2
        elif pick < 0.85:  # a frame header that promises more than follows
            length = rng.choice([2**24 - 1, 300_000, 16_385])
            kind = rng.choice([Frame.DATA, Frame.HEADERS, Frame.CONTINUATION])
            head = frame(kind, 0, stream, b"")
            yield struct.pack(">I", length)[1:] + head[3:] + b"x" * 10
        else:
            stream += 2


def one_connection(rng: random.Random, address: tuple[str, int]) -> None:
    data = PREFACE if rng.random() < 0.97 else PREFACE[: rng.randrange(len(PREFACE))]
    encoder = hpack.Encoder()
    data += frame(Frame.SETTINGS, 0, 0, b"") + b"".join(well_formed_calls(rng, encoder))
    data += b"".join(random_frames(rng, encoder))
    with socket.create_connection(address, timeout=5) as sock:
        try:
            if rng.random() < 0.5:
                sock.sendall(data)
            else:  # in small pieces: frames cut anywhere
                pos = 0
                while pos < len(data):
                    step = rng.randrange(1, 64)
                    sock.sendall(data[pos : pos + step])
                    pos += step
            sock.settimeout(0.05)
            while sock.recv(1 << 16):
                pass
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass


def test_random_http2_frames_leave_no_traceback_and_the_server_serving(
    server: ServerProcess,
) -> None:
    logged = len(server.log)
    host, port = server.grpc_url.rsplit(":", 1)
    rng = random.Random(20261127)
    for _ in range(150):
        one_connection(rng, (host, int(port)))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_live()
        data = np.arange(16, dtype=np.int32).reshape(1, 16)
        result = client.infer("simple", simple_inputs(data, data))
        assert result.as_numpy("OUTPUT0").tolist() == (data * 2).tolist()
    with grpc.insecure_channel(server.grpc_url) as channel:
        live = channel.unary_unary(SERVICE + "ServerLive")
        assert live(b"", timeout=10) == b"\x08\x01"  # ServerLiveResponse(live=True)
    log = server.log[logged:]
    assert not [word for word in FAILURES if word in log], log[-3000:]
