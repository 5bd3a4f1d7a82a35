"""ModelStreamInfer's ordering loop (oipserve.front.grpc.streaming.ordered_responses)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from oipserve.errors import InvalidInput
from oipserve.front.grpc.handler_context import Context
from oipserve.front.grpc.streaming import ordered_responses
from oipserve.grpc_generated import grpc_service_pb2 as pb


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
    return ordered_responses(_requests(names), _infer, asyncio.Event(), Context(()))  # type: ignore[arg-type]


async def test_answers_come_in_request_order_and_failures_in_band() -> None:
    stream = _stream(["slow", "bad1", "ok"])
    answers = [await anext(stream) for _ in range(3)]
    assert bytes(answers[0][1]) == b"slow"
    failed = pb.ModelStreamInferResponse.FromString(b"".join(answers[1]))
    assert failed.error_message == "bad1 does not parse"
    assert bytes(answers[2][1]) == b"ok"
    await stream.aclose()
