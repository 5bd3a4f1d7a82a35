"""The worker loop serves a socket whose fd number is above 1024 (select() cannot).

A worker started by a front that holds many connections gets high fd numbers; with
``select.select`` its loop failed with ``ValueError: filedescriptor out of range in
select()``. Here the worker's socket and its wakeup pipe are all above 1024.
"""

from __future__ import annotations

import fcntl
import os
import resource
import socket
from collections.abc import Iterator

import msgspec
import pytest

from oipserve.wire.framing import FrameSplitter, frame
from oipserve.wire.messages import FromWorker, Stop, Unloaded, UnloadModel
from workers.worker import Worker

HIGH = 1500


@pytest.fixture
def fds_above_1024() -> Iterator[list[int]]:
    """Fd numbers ≥ HIGH taken, so the worker's own pipe lands above 1024 too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HIGH + 64:
        pytest.skip(f"the fd limit ({hard}) is too low for fd numbers above {HIGH}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 64), hard))
    # Fill every free number below HIGH + 8 so the next os.pipe() gets numbers above it.
    devnull = os.open(os.devnull, os.O_RDONLY)
    filler = [devnull]
    while True:
        fd = os.dup(devnull)
        filler.append(fd)
        if fd >= HIGH + 8:
            break
    yield filler
    for fd in filler:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_worker_loop_serves_a_socket_with_an_fd_above_1024(fds_above_1024: list[int]) -> None:
    ours, theirs = socket.socketpair()
    # The worker's end, moved to a high number the way a crowded front process hands it on.
    high = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD, HIGH + 16)
    theirs.close()
    assert high > 1024
    worker_sock = socket.socket(fileno=high)
    encoder = msgspec.msgpack.Encoder()
    ours.sendall(frame(encoder, UnloadModel(3, "m/1")) + frame(encoder, Stop()))
    worker = Worker(worker_sock, "oipserve-test-highfd-")
    try:
        worker.serve()  # returns at Stop; with select() it raised ValueError at once
    finally:
        worker.close()
        worker_sock.close()
    ours.settimeout(5)
    replies = FrameSplitter().feed(ours.recv(1 << 16))
    decoded = [msgspec.msgpack.Decoder(FromWorker).decode(body) for body in replies]
    ours.close()
    assert decoded == [Unloaded(3, "m/1")]
