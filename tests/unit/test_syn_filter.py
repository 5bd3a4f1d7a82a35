"""The listener's SYN filter (``front.http.syn_filter``) on real loopback sockets: new
connections are dropped, those already made (and their data) are not."""

from __future__ import annotations

import socket
import sys

import pytest

from oipserve.front.http.syn_filter import drop_new_connections

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux filter")


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_a_filtered_listener_takes_no_new_connection(family: int, host: str) -> None:
    try:
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} here")
    with listener:
        listener.listen(8)
        address = listener.getsockname()[:2]
        before = socket.create_connection(address, timeout=5)  # in the backlog
        assert drop_new_connections(listener)
        # The SYN is dropped: neither accepted nor refused (the client would retry it).
        with pytest.raises(TimeoutError):
            socket.create_connection(address, timeout=0.3)
        # The connection made before is still in the backlog, and its data still flows.
        served, _ = listener.accept()
        with before, served:
            before.sendall(b"request")
            served.settimeout(5)
            assert served.recv(16) == b"request"
            served.sendall(b"answer")
            assert before.recv(16) == b"answer"
        listener.settimeout(0)
        with pytest.raises(BlockingIOError):
            listener.accept()  # the dropped attempt never reached the backlog


def test_other_sockets_are_left_alone() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        assert not drop_new_connections(unix)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as datagram:
        assert not drop_new_connections(datagram)
