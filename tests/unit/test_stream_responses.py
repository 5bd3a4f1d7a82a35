"""ModelStreamInfer's ordering loop (oipserve.front.grpc.streaming.ordered_responses)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from oipserve.errors import InvalidInput
from oipserve.front.grpc.handler_context import Context
from oipserve.front.grpc.stream_window import StreamWindow
from oipserve.front.grpc.streaming import ordered_responses
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.runtime.stream_budget import StreamBudget


async def _requests(names: list[str]) -> AsyncIterator[str]:
    for name in names:
        yield name
    await asyncio.Event().wait()  # the client keeps the stream open


async def _infer(request: str) -> bytes:
    if request.startswith("bad"):
        raise InvalidInput(f"{request} does not parse")
    await asyncio.sleep(0.05 if request == "slow" else 0)
    return request.encode()


def _stream(names: list[str]) -> AsyncIterator[list[bytes | memoryview]]:
    return ordered_responses(_requests(names), _infer, Context(()))  # type: ignore[arg-type]


def _one_slot() -> Callable[[str], Awaitable[bytes]]:
    """A one-slot sequence model's way with requests: "start" waits for the slot that "end"
    frees; every request is answered with its own name."""
    freed = asyncio.Event()

    async def infer(request: str) -> bytes:
        if request == "start":
            await freed.wait()
        elif request == "end":
            freed.set()
        return request.encode()

    return infer


def _held(release: asyncio.Event, started: list[str]) -> Callable[[str], Awaitable[bytes]]:
    """A model whose requests, noted in ``started``, run until ``release`` is set."""

    async def infer(request: str) -> bytes:
        started.append(request)
        await release.wait()
        return request.encode()

    return infer


async def test_answers_come_in_request_order_and_failures_in_band() -> None:
    stream = _stream(["slow", "bad1", "ok"])
    answers = [await anext(stream) for _ in range(3)]
    assert bytes(answers[0][1]) == b"slow"
    failed = pb.ModelStreamInferResponse.FromString(b"".join(answers[1]))
    assert failed.error_message == "bad1 does not parse"
    assert bytes(answers[2][1]) == b"ok"
    await stream.aclose()


async def test_answers_waiting_for_an_earlier_one_do_not_stop_the_reading() -> None:
    """A request that waits for one read after 100 others (a sequence's START waiting for
    the slot that another sequence's END frees) is answered: the answers behind it wait,
    and reading goes on. It stopped after 64 unanswered, and the END was never read."""
    infer = _one_slot()

    names = ["start", *(f"step{i}" for i in range(100)), "end"]
    stream = ordered_responses(_requests(names), infer, Context(()))  # type: ignore[arg-type]

    async def answers() -> list[bytes]:
        return [bytes((await anext(stream))[1]) for _ in names]

    assert await asyncio.wait_for(answers(), 5) == [name.encode() for name in names]
    await stream.aclose()


def _slot_model(window: StreamWindow) -> Callable[[str], Awaitable[bytes]]:
    """A model whose requests named ``start...`` wait for the one slot (told ``parked``, as
    the sequence batcher tells) until the request ``end`` frees it; each answers its name."""
    freed = asyncio.Event()

    async def infer(request: str) -> bytes:
        if request.startswith("start"):
            window.parked(True)
            await freed.wait()
            window.parked(False)
        elif request == "end":
            freed.set()
        return request.encode()

    return infer


async def test_requests_waiting_for_a_slot_do_not_stop_the_reading() -> None:
    """100 STARTs wait for the one slot (told ``parked``, as the sequence batcher tells),
    the END that frees it comes after them: read, and every request answered. The STARTs
    counted as running: the reading stopped at 64, and the END was never read."""
    window = StreamWindow(StreamBudget())
    infer = _slot_model(window)
    names = [*(f"start{i}" for i in range(100)), "end"]
    stream = ordered_responses(_requests(names), infer, Context(()), window)  # type: ignore[arg-type]

    async def answers() -> list[bytes]:
        return [bytes((await anext(stream))[1]) for _ in names]

    assert await asyncio.wait_for(answers(), 5) == [name.encode() for name in names]
    assert window.running == 0
    await stream.aclose()


async def test_answers_behind_a_request_waiting_for_a_slot_do_not_stop_the_reading() -> None:
    """A START waits for the slot (told ``parked``), 1,100 requests are answered behind it,
    then the END that frees the slot: read, and every request answered. The stream's
    1,024 answers waiting stopped the reading there, and the END was never read."""
    window = StreamWindow(StreamBudget())
    infer = _slot_model(window)
    names = ["start", *(f"step{i}" for i in range(1100)), "end"]
    stream = ordered_responses(_requests(names), infer, Context(()), window)  # type: ignore[arg-type]

    async def answers() -> list[bytes]:
        return [bytes((await anext(stream))[1]) for _ in names]

    assert await asyncio.wait_for(answers(), 10) == [name.encode() for name in names]
    assert (window.running, window.waiting) == (0, 0)
    await stream.aclose()


async def test_reading_waits_while_64_requests_run() -> None:
    """The bound on what a stream may hold: at most 64 of its requests run at once."""
    release = asyncio.Event()
    started: list[str] = []
    infer = _held(release, started)

    names = [f"r{i}" for i in range(100)]
    stream = ordered_responses(_requests(names), infer, Context(()))  # type: ignore[arg-type]
    first = asyncio.ensure_future(anext(stream))
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(started) == 64
    release.set()
    assert bytes((await first)[1]) == b"r0"
    rest = [bytes((await anext(stream))[1]) for _ in names[1:]]
    assert rest == [name.encode() for name in names[1:]]
    await stream.aclose()


async def test_a_connections_streams_share_one_budget() -> None:
    """Two streams of one connection whose budget is 4: 4 of their requests are read and
    unanswered at once in all, and every request is answered once they end. One
    connection's 1,000 streams with their windows closed held 64 requests and answers each:
    64,000, 660 MiB of the front (found by fuzzing)."""
    budget = StreamBudget(4)
    release = asyncio.Event()
    started: list[str] = []
    infer = _held(release, started)

    names = {key: [f"{key}{i}" for i in range(10)] for key in "ab"}
    streams = [
        ordered_responses(_requests(names[key]), infer, Context(()), StreamWindow(budget))  # type: ignore[arg-type]
        for key in "ab"
    ]

    async def read_all(stream: AsyncIterator[list[bytes | memoryview]]) -> list[bytes]:
        return [bytes((await anext(stream))[1]) for _ in range(10)]

    reading = asyncio.gather(*(read_all(stream) for stream in streams))
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(started) == budget.requests == 4
    release.set()
    answers = await asyncio.wait_for(reading, 5)
    assert answers == [[name.encode() for name in names[key]] for key in "ab"]
    assert (budget.requests, budget.held_bytes) == (0, 0)
    for stream in streams:
        await stream.aclose()


async def test_a_stream_torn_down_gives_its_share_of_the_budget_back() -> None:
    budget = StreamBudget(8)
    release = asyncio.Event()

    async def infer(request: str) -> bytes:
        if request != "r0":
            await release.wait()
        return request.encode()

    stream = ordered_responses(
        _requests([f"r{i}" for i in range(5)]),
        infer,
        Context(()),
        StreamWindow(budget),
    )  # type: ignore[arg-type]
    assert bytes((await anext(stream))[1]) == b"r0"
    for _ in range(20):
        await asyncio.sleep(0)
    assert budget.requests == 4  # read, running
    await stream.aclose()  # the client reset the stream
    assert (budget.requests, budget.held_bytes) == (0, 0)


async def test_answers_behind_a_waiting_request_leave_the_connection_room() -> None:
    """Stream A's first request waits for one of stream B's (a START waiting for the slot
    B's END frees), with more answered requests behind it than the connection's budget:
    they wait on the server's account, and B's END is still read. Charged as held back by
    the client, they held the budget, and B's END was never read (found by fuzzing)."""
    budget = StreamBudget(limit=8)
    infer = _one_slot()

    names = {"a": ["start", *(f"a{i}" for i in range(20))], "b": ["b0", "end"]}
    streams = {
        key: ordered_responses(_requests(names[key]), infer, Context(()), StreamWindow(budget))  # type: ignore[arg-type]
        for key in "ab"
    }

    async def read_all(key: str) -> list[bytes]:
        return [bytes((await anext(streams[key]))[1]) for _ in names[key]]

    got = await asyncio.wait_for(asyncio.gather(read_all("a"), read_all("b")), 5)
    assert got == [[name.encode() for name in names[key]] for key in "ab"]
    for stream in streams.values():
        await stream.aclose()
    assert (budget.requests, budget.behind, budget.held_bytes) == (0, 0, 0)
