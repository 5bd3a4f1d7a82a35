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
    call = channel.request(
        INFER, Cardinality.UNARY_UNARY, pb.ModelInferRequest, pb.ModelInferResponse
    )
    async with call as stream:
        await stream.send_message(simple_request(seed, timeout_us), end=True)
        reply = await stream.recv_message()
        await stream.recv_trailing_metadata()
    assert reply is not None
    return reply


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
