"""One client connection cannot take a worker's whole queue (``runtime/worker_share.py``).

A worker takes ``--max-queue-per-worker`` requests (256) before its model answers 503, and
one HTTP/2 connection may run 1,024 calls at once: one client filled the queue, and every
other client got 503 while it held it. Now a connection has at most half a worker's queue
(128) at the workers; its next requests wait in the front, in order, until one of its own
comes back. Here the worker is stopped (SIGSTOP) so that what each connection holds stays
put while it is counted: the requests of ``simple`` pending in the front (the metric)
count both those the worker has and those waiting for their connection's place.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from tritonclient.grpc import service_pb2 as pb

from tests.support.grpclib_calls import infer_simple, statistics
from tests.support.h2_rest import H2c
from tests.support.server import ServerProcess, pending, wait_for
from tests.support.tensors import SIMPLE_JSON

#: Half of ``--max-queue-per-worker``'s default, 256.
SHARE = 128


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    args = ["--model-control-mode", "explicit", "--load-model", "simple"]
    # (the worker is stopped for a while: not for long enough to be declared hung)
    proc = ServerProcess(args=[*args, "--worker-heartbeat-timeout", "300"]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log[-4000:]
    assert "Traceback" not in proc.log, proc.log[-4000:]


@pytest.fixture
async def stopped(srv: ServerProcess) -> AsyncIterator[int]:
    """The worker, stopped; continued at the end whatever happened, and every call the
    test left (a failed one's) ended before the next test counts what is pending."""
    (worker,) = srv.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    try:
        yield worker
    finally:
        os.kill(worker, signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*_FIRED, return_exceptions=True), 60)
        _FIRED.clear()
        assert await _pending(srv, 0, []), "requests left pending"


#: The calls a test fired (``_fire``), awaited by ``stopped`` at its end.
_FIRED: list[asyncio.Task[pb.ModelInferResponse]] = []


def _channel(srv: ServerProcess) -> Channel:
    """A grpclib channel: one HTTP/2 connection of its own."""
    host, port = srv.grpc_url.rsplit(":", 1)
    return Channel(host, int(port))


async def _pending(
    srv: ServerProcess, count: int, calls: list[asyncio.Task[pb.ModelInferResponse]]
) -> bool:
    """Whether ``count`` requests of ``simple`` come to be pending (polled off the loop)
    while none of ``calls`` has ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while await asyncio.to_thread(pending, srv, "simple") != count:
        if loop.time() > deadline or any(call.done() for call in calls):
            return False
        await asyncio.sleep(0.05)
    return True


def _ended(calls: list[asyncio.Task[pb.ModelInferResponse]]) -> list[object]:
    """How the first few of ``calls`` that ended did (for a failure's message)."""
    return [call.exception() or "answered" for call in calls if call.done()][:3]


def _fire(channel: Channel, seeds: range) -> list[asyncio.Task[pb.ModelInferResponse]]:
    calls = [asyncio.ensure_future(infer_simple(channel, seed)) for seed in seeds]
    _FIRED.extend(calls)
    return calls


async def test_one_connection_of_600_calls_leaves_half_the_queue_to_the_others(
    srv: ServerProcess, stopped: int
) -> None:
    hog, other, third = _channel(srv), _channel(srv), _channel(srv)
    try:
        calls = _fire(hog, range(600))
        # Every one of them taken: half at the worker, the rest waiting in the front (none
        # refused: without a share the worker's queue took 256 and the other 344 got 503).
        assert await _pending(srv, 600, calls), _ended(calls)
        # Another client still has half the queue: its 128 calls are taken too ...
        others = _fire(other, range(1000, 1000 + SHARE))
        assert await _pending(srv, 600 + SHARE, others), [
            c.exception() for c in others if c.done()
        ][:3]
        # ... and the queue is then full (each holds exactly its share): a third is refused.
        with pytest.raises(GRPCError) as refused:
            await infer_simple(third, 7)
        assert refused.value.status is Status.UNAVAILABLE, refused.value
        assert "overloaded" in str(refused.value.message)
        os.kill(stopped, signal.SIGCONT)
        # Every call of both is answered once the worker runs: waiting, not refused.
        for seed, call in zip(
            [*range(600), *range(1000, 1000 + SHARE)], [*calls, *others], strict=True
        ):
            reply = await asyncio.wait_for(call, 60)
            out = np.frombuffer(reply.raw_output_contents[0], np.int32)
            assert (out == np.arange(16) * seed + np.arange(16)).all(), seed
    finally:
        for channel in (hog, other, third):
            channel.close()


async def test_a_waiting_call_cancelled_never_runs_and_frees_its_place(
    srv: ServerProcess, stopped: int
) -> None:
    before = statistics(srv, "simple")
    hog = _channel(srv)
    try:
        held = _fire(hog, range(SHARE))
        assert await _pending(srv, SHARE, held)
        waiting = _fire(hog, range(SHARE, SHARE + 10))
        assert await _pending(srv, SHARE + 10, waiting)
        for call in waiting:
            call.cancel()
        assert await _pending(srv, SHARE, held)  # gone from the front at once
        os.kill(stopped, signal.SIGCONT)
        for call in held:
            await asyncio.wait_for(call, 60)
        # The connection's share is whole again: another 2 x 128 calls all answered.
        again = _fire(hog, range(2 * SHARE))
        assert len(await asyncio.wait_for(asyncio.gather(*again), 60)) == 2 * SHARE
        # The worker ran the 128 it had, then the 256, and never saw the 10 (without the
        # share it had all 138: a call cancelled once its worker has it runs all the same,
        # before those sent after it).
        after = statistics(srv, "simple")
        assert after["execution_count"] - before["execution_count"] == 3 * SHARE
        assert after["failed"] - before["failed"] == 10
    finally:
        hog.close()


async def test_a_waiting_call_still_ends_at_its_deadline(srv: ServerProcess, stopped: int) -> None:
    hog = _channel(srv)
    try:
        held = _fire(hog, range(SHARE))
        assert await _pending(srv, SHARE, held)
        with pytest.raises(GRPCError) as late:
            await infer_simple(hog, 1, timeout_us=500_000)
        assert late.value.status is Status.DEADLINE_EXCEEDED, late.value
        assert "waited in the front for this connection's earlier requests" in str(
            late.value.message
        )
        os.kill(stopped, signal.SIGCONT)
        for call in held:
            await asyncio.wait_for(call, 60)
    finally:
        hog.close()


async def test_rest_over_http2_shares_the_bound(srv: ServerProcess, stopped: int) -> None:
    """REST streams over HTTP/2 (h2c on the HTTP port) are served by the same connection
    code: one connection's 300 requests are all taken, none refused."""
    body = json.dumps(SIMPLE_JSON).encode()
    with H2c("127.0.0.1", srv.port) as h2:
        streams = [
            h2.start(
                "POST", "/v2/models/simple/infer", [("content-type", "application/json")], body
            )
            for _ in range(300)
        ]
        # (without the share: 256 at the worker, 44 answered 503 at once)
        assert wait_for(lambda: pending(srv, "simple") == 300), pending(srv, "simple")
        os.kill(stopped, signal.SIGCONT)
        for stream in streams:
            answer = h2.wait(stream)
            assert answer.status == 200, bytes(answer.body)
            (output, _) = json.loads(answer.body)["outputs"]
            assert output["data"] == [n + 1 for n in range(16)]
