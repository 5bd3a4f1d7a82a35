"""The judgements beside the HTTP/1.1 protocol, alone: a body's and an unread response's
deadlines (``front.http.limits``), the HTTP/2 preface (``front.http.h2c``) and where a
chunked body's size line begins (``front.http.chunk_sizes``). The protocol's own tests
(test_chunk_protocol, test_h2c_handover, e2e test_connection_limits) drive them through
uvicorn's hooks."""

from __future__ import annotations

from oipserve.front.http.chunk_sizes import ChunkEvents, size_line_start
from oipserve.front.http.h2c import H2_PREFACE, PrefaceSniffer
from oipserve.front.http.limits import ConnectionLimits, UnreadResponse, body_overdue

LIMITS = ConnectionLimits(body_timeout=30.0, send_timeout=30.0, min_rate=1000)


def test_a_body_has_its_timeout_plus_a_second_per_min_rate_bytes() -> None:
    assert body_overdue(LIMITS, 100.0, 0, 129.9) == ""
    assert "not complete 30s after its head (0 bytes came" in body_overdue(LIMITS, 100.0, 0, 130.0)
    assert body_overdue(LIMITS, 100.0, 5000, 134.9) == ""  # 5 s more for 5,000 bytes
    assert body_overdue(LIMITS, 100.0, 5000, 135.0) != ""


def test_an_unread_response_counts_from_when_it_was_first_seen_waiting() -> None:
    unread = UnreadResponse(LIMITS)
    assert unread.overdue(10.0, buffered=0, written=500) == ""
    assert unread.since is None
    assert unread.overdue(20.0, buffered=400, written=500) == ""  # first seen: 100 sent
    assert unread.overdue(49.9, buffered=400, written=500) == ""
    assert "left 400 bytes of its response unread for 30s" in unread.overdue(50.0, 400, 500)


def test_bytes_the_client_reads_buy_it_time_and_an_empty_buffer_forgets() -> None:
    unread = UnreadResponse(LIMITS)
    unread.overdue(0.0, buffered=10_000, written=10_000)
    assert unread.overdue(35.0, buffered=4_000, written=10_000) == ""  # read 6,000: 36 s
    assert unread.overdue(36.0, buffered=4_000, written=10_000) != ""
    assert unread.overdue(37.0, buffered=0, written=10_000) == ""
    assert unread.since is None


def test_the_preface_is_told_apart_whatever_the_reads() -> None:
    sniffer = PrefaceSniffer()
    assert sniffer.feed(H2_PREFACE[:3]) == (None, b"")
    assert sniffer.feed(H2_PREFACE[3:10]) == (None, b"")
    assert sniffer.feed(H2_PREFACE[10:] + b"frames") == (True, H2_PREFACE + b"frames")
    assert sniffer.held == b""
    sniffer = PrefaceSniffer()
    assert sniffer.feed(b"PR") == (None, b"")
    assert sniffer.feed(b"OPFIND / HTTP/1.1\r\n") == (False, b"PROPFIND / HTTP/1.1\r\n")
    assert PrefaceSniffer().feed(b"POST /v2") == (False, b"POST /v2")


def test_the_size_line_is_placed_from_the_parsers_events() -> None:
    head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    due = ChunkEvents()
    assert size_line_start(head + b"1f", due) == len(head)  # part of a size line came
    in_data = ChunkEvents()
    in_data.open, in_data.since = True, 3
    assert size_line_start(head + b"10\r\nabc", in_data) == len(head)
    # Past the data with the CR of its CRLF: the line ends one byte earlier.
    assert size_line_start(head + b"3\r\nabc\r", in_data) == len(head)
    # The last chunk's trailers: nothing this read can place.
    assert size_line_start(head + b"0\r\nX-T: 1", in_data) == 0
