"""The "MadeYouReset" attack (CVE-2025-8671) from outside: ModelInfer calls whose message prefix
declares a large size, then a stream error that makes the server reset the stream
(WINDOW_UPDATE of 0), round after round. Each reset call gives its input segment back to
the pool, so /dev/shm stops growing after the first round (the pool reuses its idle
segments); it used to grow by the declared sizes every round, never freed.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator

import hpack
import pytest

from oipserve.front.grpc.h2.frames import END_HEADERS, PREFACE, Frame, frame, window_update
from tests.support.server import ServerProcess, shm_entries

#: Each call's declared message: read into a segment of the input pool (made in a thread).
_DECLARED = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    proc = ServerProcess().wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _shm_bytes(pid: int) -> int:
    return sum(os.stat(f"/dev/shm/{name}").st_size for name in shm_entries(pid))


def _round(port: int) -> None:
    """Four calls, each reset by the server for a WINDOW_UPDATE of 0; then the answers
    (RST_STREAMs) read before the connection closes."""
    encoder = hpack.Encoder()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(PREFACE + frame(Frame.SETTINGS, 0, 0))
        for stream in (1, 3, 5, 7):
            block = encoder.encode(
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/inference.GRPCInferenceService/ModelInfer"),
                    (":authority", "test"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ]
            )
            prefix = struct.pack(">BI", 0, _DECLARED)
            sock.sendall(
                frame(Frame.HEADERS, END_HEADERS, stream, block)
                + frame(Frame.DATA, 0, stream, prefix + b"x" * 1000)
            )
        time.sleep(0.5)  # the segments are made (in a thread)
        sock.sendall(b"".join(window_update(stream, 0) for stream in (1, 3, 5, 7)))
        time.sleep(0.3)


def test_streams_reset_by_the_server_give_their_segments_back(srv: ServerProcess) -> None:
    pid = srv.process.pid
    _round(srv.grpc_port)
    after_one = _shm_bytes(pid)
    for _ in range(3):
        _round(srv.grpc_port)
    assert _shm_bytes(pid) == after_one, "segments of reset calls were never given back"
