"""A worker driven in process, on one end of a socket pair: what it answered.

``Worker.handle`` writes its replies to the front's connection (``worker.starter``), which
keeps their frames in ``replies`` (a bytearray) in the unit tests' workers; each frame is
a 4-byte length and a msgpack ``FromWorker`` message.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from oipserve.wire.framing import FrameSplitter
from oipserve.wire.messages import FromWorker
from workers.worker import Worker

_DECODER = msgspec.msgpack.Decoder(FromWorker)


@contextmanager
def paired_worker(prefix: str, kind: type[Worker] = Worker) -> Iterator[Worker]:
    """A ``Worker`` (or a subclass, ``kind``) on one end of a socket pair (its segments
    named ``prefix``...), closed with both ends afterwards."""
    ours, theirs = socket.socketpair()
    worker = kind(theirs, prefix)
    try:
        yield worker
    finally:
        worker.close()
        ours.close()
        theirs.close()


def only_reply(worker: Worker) -> object:
    """The one reply ``worker`` has written since the last call, decoded (and forgotten)."""
    (frame,) = FrameSplitter().feed(bytes(worker.starter.replies))
    worker.starter.replies.clear()
    return _DECODER.decode(frame)
