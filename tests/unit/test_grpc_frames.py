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
MAPPED = frames.MAPPED + 5

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


# ---- the front's end: a large ModelInfer message read into a lease ---------------------


class _Lease:
    def __init__(self, size: int, log: list[str]) -> None:
        self.buf = memoryview(bytearray(size))
        self.log = log

    def release(self) -> None:
        self.log.append("released")


class _Pool:
    def __init__(self) -> None:
        self.log: list[str] = []

    async def acquire_async(self, nbytes: int) -> _Lease:
        self.log.append("acquired")
        return _Lease(nbytes, self.log)


def _large_infer_request() -> bytes:
    from oipserve.grpc_generated import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="UINT8", shape=[1, frames._BUFFER * 2])
    request.raw_input_contents.append(b"\x01" * (frames._BUFFER * 2))
    return request.SerializeToString()


def _run_front_side(answer: object, frames_out: list[tuple[Header, bytes]]) -> list[str]:
    """Send ``frames_out`` to a FrontSide over a socket pair; the pool's log afterwards."""
    import asyncio
    import socket

    from oipserve.grpc_front.codec import split_infer_request
    from oipserve.grpc_front.handlers import Method
    from oipserve.grpc_relay.front_side import FrontSide

    pool = _Pool()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        methods = {"ModelInfer": Method(split_infer_request, answer, bytes)}  # type: ignore[arg-type]
        side = FrontSide(methods, pool)  # type: ignore[arg-type]
        await loop.connect_accepted_socket(lambda: side, ours)
        with theirs:
            theirs.setblocking(False)
            await loop.sock_sendall(theirs, b"".join(_frame(h, p) for h, p in frames_out))
            for _ in range(200):
                await asyncio.sleep(0.005)
                if pool.log.count("released") == pool.log.count("acquired") and pool.log:
                    break
        side.transport.close()  # type: ignore[union-attr]
        await side.closed.wait()

    asyncio.run(main())
    return pool.log


def test_a_large_message_hands_its_lease_to_the_call() -> None:
    taken: list[object] = []

    async def answer(call: object) -> bytes:
        taken.append(call.lease)  # type: ignore[attr-defined]
        assert call.located()[0][1:] == (
            len(_large_infer_request()) - frames._BUFFER * 2,
            frames._BUFFER * 2,
        )  # type: ignore[attr-defined]
        call.lease.release()  # type: ignore[attr-defined]
        return b"ok"

    log = _run_front_side(answer, [(Call(1, "ModelInfer"), _large_infer_request())])
    assert log == ["acquired", "released"] and len(taken) == 1


def test_a_lease_is_released_when_its_message_does_not_parse() -> None:
    async def answer(call: object) -> bytes:
        raise AssertionError("not parsed: never called")

    garbage = b"\xff" * (frames._BUFFER * 2)
    log = _run_front_side(answer, [(Call(1, "ModelInfer"), garbage)])
    assert log == ["acquired", "released"]


def test_a_lease_is_released_when_its_call_is_cancelled_before_it_runs() -> None:
    """A Cancel read in the same turn as its Call: the call's task never runs its body."""
    import asyncio

    from oipserve.grpc_front.codec import split_infer_request
    from oipserve.grpc_front.handlers import Method
    from oipserve.grpc_relay.front_side import FrontSide

    async def answer(call: object) -> bytes:
        raise AssertionError("cancelled before it ran")

    async def main() -> list[str]:
        pool = _Pool()
        methods = {"ModelInfer": Method(split_infer_request, answer, bytes)}  # type: ignore[arg-type]
        side = FrontSide(methods, pool)  # type: ignore[arg-type]
        payload = await side._leased(1, len(_large_infer_request()))
        payload[:] = _large_infer_request()
        side.frame_received(Call(1, "ModelInfer"), payload)
        side.frame_received(Cancel(1), b"")
        await asyncio.sleep(0.01)
        return pool.log

    assert asyncio.run(main()) == ["acquired", "released"]
