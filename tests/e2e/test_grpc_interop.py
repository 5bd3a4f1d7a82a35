"""The front's HTTP/2 against a second client implementation: grpclib, on python-hyper's h2.

tritonclient and grpcio share grpc's C core; grpclib shares nothing with it (its HTTP/2 is
h2, with 64 KiB windows by default, its own HPACK encoder and frame sizes). The same calls
must get the same answers: unary calls, an 8 MiB message each way through the small
windows, a status with its message, and a stream answered in order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from tritonclient.grpc import service_pb2 as pb

from tests.support.server import ServerProcess

SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture
async def channel(server: ServerProcess) -> AsyncIterator[Channel]:
    host, port = server.grpc_url.rsplit(":", 1)
    opened = Channel(host, int(port))
    yield opened
    opened.close()


async def unary(channel: Channel, method: str, request: Any, reply_type: Any) -> Any:
    call = channel.request(SERVICE + method, Cardinality.UNARY_UNARY, type(request), reply_type)
    async with call as stream:
        await stream.send_message(request, end=True)
        reply = await stream.recv_message()
        await stream.recv_trailing_metadata()
        return reply


def simple_request(seed: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple", id=f"r{seed}")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append((np.arange(16, dtype=np.int32) * seed).tobytes())
    return request


def first_output(reply: pb.ModelInferResponse) -> list[int]:
    return np.frombuffer(reply.raw_output_contents[0], np.int32).tolist()


async def test_unary_calls_answer_alike(channel: Channel) -> None:
    live = await unary(channel, "ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse)
    assert live.live
    meta = await unary(
        channel, "ModelMetadata", pb.ModelMetadataRequest(name="simple"), pb.ModelMetadataResponse
    )
    assert meta.name == "simple" and [t.name for t in meta.inputs] == ["INPUT0", "INPUT1"]
    for seed in range(1, 4):
        reply = await unary(channel, "ModelInfer", simple_request(seed), pb.ModelInferResponse)
        assert reply.id == f"r{seed}"
        assert first_output(reply) == [2 * seed * i for i in range(16)]


async def test_a_large_message_each_way_through_small_windows(channel: Channel) -> None:
    values = np.random.default_rng(3).random(2 * 1024 * 1024, dtype=np.float32)  # 8 MiB
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, values.size])
    request.raw_input_contents.append(values.tobytes())
    reply = await unary(channel, "ModelInfer", request, pb.ModelInferResponse)
    assert reply.raw_output_contents[0] == values.tobytes()


async def test_a_failure_is_a_status_with_its_message(channel: Channel) -> None:
    with pytest.raises(GRPCError) as info:
        await unary(
            channel, "ModelInfer", pb.ModelInferRequest(model_name="nope"), pb.ModelInferResponse
        )
    assert info.value.status == Status.NOT_FOUND
    assert "nope" in (info.value.message or "")


async def test_a_stream_is_answered_in_order(channel: Channel) -> None:
    call = channel.request(
        SERVICE + "ModelStreamInfer",
        Cardinality.STREAM_STREAM,
        pb.ModelInferRequest,
        pb.ModelStreamInferResponse,
    )
    async with call as stream:
        for seed in range(1, 4):
            await stream.send_message(simple_request(seed))
        await stream.end()
        replies = [await stream.recv_message() for _ in range(3)]
        assert await stream.recv_message() is None
    assert [r.infer_response.id for r in replies] == ["r1", "r2", "r3"]  # type: ignore[union-attr]
    assert all(not r.error_message for r in replies)  # type: ignore[union-attr]
