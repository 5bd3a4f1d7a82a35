"""The inference route served below the ASGI app: the HTTP/1.1 side (issue #40).

A plain ``POST /v2/models/{model}[/versions/{version}]/infer`` is the request a front
serves most, and uvicorn's ASGI cycle and Falcon's app around it cost 26-64 us of the
front's CPU a tiny request, a fifth to a third of it
(``benchmarks/results/2026-11-28-framework-floor.md``). ``CorkedHttpToolsProtocol``
hands such a request to an ``InferLane`` (the REST side: ``front.rest.lane``) instead:
the lane's responder reads a ``LaneRequest`` and fills a ``LaneResponse``, the same
names Falcon's request and response give it, and ``respond`` writes the response as
uvicorn would have (``tests/e2e/test_infer_lane.py`` compares them byte for byte).

Only a request that nothing but the responder would act on is taken (``lane_request``,
``lane_headers``): anything else (a query string, percent-encoding, a chunked,
compressed or oversized body, ``Expect``, ``Upgrade``, HTTP/1.0, a request pipelined
behind a response under way, a head the header rules act on, a model another front
answers, or a restricted inference API) goes the ASGI way as before, where uvicorn, the
header rules, Falcon and the REST app answer it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final, Protocol

from falcon.constants import SINGLETON_HEADERS

from oipserve.front.header_rules import OWS
from oipserve.front.http.lane_cycle import LaneCycle
from oipserve.runtime.bounded_memo import BoundedMemo

__all__ = [
    "LANE_REFUSES",
    "InferLane",
    "LaneRequest",
    "LaneResponse",
    "lane_headers",
    "lane_request",
    "respond",
]

#: Request headers that send a request the ASGI way: what only Falcon or the REST app's
#: other layers answer (a compressed body; ``Expect``; framing the lane does not follow).
LANE_REFUSES: Final = frozenset({b"content-encoding", b"expect", b"transfer-encoding", b"upgrade"})

#: Headers Falcon's request keeps one value of when a request repeats them (the last);
#: any other repeated header reads as its values joined with ",".
_SINGLETONS: Final = frozenset(name.encode() for name in SINGLETON_HEADERS)


def _header_key(name: str) -> bytes:
    """``name`` as ``lane_headers`` keys it (lower-case bytes)."""
    return name.lower().encode("latin-1")


#: The responder's header names (a handful, from code) as request field names. PERF: made
#: once a name, not twice (lower-cased, encoded) a look-up, three look-ups a request.
_HEADER_KEYS: Final[BoundedMemo[str, bytes]] = BoundedMemo(_header_key)


class LaneRequest:
    """What the infer responder reads of a request, by Falcon's request's names."""

    __slots__ = ("method", "path", "scope", "_headers", "_cycle")

    def __init__(
        self, path: str, scope: dict[str, Any], headers: dict[bytes, bytes], cycle: LaneCycle
    ) -> None:
        self.method = "POST"
        self.path = path
        self.scope = scope
        self._headers = headers
        self._cycle = cycle

    def get_header(
        self, name: str, required: bool = False, default: str | None = None
    ) -> str | None:
        value = self._headers.get(_HEADER_KEYS.get(name))
        return default if value is None else value.decode("latin-1")

    @property
    def content_length(self) -> int | None:
        value = self._headers.get(b"content-length")
        return int(value) if value else None  # digits: ``lane_request`` checked

    @property
    def stream(self) -> AsyncIterator[bytes]:
        """The body as it arrives, as Falcon's request stream reads it."""
        return _BodyStream(self._cycle)

    async def next_part(self) -> bytes:
        """The body's next bytes as they arrive; b"" once all came, or the client went.

        PERF: what ``stream`` gives, without the ``StopAsyncIteration`` that ends an
        ``async for`` (raised, and given a traceback entry, by compiled code: ~1 % of the
        front's CPU a tiny request, perf, 2026-12-01); ``front.rest.body`` reads with it.
        """
        return await self._cycle.next_part()


class _BodyStream:
    """A request's body as it arrives (``LaneCycle.next_part``); a client gone ends it, as
    Falcon's stream reads uvicorn's disconnect. An iterator class: mypyc compiles no async
    generator."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: LaneCycle) -> None:
        self._cycle = cycle

    def __aiter__(self) -> _BodyStream:
        return self

    async def __anext__(self) -> bytes:
        part = await self._cycle.next_part()
        if part:
            return part
        raise StopAsyncIteration


def lane_headers(fields: list[tuple[bytes, bytes]]) -> dict[bytes, bytes] | None:
    """A request's fields by name, repeated ones joined as Falcon's request joins them;
    None when the request goes the ASGI way: a field of ``LANE_REFUSES``, or one the
    header rules act on (``header_rules.check_http_head``: a second Host, a value ending
    in whitespace), which they then answer or strip there.

    PERF: one pass, where the header rules' check, the dict and the refusals took three
    (about 12 us a tiny request on this machine, ``cpu_per_request.py``); over a list (the
    scope's), indexed without an iterator.
    """
    headers: dict[bytes, bytes] = {}
    for name, value in fields:
        if name in LANE_REFUSES or value.endswith(OWS):
            return None
        if name not in headers or name in _SINGLETONS:
            if name == b"host" and name in headers:
                return None
            headers[name] = value
        else:
            headers[name] += b"," + value
    return headers


#: A query's and an escape's byte, as ints: ``b"?" in url`` first tries the operand as an
#: int, raising and formatting a TypeError it then drops (CPython's bytes ``in``), ~1 % of
#: the front's samples a tiny JSON request at c=1 (perf, 2026-11-30).
_QUERY: Final = ord("?")
_ESCAPE: Final = ord("%")


def lane_request(
    lane: InferLane,
    method: bytes,
    http_version: str,
    url: bytes,
    fields: list[tuple[bytes, bytes]],
) -> tuple[str, dict[bytes, bytes], str, str | None] | None:
    """The path, headers, model and version of a complete request head that the lane
    takes; None when it goes the ASGI way (a request behind a response under way, or with
    ``Expect``, the protocol keeps from the lane itself)."""
    if method != b"POST" or http_version != "1.1" or _QUERY in url or _ESCAPE in url:
        return None
    path = url.decode("ascii", "replace")
    target = lane.target(path)
    if target is None:
        return None
    headers = lane_headers(fields)
    if headers is None:
        return None
    length = headers.get(b"content-length")
    if length is not None and (not length.isdigit() or int(length) > lane.limit):
        return None  # Falcon's 400, or the app's 413
    return path, headers, *target


class LaneResponse:
    """What the infer responder and the error handlers set, by Falcon's response's names."""

    __slots__ = ("status", "data", "stream", "_headers")

    def __init__(self) -> None:
        self.status = 200
        self.data: bytes | None = None
        self.stream: AsyncIterator[bytes | memoryview] | None = None
        #: Lower-case names in the order they were set, as Falcon keeps them.
        self._headers: dict[str, str] = {}

    @property
    def status_code(self) -> int:
        return self.status

    @property
    def content_type(self) -> str | None:
        return self._headers.get("content-type")

    @content_type.setter
    def content_type(self, value: str) -> None:
        self._headers["content-type"] = value

    @property
    def content_length(self) -> str | None:
        return self._headers.get("content-length")

    # NOTE: the setter takes `object` (an int is what is set): compiled by mypyc, a
    #   property read as `str` and set as `int` wrote the int's tagged bits, a garbage
    #   number, as the response's content-length (mypy 2.4).
    @content_length.setter
    def content_length(self, value: object) -> None:
        self._headers["content-length"] = str(value)

    def set_header(self, name: str, value: str) -> None:
        self._headers[name.lower()] = str(value)

    def lines(self, length: int) -> list[bytes]:
        """The header lines of a response whose body has ``length`` bytes, in parts, as a
        head writes them: ``content-length`` set to it, in its place or last (where
        setting it puts it). PERF: the common names and values encoded once
        (``_LATIN1``), joined once with the rest of the head (``send_whole``): ``head``
        makes two bytes objects and a tuple a field."""
        parts: list[bytes] = []
        sized = False
        for name, value in self._headers.items():
            parts.append(_LATIN1.get(name))
            parts.append(b": ")
            if name == "content-length":
                sized = True
                parts.append(b"%d" % length)
            else:
                parts.append(_LATIN1.get(value))
            parts.append(b"\r\n")
        if not sized:
            parts.append(b"content-length: ")
            parts.append(b"%d" % length)
            parts.append(b"\r\n")
        return parts

    def head(self) -> list[tuple[bytes, bytes]]:
        """The headers as ASGI carries them."""
        return [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in self._headers.items()
        ]


def _encoded(text: str) -> bytes:
    return text.encode("latin-1")


#: Response header names and values (the few the responder sets) encoded, the same object
#: for the strings seen before.
_LATIN1: Final[BoundedMemo[str, bytes]] = BoundedMemo(_encoded)


class InferLane(Protocol):
    """The REST side of the lane (``front.rest.lane.RestInferLane``)."""

    #: The most body a request on the lane may declare (``--max-request-bytes``); above
    #: it the ASGI way answers 413.
    limit: int

    def target(self, path: str) -> tuple[str, str | None] | None:
        """The model and version of an infer route this lane answers here; None otherwise."""

    async def serve(
        self, request: LaneRequest, response: LaneResponse, model: str, version: str | None
    ) -> None:
        """Run the infer responder, its errors answered as the app answers them."""


async def respond(cycle: LaneCycle, response: LaneResponse) -> None:
    """Write ``response`` on ``cycle`` as Falcon's app and uvicorn's send would.

    A body in bytes (every small response, every error) goes as one write of its head
    and body, with ``content-length`` as Falcon sets it; a stream (large outputs as views,
    compressed ones) framed as uvicorn frames it (a length, or chunked).
    """
    data = response.data
    if data is not None:
        await cycle.send_whole(response.status, response.lines(len(data)), data)
        return
    stream = response.stream
    if stream is None:
        response.content_length = 0
    await cycle.send_stream(response.status, response.head(), stream)
