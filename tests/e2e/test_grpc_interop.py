"""The front's HTTP/2 against independent gRPC stacks: grpclib, on python-hyper's h2, and
tritonclient.grpc, on grpc's C core (Node's @grpc/grpc-js: test_grpc_js_interop.py).

tritonclient and grpcio share grpc's C core; grpclib shares nothing with it (its HTTP/2 is
h2, with 64 KiB windows by default, its own HPACK encoder and frame sizes). The same calls
must get the same answers: unary calls, an 8 MiB message each way through the small
windows, a status with its message, and a stream answered in order with an 8 MiB message
and an in-band failure among small ones. tests/e2e/test_grpc.py covers tritonclient's unary
calls (64 MiB included); its stream with a large message is here.
"""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from tritonclient.grpc import service_pb2 as pb

from tests.support.server import ServerProcess
from tests.support.tensors import simple_inputs

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


def seeded_inputs(seed: int) -> list[grpcclient.InferInput]:
    """``simple_request(seed)``'s inputs, for tritonclient.grpc."""
    values = (np.arange(16, dtype=np.int32) * seed).reshape(1, 16)
    return simple_inputs(values, values)


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


def large_request(request_id: str = "") -> tuple[pb.ModelInferRequest, bytes]:
    """An 8 MiB FP32 ``identity_fp32`` request, past gRPC's 4 MiB default limits; its bytes."""
    values = np.random.default_rng(3).random(2 * 1024 * 1024, dtype=np.float32)
    request = pb.ModelInferRequest(model_name="identity_fp32", id=request_id)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, values.size])
    request.raw_input_contents.append(values.tobytes())
    return request, values.tobytes()


async def test_a_large_message_each_way_through_small_windows(channel: Channel) -> None:
    request, sent = large_request()
    reply = await unary(channel, "ModelInfer", request, pb.ModelInferResponse)
    assert reply.raw_output_contents[0] == sent


async def test_a_failure_is_a_status_with_its_message(channel: Channel) -> None:
    with pytest.raises(GRPCError) as info:
        await unary(
            channel, "ModelInfer", pb.ModelInferRequest(model_name="nope"), pb.ModelInferResponse
        )
    assert info.value.status == Status.NOT_FOUND
    assert "nope" in (info.value.message or "")


async def test_a_stream_is_answered_in_order(channel: Channel) -> None:
    """Small messages, an 8 MiB one through the 64 KiB windows and an unknown model: answered
    in request order, the failure in-band, and the stream goes on."""
    call = channel.request(
        SERVICE + "ModelStreamInfer",
        Cardinality.STREAM_STREAM,
        pb.ModelInferRequest,
        pb.ModelStreamInferResponse,
    )
    large, sent = large_request("big")
    unknown = pb.ModelInferRequest(model_name="nope", id="bad")
    requests = [simple_request(1), large, simple_request(2), unknown, simple_request(3)]
    async with call as stream:
        for request in requests:
            await stream.send_message(request)
        await stream.end()
        replies = [await stream.recv_message() for _ in requests]
        assert await stream.recv_message() is None
    errors = [r.error_message if r else None for r in replies]
    assert errors == ["", "", "", errors[3], ""] and "'nope'" in (errors[3] or "")
    answered = [r.infer_response for r in replies if r and not r.error_message]
    assert [r.id for r in answered] == ["r1", "big", "r2", "r3"]
    assert answered[1].raw_output_contents[0] == sent
    assert first_output(answered[3]) == [6 * i for i in range(16)]


def test_tritonclient_streams_a_large_message_in_order(server: ServerProcess) -> None:
    """tritonclient.grpc (grpc's C core) on the same stream: 8 MiB among small messages."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    _, sent = large_request()
    big = grpcclient.InferInput("INPUT0", [1, len(sent) // 4], "FP32")
    big.set_data_from_numpy(np.frombuffer(sent, np.float32).reshape(1, -1))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("simple", seeded_inputs(1), request_id="r1")
        client.async_stream_infer("identity_fp32", [big], request_id="big")
        client.async_stream_infer("simple", seeded_inputs(2), request_id="r2")
        got = [results.get(timeout=60) for _ in range(3)]
        client.stop_stream()
    assert [error for _, error in got] == [None, None, None]
    assert [result.get_response().id for result, _ in got] == ["r1", "big", "r2"]
    assert got[1][0].as_numpy("OUTPUT0").tobytes() == sent
    assert got[2][0].as_numpy("OUTPUT0").ravel().tolist() == [4 * i for i in range(16)]
