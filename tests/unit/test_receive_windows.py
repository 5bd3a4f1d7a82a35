"""One connection's receive windows (``front.grpc.h2.receive_windows``): what DATA may
take, and the WINDOW_UPDATEs that give it back (RFC 9113, 6.9)."""

from __future__ import annotations

import struct

import pytest

from oipserve.front.grpc.h2.frames import HEADER, ErrorCode, Frame, ProtocolError
from oipserve.front.grpc.h2.receive_windows import (
    CONNECTION_ACK,
    CONNECTION_WINDOW,
    STREAM_WINDOW,
    ReceiveWindows,
)


def _windows() -> tuple[ReceiveWindows, list[tuple[int, int]]]:
    """Windows whose WINDOW_UPDATEs are read back as (stream, increment)."""
    updates: list[tuple[int, int]] = []

    def write(data: bytes) -> None:
        _high, _low, kind, _flags, stream = HEADER.unpack_from(data)
        assert kind == Frame.WINDOW_UPDATE
        updates.append((stream, struct.unpack_from(">I", data, HEADER.size)[0]))

    return ReceiveWindows(write), updates


def test_data_within_both_windows_is_counted_against_both() -> None:
    windows, updates = _windows()
    windows.open(1)
    assert windows.take(1, 1000)
    assert windows.streams[1] == STREAM_WINDOW - 1000
    assert windows.connection == CONNECTION_WINDOW - 1000
    assert not updates


def test_data_past_a_streams_window_is_refused_and_given_back_to_the_connection() -> None:
    windows, updates = _windows()
    windows.open(1)
    assert windows.take(1, STREAM_WINDOW)
    assert not windows.take(1, CONNECTION_ACK)  # the caller resets the stream
    assert windows.streams[1] == 0
    # The dropped bytes went back to the connection at once (a full step of credit).
    assert updates == [(0, CONNECTION_ACK)]
    assert windows.connection == CONNECTION_WINDOW - STREAM_WINDOW


def test_data_past_the_connections_window_is_a_connection_error() -> None:
    windows, _ = _windows()
    for stream in range(1, 2 * (CONNECTION_WINDOW // STREAM_WINDOW), 2):
        windows.open(stream)
        assert windows.take(stream, STREAM_WINDOW)
    windows.open(99)
    with pytest.raises(ProtocolError) as raised:
        windows.take(99, 1)
    assert raised.value.code == ErrorCode.FLOW_CONTROL_ERROR


def test_taken_data_goes_back_to_its_stream_at_once_and_to_the_connection_in_steps() -> None:
    windows, updates = _windows()
    windows.open(1)
    windows.take(1, 1000)
    windows.acknowledge(1, 1000)
    assert updates == [(1, 1000)] and windows.streams[1] == STREAM_WINDOW
    windows.take(1, CONNECTION_ACK)
    windows.acknowledge(1, CONNECTION_ACK)
    assert updates[1:] == [(1, CONNECTION_ACK), (0, CONNECTION_ACK + 1000)]
    assert windows.connection == CONNECTION_WINDOW
    windows.acknowledge(3, 10)  # a stream not open: nothing to give back
    windows.acknowledge(1, 0)
    assert len(updates) == 3


def test_a_closed_streams_data_and_what_it_left_untaken_go_back_to_the_connection() -> None:
    windows, updates = _windows()
    windows.open(1)
    half = CONNECTION_ACK // 2
    windows.take(1, half)
    windows.forget(1)  # its call took none of it
    assert 1 not in windows.streams and not updates  # one step of credit not yet reached
    assert windows.take(1, half)  # in flight when it closed
    assert updates == [(0, CONNECTION_ACK)]
    assert windows.connection == CONNECTION_WINDOW


def _spend(windows: ReceiveWindows, streams: range, each: int, keep: bool) -> None:
    for stream in streams:
        windows.open(stream)
        assert windows.take(stream, each)
        if keep:
            windows.keep(stream)


def test_a_window_spent_on_whole_requests_is_withheld_by_us() -> None:
    """The connection's window spent on requests whose message is whole (kept until they
    end): the client cannot send, and it is not the client's doing."""
    windows, _ = _windows()
    each = 64 * 1024
    count = CONNECTION_WINDOW // each
    _spend(windows, range(1, 2 * count, 2), each, keep=True)
    assert windows.connection == 0
    assert windows.withheld(100_000) and windows.withheld(10)
    assert not windows.withheld(0)  # (nothing left to send)
    windows.forget(1)  # a request ended: its window is given back (once 4 MiB are)
    for stream in range(3, 2 * (CONNECTION_ACK // each) + 3, 2):
        windows.forget(stream)
    assert windows.connection >= CONNECTION_ACK and not windows.withheld(100_000)


def test_a_window_spent_on_messages_still_arriving_is_the_clients() -> None:
    """Spent mostly by messages only partly in (each bounded in time), it is not withheld
    by us: those uploads are timed as usual."""
    windows, _ = _windows()
    each = 1024 * 1024 - 1  # (a unary call's window is given back from 1 MiB in)
    whole = 4
    _spend(windows, range(1, 2 * whole, 2), each, keep=True)
    _spend(windows, range(101, 101 + 2 * 12, 2), each, keep=False)
    assert windows.connection < 16_384
    assert not windows.withheld(100_000)


def test_below_a_step_of_window_left_what_we_no_longer_hold_goes_back_at_once() -> None:
    """With less than ``CONNECTION_ACK`` left to the client, the window of a request that
    ended goes back as it ends: held back for the 4 MiB step, the client could wait for
    up to 4 MiB we no longer hold (12 MiB kept at a stopped worker and 3.9 MiB of
    requests refused: none of its calls, even a ModelReady, could be sent)."""
    windows, updates = _windows()
    each = 64 * 1024
    count = CONNECTION_WINDOW // each
    _spend(windows, range(1, 2 * count, 2), each, keep=True)
    assert windows.connection == 0
    windows.forget(1)
    assert updates == [(0, each)] and windows.connection == each
    windows.forget(3)  # still below a step: at once again
    assert updates[1:] == [(0, each)]
    # Above a step left, in steps again.
    for stream in range(5, 2 * (CONNECTION_ACK // each) + 5, 2):
        windows.forget(stream)
    assert windows.connection >= CONNECTION_ACK
    sent = len(updates)
    windows.forget(2 * (CONNECTION_ACK // each) + 5)
    assert len(updates) == sent
