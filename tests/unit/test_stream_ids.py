"""A connection's client stream ids (``front.grpc.h2.stream_ids``): which HEADERS open a
stream, and what HEADERS on a closed one mean (RFC 9113, 5.1, 5.1.1)."""

from __future__ import annotations

import pytest

from oipserve.front.grpc.h2.frames import ErrorCode, ProtocolError
from oipserve.front.grpc.h2.stream_ids import StreamIds


def _refused(ids: StreamIds, stream: int, end_stream: bool = True) -> ProtocolError:
    with pytest.raises(ProtocolError) as raised:
        ids.judge_closed_headers(stream, end_stream)
    return raised.value


def test_odd_ids_above_the_last_open_streams() -> None:
    ids = StreamIds()
    assert ids.opens(1) and not ids.opens(2)
    ids.open(1)
    assert ids.last == 1
    assert not ids.opens(1) and ids.opens(3) and ids.opens(9)


def test_an_id_the_client_skipped_was_never_opened() -> None:
    ids = StreamIds()
    for stream in (1, 3, 7):
        ids.open(stream)
    error = _refused(ids, 5)
    assert error.code == ErrorCode.PROTOCOL_ERROR and "below one already opened" in str(error)
    assert _refused(ids, 4).code == ErrorCode.PROTOCOL_ERROR  # even: never a client's


def test_headers_on_a_stream_this_side_reset_are_ignored() -> None:
    """Sent before the client heard our RST_STREAM (5.1); its reset after ours changes
    nothing."""
    ids = StreamIds()
    ids.open(1)
    ids.reset_here(1)
    ids.reset_by_client(1)
    assert ids.ignored(1)
    assert ids.judge_closed_headers(1, end_stream=False) is False


def test_after_the_clients_own_reset_trailers_are_a_stream_error_and_more_a_connection_one() -> (
    None
):
    ids = StreamIds()
    ids.open(1)
    ids.reset_by_client(1)
    assert not ids.ignored(1)
    assert ids.judge_closed_headers(1, end_stream=True) is True  # RST_STREAM, STREAM_CLOSED
    assert "reusing stream id 1" in str(_refused(ids, 1, end_stream=False))


def test_a_stream_both_sides_ended_or_forgotten_is_a_connection_error() -> None:
    ids = StreamIds()
    for stream in range(1, 2 * 300, 2):
        ids.open(stream)
        ids.reset_here(stream)
    assert ids.judge_closed_headers(599, end_stream=True) is False  # remembered
    error = _refused(ids, 1)  # the oldest, forgotten: judged as ended by both sides
    assert error.code == ErrorCode.STREAM_CLOSED
