"""The one table of request-header rules every front applies (``oipserve.front.header_rules``).

The fronts' side-by-side behaviour is tests/e2e/test_front_parity.py; these pin the rules
themselves: what is refused, stripped, dropped or forwarded, and how ``grpc-timeout`` reads.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from oipserve.errors import InvalidInput
from oipserve.front.header_rules import (
    FORWARDED_CONNECTION,
    HOP_BY_HOP,
    MAX_GRPC_TIMEOUT,
    NOT_FORWARDED,
    TRANSPORT_KEYS,
    HeadChecked,
    check_http_head,
    forwarded_metadata,
    grpc_timeout,
    is_metadata,
)


def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "headers": list(headers)}


# ---- HTTP -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hosts", [[b"a", b"b"], [b"a", b"a"], [b"a", b"", b"c"]], ids=["different", "same", "three"]
)
def test_host_more_than_once_is_refused(hosts: list[bytes]) -> None:
    request = scope((b"x", b"1"), *[(b"host", host) for host in hosts])
    with pytest.raises(InvalidInput, match=f"{len(hosts)} Host headers"):
        check_http_head(request)


def test_one_host_or_none_passes_unchanged() -> None:
    for request in (scope((b"host", b"a"), (b"x-rep", b"1"), (b"x-rep", b"2")), scope()):
        headers = request["headers"]
        check_http_head(request)
        assert request["headers"] is headers  # PERF: no new list when nothing changes


def test_whitespace_at_the_end_of_values_is_stripped_only_there() -> None:
    request = scope(
        (b"host", b"a"),
        (b"x-admin-key", b"S \t "),
        (b"x-inner", b"a \tb"),
        (b"x-blank", b" \t"),
        (b"x-kept", b"k"),
    )
    check_http_head(request)
    assert request["headers"] == [
        (b"host", b"a"),
        (b"x-admin-key", b"S"),
        (b"x-inner", b"a \tb"),
        (b"x-blank", b""),
        (b"x-kept", b"k"),
    ]
    stripped = list(request["headers"])
    check_http_head(request)  # what a forward brings again passes unchanged
    assert request["headers"] == stripped


def test_not_forwarded_is_hop_by_hop_and_expect() -> None:
    assert NOT_FORWARDED == HOP_BY_HOP | {b"expect"}
    assert {b"connection", b"transfer-encoding", b"upgrade", b"te"} <= HOP_BY_HOP
    assert b"host" not in NOT_FORWARDED and b"content-length" not in NOT_FORWARDED


class App:
    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)


def run(app: HeadChecked, request: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body of a refused request is not read")

    asyncio.run(app(request, receive, send))  # type: ignore[arg-type]
    return sent


def test_head_checked_refuses_with_a_json_400_before_the_app() -> None:
    inner = App()
    sent = run(HeadChecked(inner), scope((b"host", b"a"), (b"host", b"b")))
    assert inner.scopes == []
    start, body = sent
    assert start["status"] == 400
    assert (b"content-type", b"application/json") in start["headers"]
    assert "2 Host headers" in json.loads(body["body"])["error"]
    assert body["more_body"] is False


def test_head_checked_hands_the_app_the_checked_head() -> None:
    inner = App()
    assert run(HeadChecked(inner), scope((b"host", b"a"), (b"x-admin-key", b"S\t"))) == []
    (seen,) = inner.scopes
    assert seen["headers"] == [(b"host", b"a"), (b"x-admin-key", b"S")]
    other = {"type": "lifespan"}
    run(HeadChecked(inner), other)
    assert inner.scopes[-1] is other


# ---- gRPC -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "kept"),
    [
        ("x-key", "value with spaces", True),
        ("triton-grpc-protocol-admin-key", "s3cr3t:v==", True),
        ("a.b_c-1", "", True),
        ("x-data-bin", "AAEC\x01", True),  # binary: its value is not ASCII metadata
        ("X-Key", "v", False),
        ("x key", "v", False),
        ("x:key", "v", False),
        ("", "v", False),
        ("x-key ", "v", False),
        ("x-key", "a\x01b", False),
        ("x-key", "a\x00", False),
        ("x-key", "a\x7f", False),
        ("x-key", "a\tb", False),
        ("x-key", "café", False),
    ],
)
def test_what_is_metadata(key: str, value: str, kept: bool) -> None:
    assert is_metadata(key, value) is kept


def test_transport_keys_include_the_hop_by_hop_names() -> None:
    assert {"te", "content-type", "grpc-timeout", "user-agent"} <= TRANSPORT_KEYS
    assert {name.decode() for name in HOP_BY_HOP} <= TRANSPORT_KEYS


def test_forwarded_metadata_leaves_out_binary_and_reserved_keys() -> None:
    metadata = (("a", "1"), ("x-bin", "AA"), ("grpc-x", "2"), ("b", "3"), ("a", "4"))
    assert forwarded_metadata(metadata) == (("a", "1"), ("b", "3"), ("a", "4"))


def test_forwarded_metadata_carries_the_fronts_mark_never_the_clients() -> None:
    """An inference forwarded to the primary names its client connection
    (``FORWARDED_CONNECTION``), whose share the primary counts it in: a client's own value
    of that key is dropped, so that it cannot be counted in another client's share."""
    metadata = (("a", "1"), (FORWARDED_CONNECTION, "1.1"), ("b", "2"))
    assert forwarded_metadata(metadata) == (("a", "1"), ("b", "2"))
    marked = forwarded_metadata(metadata, "42.7")
    assert marked == (("a", "1"), ("b", "2"), (FORWARDED_CONNECTION, "42.7"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1S", 1.0),
        ("250m", 0.25),
        ("5u", 5e-6),
        ("7n", 7e-9),
        ("2M", 120.0),
        ("1H", 3600.0),
        ("00000003S", 3.0),
        ("99999999S", 99999999.0),
        ("99999999u", 99.999999),
    ],
)
def test_grpc_timeout_in_seconds(text: str, seconds: float) -> None:
    assert grpc_timeout(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["99999999H", "99999999M", "27778H", "1666667M"])
def test_a_grpc_timeout_past_the_ceiling_is_no_deadline(text: str) -> None:
    assert grpc_timeout(text) is None
    assert MAX_GRPC_TIMEOUT == 1e8


@pytest.mark.parametrize("text", ["", "1", "S", "123456789S", "1.5S", "-1S", "1s", " 1S", "1S "])
def test_a_malformed_grpc_timeout(text: str) -> None:
    with pytest.raises(ValueError, match="malformed grpc-timeout"):
        grpc_timeout(text)
