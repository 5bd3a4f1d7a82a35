"""The frames between a gRPC process and the front (``oipserve.grpc_relay.frames``).

The reader is fed the bytes a socket would give it, cut at every kind of boundary,
through the same ``get_buffer`` / ``buffer_updated`` calls an event loop makes.
"""

from __future__ import annotations

import msgspec
import pytest

from oipserve.grpc_relay import frames
from oipserve.grpc_relay.frames import PREFIX, Call, Cancel, FrameProtocol, Header, Reply, Stop
from oipserve.wire.messages import ErrorKind


class Recorder(FrameProtocol):
    def __init__(self) -> None:
        super().__init__()
        self.received: list[tuple[Header, bytes, type]] = []

    def frame_received(self, header: Header, payload: frames.Payload) -> None:
        self.received.append((header, bytes(payload), type(payload)))


def _frame(header: Header, payload: bytes = b"") -> bytes:
    head = msgspec.msgpack.encode(header)
    return PREFIX.pack(len(head), len(payload)) + head + payload


def _feed(reader: FrameProtocol, data: bytes, cut: int) -> None:
    """Hand ``data`` over as a socket would: at most ``cut`` bytes (and the buffer) per read."""
    pos = 0
    while pos < len(data):
        buffer = reader.get_buffer(-1)
        n = min(cut, len(buffer), len(data) - pos)
        assert n > 0
        buffer[:n] = data[pos : pos + n]
        reader.buffer_updated(n)
        pos += n


LARGE = frames._BUFFER * 3 + 17
MAPPED = frames._MAPPED + 5

SENT: list[tuple[Header, bytes]] = [
    (Call(1, "ModelInfer"), b"x" * 100),
    (Cancel(1), b""),
    (Reply(2, ErrorKind.NOT_FOUND, "unknown model 'm'" * 3), b""),
    (Call(3, "ModelInfer"), bytes(range(256)) * (LARGE // 256)),
    (Reply(3), b"small"),
    (Reply(4, None, "e" * (frames._BUFFER + 10)), b"after a header larger than the buffer"),
    (Call(5, "ModelInfer"), b"\x07" * MAPPED),
    (Stop(2.5), b""),
]


@pytest.mark.parametrize("cut", [1, 7, 4096, 1 << 30])
def test_frames_survive_any_cut(cut: int) -> None:
    stream = b"".join(_frame(h, p) for h, p in SENT)
    reader = Recorder()
    if cut == 1:
        stream = b"".join(_frame(h, p) for h, p in SENT[:5])  # one byte a read: keep it short
    _feed(reader, stream, cut)
    expected = SENT[:5] if cut == 1 else SENT
    assert [(h, p) for h, p, _ in reader.received] == expected


def test_large_payloads_get_memory_of_their_own() -> None:
    reader = Recorder()
    _feed(reader, _frame(*SENT[0]) + _frame(*SENT[3]) + _frame(*SENT[6]), 1 << 30)
    kinds = [kind for _, _, kind in reader.received]
    assert kinds == [bytes, memoryview, memoryview]


def test_send_writes_what_the_reader_reads() -> None:
    written: list[bytes] = []

    class Transport:
        def writelines(self, lines: list[bytes]) -> None:
            written.extend(bytes(line) for line in lines)

        def is_closing(self) -> bool:
            return False

    class Loop:
        def call_soon(self, callback: object) -> None:
            pass

    writer = FrameProtocol()
    writer._out = frames.CorkedTransport(Transport(), Loop())  # type: ignore[arg-type]
    for header, payload in SENT[:5]:
        writer.send(header, payload)
    writer._out.flush()
    reader = Recorder()
    _feed(reader, b"".join(written), 1 << 30)
    assert [(h, p) for h, p, _ in reader.received] == SENT[:5]
