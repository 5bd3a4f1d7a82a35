"""The front's CPU a tiny ModelStreamInfer message, its reading alone: a real HTTP/2
connection and call (``tests.support.grpc_peer``) fed 20,000 messages of 45 bytes in
64 KiB reads (~1,450 messages a read, up to 2,000 more ahead of the stream's handler),
which a service without a data plane answers at once; ``time.thread_time`` over the
whole stream.

Run it from the tree to measure, with that tree first on the path (its compiled modules
built), and interleave two trees by hand::

    PYTHONPATH=. python benchmarks/stream_read_cpu.py --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time

from oipserve.config.settings import Settings
from oipserve.front.grpc.h2.frames import END_STREAM, Frame, Setting, frame, settings_frame
from tests.support.grpc_peer import FakeService, GrpcPeer, grpc_message

MESSAGES = 20_000
#: Messages a burst: the client writes them together, then keeps pace with the front.
BURST = 2_000
READ = 64 * 1024
FRAME = 16 * 1024


def _wire() -> tuple[bytes, int]:
    message = grpc_message(b"m" * 40)
    data = message * MESSAGES
    frames = [
        frame(Frame.DATA, END_STREAM if at + FRAME >= len(data) else 0, 1, data[at : at + FRAME])
        for at in range(0, len(data), FRAME)
    ]
    return b"".join(frames), len(message)


async def one_stream() -> float:
    """µs of this thread's CPU a message."""
    service = FakeService()
    peer = GrpcPeer(service.table(Settings(model_repository=".")))
    top = 2**31 - 1  # the client reads every answer
    peer.send(settings_frame({Setting.INITIAL_WINDOW_SIZE: top}))
    peer.send(frame(Frame.WINDOW_UPDATE, 0, 0, struct.pack(">I", top - 65_535)))
    wire, size = _wire()
    started = time.thread_time()
    peer.send(peer.headers(1, "ModelStreamInfer"))
    for at in range(0, len(wire), READ):
        peer.send(wire[at : at + READ])
        # (keeps pace: at most BURST messages ahead of the handler before the next read,
        #   which the build before 2026-11-30 served too: it reset a stream at 4,096)
        while len(service.calls) < (at + READ) // (size + 1) - BURST:
            await asyncio.sleep(0)
            peer.transport.written.clear()
    while peer.connection.streams:
        await asyncio.sleep(0)
        peer.transport.written.clear()
    spent = time.thread_time() - started
    if len(service.calls) != MESSAGES:
        raise SystemExit(f"{len(service.calls)} of {MESSAGES} messages served (stream reset?)")
    return spent / MESSAGES * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    results = sorted([await one_stream() for _ in range(args.rounds)])
    shown = ", ".join(f"{x:.2f}" for x in results)
    print(f"median {results[len(results) // 2]:.2f} us of front CPU a message ({shown})")


if __name__ == "__main__":
    asyncio.run(main())
