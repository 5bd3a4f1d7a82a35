"""Calls through grpclib (python-hyper's h2: one channel, one HTTP/2 connection of its own)
and what the server counts of them."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
from grpclib.client import Channel
from grpclib.const import Cardinality
from tritonclient.grpc import service_pb2 as pb

from tests.support.server import ServerProcess

INFER = "/inference.GRPCInferenceService/ModelInfer"


def simple_request(seed: int, timeout_us: int = 0) -> pb.ModelInferRequest:
    """The sample model ``simple``'s request: INPUT0 = 0..15 times ``seed``, INPUT1 = 0..15;
    with ``timeout_us``, its ``timeout`` parameter (the server's deadline alone)."""
    request = pb.ModelInferRequest(model_name="simple", id=f"r{seed}")
    for name, data in (("INPUT0", np.arange(16) * seed), ("INPUT1", np.arange(16))):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(data.astype(np.int32).tobytes())
    if timeout_us:
        request.parameters["timeout"].int64_param = timeout_us
    return request


async def infer_simple(channel: Channel, seed: int, timeout_us: int = 0) -> pb.ModelInferResponse:
    """One ModelInfer call of ``simple_request(seed, timeout_us)``; GRPCError if refused."""
    return await infer(channel, simple_request(seed, timeout_us))


def vector_request(
    model: str, name: str, seed: int, size: int, timeout_us: int = 0
) -> pb.ModelInferRequest:
    """A request of one FP32 row of ``size`` values, all ``seed``, as input ``name`` of
    ``model`` (``identity_fp32``'s INPUT0, an ensemble's X); with ``timeout_us``, its
    ``timeout`` parameter."""
    request = pb.ModelInferRequest(model_name=model, id=f"{model}-{seed}")
    request.inputs.add(name=name, datatype="FP32", shape=[1, size])
    request.raw_input_contents.append(np.full(size, seed, np.float32).tobytes())
    if timeout_us:
        request.parameters["timeout"].int64_param = timeout_us
    return request


async def infer(channel: Channel, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """One ModelInfer call of ``request``; GRPCError if refused."""
    call = channel.request(
        INFER, Cardinality.UNARY_UNARY, pb.ModelInferRequest, pb.ModelInferResponse
    )
    async with call as stream:
        await stream.send_message(request, end=True)
        reply = await stream.recv_message()
        await stream.recv_trailing_metadata()
    assert reply is not None
    return reply


async def model_ready(channel: Channel, model: str) -> bool:
    """ModelReady of ``model`` on ``channel``'s connection."""
    call = channel.request(
        "/inference.GRPCInferenceService/ModelReady",
        Cardinality.UNARY_UNARY,
        pb.ModelReadyRequest,
        pb.ModelReadyResponse,
    )
    async with call as stream:
        await stream.send_message(pb.ModelReadyRequest(name=model), end=True)
        reply = await stream.recv_message()
        await stream.recv_trailing_metadata()
    assert reply is not None
    return reply.ready


def statistics(server: ServerProcess, model: str) -> dict[str, int]:
    """``model``'s counts as its statistics give them (REST): successes, failures,
    inferences and executions."""
    with urllib.request.urlopen(f"{server.url}/v2/models/{model}/stats", timeout=10) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    inference = stats["inference_stats"]
    return {
        "success": inference["success"]["count"],
        "failed": inference["fail"]["count"],
        "inference_count": stats["inference_count"],
        "execution_count": stats["execution_count"],
    }
