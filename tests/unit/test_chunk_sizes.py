"""ChunkSizes: the declared sizes of a chunked body, followed over any split of its bytes."""

from __future__ import annotations

import time

import pytest

from oipserve.front.http.chunk_sizes import (
    END,
    MAX_SIZE_LINE,
    MAX_TRAILERS,
    MORE,
    OVER,
    UNKNOWN,
    ChunkSizes,
)

BODY = b'5;name=value;x="a;b\\"c"\r\nhello\r\n0A\r\n0123456789\r\n0\r\nX-Check: 1\r\n\r\n'
NEXT = b"POST /v2/models/m/infer HTTP/1.1\r\nhost: t\r\n\r\n"


def feed_all(tracker: ChunkSizes, parts: list[bytes]) -> list[int]:
    verdicts = []
    for part in parts:
        verdicts.append(tracker.feed(part))
        if verdicts[-1] != MORE:
            break
    return verdicts


def test_a_whole_body_ends_where_it_ends_and_the_next_request_is_not_followed() -> None:
    tracker = ChunkSizes(limit=1000)
    assert tracker.feed(BODY + NEXT) == END
    assert tracker.end == len(BODY)
    assert tracker.declared == 15
    with pytest.raises(RuntimeError):
        tracker.feed(b"FFFFFFFF\r\n")


@pytest.mark.parametrize("cut", range(1, len(BODY)))
def test_every_split_in_two_gives_the_same_result(cut: int) -> None:
    tracker = ChunkSizes(limit=1000)
    assert tracker.feed(BODY[:cut]) == MORE
    assert tracker.feed(BODY[cut:] + NEXT) == END
    assert tracker.end == len(BODY) - cut
    assert tracker.declared == 15


def test_one_byte_at_a_time() -> None:
    tracker = ChunkSizes(limit=1000)
    verdicts = feed_all(tracker, [BODY[i : i + 1] for i in range(len(BODY))])
    assert verdicts == [MORE] * (len(BODY) - 1) + [END]
    assert tracker.end == 1


def test_feed_from_an_offset() -> None:
    tracker = ChunkSizes(limit=1000)
    assert tracker.feed(NEXT + BODY, len(NEXT)) == END
    assert tracker.end == len(NEXT) + len(BODY)


@pytest.mark.parametrize(
    "line", [b"FFFFFFFFFFFFFFFF\r\n", b"FFFFFFFFFFFFFFFF", b"1FFFFFFFFFFFFFFFFFFFF\r\n", b"3E9\r\n"]
)
def test_a_size_past_the_limit_is_over_at_its_line(line: bytes) -> None:
    assert ChunkSizes(limit=1000).feed(line) == OVER


def test_a_size_at_the_limit_is_fine_one_more_is_over() -> None:
    assert ChunkSizes(limit=1000).feed(b"3E8\r\n") == MORE
    assert ChunkSizes(limit=1000).feed(b"3E9;ext=1\r\n") == OVER


def test_digits_split_over_reads_are_over_as_soon_as_they_pass() -> None:
    tracker = ChunkSizes(limit=1000)
    assert tracker.feed(b"F") == MORE
    assert tracker.feed(b"F") == MORE
    assert tracker.feed(b"F") == OVER  # 0xFFF > 1000, before any CRLF


def test_the_running_sum_is_over_at_the_chunk_that_crosses_it() -> None:
    tracker = ChunkSizes(limit=1000)
    chunk = b"190\r\n" + b"x" * 400 + b"\r\n"  # 400 bytes each
    assert tracker.feed(chunk) == MORE
    assert tracker.feed(chunk) == MORE
    assert tracker.feed(b"190\r\n") == OVER  # 1200 > 1000, before its data
    assert tracker.declared == 1200


def test_chunk_data_is_skipped_without_being_scanned() -> None:
    """A 64 MiB read inside a chunk costs what a 64-byte one does."""
    tracker = ChunkSizes(limit=1 << 40)
    assert tracker.feed(b"%x\r\n" % (1 << 30)) == MORE
    big = b"\n" * (64 << 20)  # newlines inside data must not be taken for line ends
    start = time.perf_counter()
    for _ in range(16):
        assert tracker.feed(big) == MORE
    assert time.perf_counter() - start < 0.05


def test_a_long_size_line_is_over() -> None:
    leading_zeros = b"0" * (MAX_SIZE_LINE + 1)
    assert ChunkSizes(limit=1000).feed(leading_zeros) == OVER
    assert ChunkSizes(limit=1000).feed(b"1;" + b"a" * MAX_SIZE_LINE + b"\r\n") == OVER
    tracker = ChunkSizes(limit=1000)
    assert tracker.feed(b"1;" + b"a" * (MAX_SIZE_LINE // 2)) == MORE
    assert tracker.feed(b"a" * (MAX_SIZE_LINE // 2)) == OVER


def test_a_long_trailer_section_is_over() -> None:
    tracker = ChunkSizes(limit=1000)
    assert tracker.feed(b"0\r\n") == MORE
    line = b"X-T: " + b"a" * 1000 + b"\r\n"
    verdicts = feed_all(tracker, [line] * (MAX_TRAILERS // len(line) + 2))
    assert verdicts[-1] == OVER


@pytest.mark.parametrize(
    "data",
    [
        b"G\r\n",  # not hex
        b"3 \r\n",  # whitespace after the size
        b"3\n",  # LF without CR
        b"3 ;a=b\r\n",
        b";a\r\n",  # no size
        b"3;\r\n",  # empty extension name
        b'3;a="open\r\n',
        b"\r\n",
        b"0\r\nno colon\r\n",
    ],
)
def test_framing_it_does_not_understand_is_left_to_the_parser(data: bytes) -> None:
    assert ChunkSizes(limit=1000).feed(data) == UNKNOWN


def test_a_tracker_resumed_mid_body_counts_what_was_declared_before() -> None:
    tracker = ChunkSizes(limit=1000, declared=900)
    assert tracker.feed(b"64\r\n") == MORE  # 900 + 100
    tracker = ChunkSizes(limit=1000, declared=900)
    assert tracker.feed(b"65\r\n") == OVER
