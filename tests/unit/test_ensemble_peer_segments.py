"""A worker maps another worker's output segment for an ensemble step, and nothing else
(``workers.peer_segments``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from oipserve.wire.shm import BufferPool, sweep
from workers import peer_segments
from workers.peer_segments import CheckedSegments, server_prefix

PREFIX = f"oipserve-{os.getpid()}-"


@pytest.fixture
def peer() -> Iterator[BufferPool]:
    """Worker 7's output segments, as its pool makes them."""
    pool = BufferPool(f"{PREFIX}w7-")
    yield pool
    pool.close()
    sweep(f"{PREFIX}w7-")


def test_the_server_prefix_of_a_worker() -> None:
    assert server_prefix("oipserve-123-w4-") == "oipserve-123-"
    assert server_prefix("oipserve-123-w4-c2-") == "oipserve-123-"


def test_a_peer_output_is_read_where_it_lies(peer: BufferPool) -> None:
    lease = peer.acquire(100)
    lease.buf[10:14] = b"abcd"
    segments = CheckedSegments(PREFIX)
    view = segments.get(lease.name).buf[10:14]
    assert bytes(view) == b"abcd"
    lease.buf[10:14] = b"wxyz"  # the same memory, not a copy
    assert bytes(view) == b"wxyz"
    assert segments.peer_count == 1
    del view
    segments.close()


@pytest.mark.parametrize(
    "name",
    [
        "oipserve-1-w0-1",  # another server's
        "../../etc/passwd",
        f"{PREFIX}w7-../../x",
        f"{PREFIX}",
        "client-region",
    ],
)
def test_only_this_servers_segments_are_mapped(name: str) -> None:
    segments = CheckedSegments(PREFIX)
    with pytest.raises(ValueError, match="is not one of this server's"):
        segments.get(name)


def test_peer_mappings_are_bounded(peer: BufferPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody says when a peer's segment goes: the oldest mappings are let go."""
    monkeypatch.setattr(peer_segments, "MAX_PEER_MAPPINGS", 2)
    leases = [peer.acquire(10) for _ in range(3)]
    segments = CheckedSegments(PREFIX)
    for lease in leases:
        segments.get(lease.name)
    assert segments.peer_count == 2
    segments.get(leases[0].name)  # mapped again when needed
    assert segments.peer_count == 2
    segments.close()


def test_a_segment_its_owner_never_keeps_idle_is_mapped_per_use(peer: BufferPool) -> None:
    """A front's input (or a peer's output) larger than its pool keeps idle goes with its
    last view: kept mapped, it held its pages after its owner unlinked it, and with a small
    /dev/shm the next request found no room."""
    small, large = peer.acquire(100), peer.acquire(2 << 20)
    segments = CheckedSegments(PREFIX, keep_up_to=1 << 20)
    assert segments.get(small.name) is segments.get(small.name)
    assert segments.get(large.name) is not segments.get(large.name)
    assert segments.peer_count == 1  # the small one alone
    segments.close()
