"""One client connection cannot take a worker's whole queue (``runtime/worker_share.py``).

A worker takes ``--max-queue-per-worker`` requests (256) before its model answers 503, and
one HTTP/2 connection may run 1,024 calls at once: one client filled the queue, and every
other client got 503 while it held it. Now a connection has at most half a worker's queue
(128) at the workers; its next requests wait in the front, in order, until one of its own
comes back, a share's count of them at most: past those, it is refused 503/UNAVAILABLE at
once. Here the worker is stopped (SIGSTOP) so that what each connection holds stays
put while it is counted: the requests of ``simple`` pending in the front (the metric)
count both those the worker has and those waiting for their connection's place.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from tritonclient.grpc import service_pb2 as pb

from tests.support.ensemble_models import fan_config, write_ensemble, write_repository
from tests.support.grpclib_calls import (
    infer,
    infer_simple,
    model_ready,
    simple_request,
    statistics,
    vector_request,
)
from tests.support.h2_rest import Answer, H2c
from tests.support.server import (
    ServerProcess,
    front_pid,
    pending,
    socket_to_front,
    stopped_worker,
    wait_for,
)
from tests.support.tensors import SIMPLE_JSON

#: Half of ``--max-queue-per-worker``'s default, 256.
SHARE = 128
#: ``srv``'s --body-timeout: a message only partly in that long (and a second per 64 KiB
#: received) fails DEADLINE_EXCEEDED, unless the server is what holds it back.
BODY_TIMEOUT = 2


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    args = ["--model-control-mode", "explicit", "--load-model", "simple"]
    args += ["--load-model", "identity_fp32", "--body-timeout", str(BODY_TIMEOUT)]
    # (the worker is stopped for a while: not for long enough to be declared hung)
    proc = ServerProcess(args=[*args, "--worker-heartbeat-timeout", "300"]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log[-4000:]
    assert "Traceback" not in proc.log, proc.log[-4000:]


@pytest.fixture
async def stopped(srv: ServerProcess) -> AsyncIterator[int]:
    """The worker, stopped; continued at the end whatever happened, and every call the
    test left (a failed one's) ended before the next test counts what is pending."""
    try:
        with stopped_worker(srv) as worker:
            yield worker
    finally:
        await asyncio.wait_for(asyncio.gather(*_FIRED, return_exceptions=True), 60)
        _FIRED.clear()
        assert await _pending(srv, 0, []), "requests left pending"
        assert wait_for(lambda: pending(srv, "identity_fp32") == 0), "requests left pending"


#: The calls a test fired (``_fire``), awaited by ``stopped`` at its end.
_FIRED: list[asyncio.Task[pb.ModelInferResponse]] = []
#: The 503 of a request past its connection's share with a share's count waiting.
WAITING_FULL = f"{SHARE} requests at the workers and {SHARE} more waiting for them"


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


def _fire_vectors(
    channel: Channel, count: int, size: int
) -> list[asyncio.Task[pb.ModelInferResponse]]:
    """``count`` calls of ``identity_fp32`` of ``size`` values each, the n-th all n."""
    calls = [
        asyncio.ensure_future(infer(channel, vector_request("identity_fp32", "INPUT0", n, size)))
        for n in range(count)
    ]
    _FIRED.extend(calls)
    return calls


def _refused(calls: list[asyncio.Task[pb.ModelInferResponse]]) -> list[GRPCError]:
    """The refusals among ``calls`` that ended."""
    return [
        call.exception()  # type: ignore[misc]
        for call in calls
        if call.done() and isinstance(call.exception(), GRPCError)
    ]


async def test_one_connection_of_600_calls_leaves_half_the_queue_to_the_others(
    srv: ServerProcess, stopped: int
) -> None:
    hog, other, third = _channel(srv), _channel(srv), _channel(srv)
    try:
        calls = _fire(hog, range(600))
        # Half a queue at the worker, as many waiting in the front, the other 344 refused
        # at once, saying why (without a share the worker's queue took 256 and the other
        # 344 got 503 'overloaded'; with no bound on the waiting, all 600 waited).
        assert await asyncio.to_thread(wait_for, lambda: len(_refused(calls)) == 600 - 2 * SHARE), (
            _ended(calls)
        )
        assert await _pending(srv, 2 * SHARE, calls[: 2 * SHARE]), _ended(calls)
        for refused in _refused(calls):
            assert refused.status is Status.UNAVAILABLE, refused
            assert WAITING_FULL in str(refused.message), refused
        # Another client still has half the queue: its 128 calls are taken too ...
        others = _fire(other, range(1000, 1000 + SHARE))
        assert await _pending(srv, 2 * SHARE + SHARE, others), [
            c.exception() for c in others if c.done()
        ][:3]
        # ... and the queue is then full (each holds exactly its share): a third is refused.
        with pytest.raises(GRPCError) as refused:
            await infer_simple(third, 7)
        assert refused.value.status is Status.UNAVAILABLE, refused.value
        assert "overloaded" in str(refused.value.message)
        os.kill(stopped, signal.SIGCONT)
        # Every call of both taken is answered once the worker runs.
        taken = calls[: 2 * SHARE]
        for seed, call in zip(
            [*range(2 * SHARE), *range(1000, 1000 + SHARE)], [*taken, *others], strict=True
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
    code: of one connection's 300 requests 256 are taken (128 at the worker, 128 waiting),
    the other 44 refused 503 with Retry-After, saying why."""
    body = json.dumps(SIMPLE_JSON).encode()
    with H2c("127.0.0.1", srv.port) as h2:
        streams = [
            h2.start(
                "POST", "/v2/models/simple/infer", [("content-type", "application/json")], body
            )
            for _ in range(300)
        ]
        # (without the share: 256 at the worker, 44 answered 503 'overloaded' at once)
        assert wait_for(lambda: pending(srv, "simple") == 2 * SHARE), pending(srv, "simple")
        for stream in streams[2 * SHARE :]:
            answer = h2.wait(stream)
            assert answer.status == 503 and answer.headers["retry-after"] == "1", answer
            assert WAITING_FULL in json.loads(answer.body)["error"], bytes(answer.body)
        os.kill(stopped, signal.SIGCONT)
        for stream in streams[: 2 * SHARE]:
            answer = h2.wait(stream)
            assert answer.status == 200, bytes(answer.body)
            (output, _) = json.loads(answer.body)["outputs"]
            assert output["data"] == [n + 1 for n in range(16)]


async def test_its_other_calls_go_through_while_its_requests_wait(
    srv: ServerProcess, stopped: int
) -> None:
    """A waiting call holds the last part of its message against the connection's receive
    window (16 MiB) until it ends: with no bound on the waiting, 600 calls of 32 KiB
    spent it all, and the connection's next call, even one the front answers, could not
    be sent. Bounded, the calls refused give their window back at once."""
    hog = _channel(srv)
    try:
        calls = _fire_vectors(hog, 600, 8 * 1024)
        assert await asyncio.to_thread(wait_for, lambda: len(_refused(calls)) == 600 - 2 * SHARE), (
            _ended(calls)
        )
        assert await asyncio.wait_for(model_ready(hog, "simple"), 10)
        os.kill(stopped, signal.SIGCONT)
        replies = await asyncio.wait_for(asyncio.gather(*calls[: 2 * SHARE]), 60)
        for n, reply in enumerate(replies):
            assert np.frombuffer(reply.raw_output_contents[0], np.float32)[0] == n
    finally:
        hog.close()


async def test_large_calls_leave_the_connections_window_to_its_other_calls(
    srv: ServerProcess, stopped: int
) -> None:
    """300 calls of 128 KiB: 128 of them at the stopped worker held the connection's whole
    receive window (16 MiB), so its next call, even a ModelReady, was never read. Now its
    requests hold at most half the window at the workers and three quarters with those
    waiting: the others are refused at once, saying why, and a ModelReady goes through."""
    hog = _channel(srv)
    try:
        calls = _fire_vectors(hog, 300, 32 * 1024)
        assert await asyncio.to_thread(
            wait_for, lambda: len(_refused(calls)) + pending(srv, "identity_fp32") == 300
        ), _ended(calls)
        taken = pending(srv, "identity_fp32")
        assert 80 <= taken <= 96, taken  # (12 MiB of 128 KiB messages and their framing)
        for refused in _refused(calls):
            assert refused.status is Status.UNAVAILABLE, refused
            assert "MiB of its 16 MiB receive window" in str(refused.message), refused
        assert await asyncio.wait_for(model_ready(hog, "simple"), 10)
        os.kill(stopped, signal.SIGCONT)
        await asyncio.wait(calls, timeout=60)
        answered = [call for call in calls if call.exception() is None]
        assert len(answered) == taken, _ended(calls)
        for call in answered:
            n = int(call.result().id.rsplit("-", 1)[1])
            assert np.frombuffer(call.result().raw_output_contents[0], np.float32)[0] == n
    finally:
        hog.close()


#: The small server's --max-queue-per-worker, and a connection's share of it.
SMALL_QUEUE, SMALL_SHARE = 8, 4
#: The steps of ``fan``, all run at once: more than a share at the workers and a share
#: waiting.
FAN = 3 * SMALL_SHARE


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A worker's queue of 8 (a connection's share 4), the ensembles' models, ``chain``
    (add_one then double, run as one chain) loaded."""
    root = write_repository(tmp_path_factory.mktemp("share-ensembles"), slow_nodes=10)
    write_ensemble(root, "fan", fan_config("fan", FAN))
    args = ["--model-control-mode", "explicit", "--load-model", "chain", "--load-model", "fan"]
    args += ["--max-queue-per-worker", str(SMALL_QUEUE), "--worker-heartbeat-timeout", "300"]
    proc = ServerProcess(root, args=args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log[-4000:]
    assert "Traceback" not in proc.log, proc.log[-4000:]


@pytest.fixture
def small_stopped(small: ServerProcess) -> Iterator[int]:
    with stopped_worker(small) as worker:
        yield worker


async def test_large_json_bodies_over_h2c_take_places_in_the_share(
    small: ServerProcess, small_stopped: int
) -> None:
    """A JSON body of 1 MiB or more is parsed by the model's worker, its large ``data``
    decoded there: those jobs take a place in the connection's share as its inferences do
    (sent outside it, one h2c connection's 16 bodies filled the worker's queue of 8 and
    another client got 503 'overloaded')."""
    size = 300_000
    inputs = [{"name": "IN", "datatype": "FP32", "shape": [1, size], "data": [0.5] * size}]
    body = json.dumps({"inputs": inputs}).encode()
    headers = [("content-type", "application/json")]
    other = _channel(small)
    with H2c("127.0.0.1", small.port) as h2:
        streams = [h2.start("POST", "/v2/models/add_one/infer", headers, body) for _ in range(16)]
        # 4 at the worker, 4 waiting for their place, the other 8 refused
        refused = [h2.wait(stream) for stream in streams[2 * SMALL_SHARE :]]
        assert all(answer.status == 503 for answer in refused), refused[0]
        late = asyncio.ensure_future(infer(other, vector_request("add_one", "IN", 1, 4)))
        try:
            # another client's request is taken (pending until the worker answers it)
            assert await asyncio.to_thread(
                wait_for, lambda: late.done() or pending(small, "add_one") >= 1
            )
            assert not late.done(), late.exception()
        finally:
            os.kill(small_stopped, signal.SIGCONT)
            answered = await asyncio.wait_for(asyncio.gather(late, return_exceptions=True), 60)
            other.close()
        assert not isinstance(answered[0], BaseException), answered[0]
        for stream in streams[: 2 * SMALL_SHARE]:
            answer = h2.wait(stream)
            assert answer.status == 200, bytes(answer.body)[:200]


async def test_a_chain_failed_waiting_for_its_place_counts_against_its_first_model(
    small: ServerProcess, small_stopped: int
) -> None:
    """An ensemble's chain that ends at its deadline waiting for its connection's place is
    a failure of its first model (add_one), as a chain failing anywhere else is, and a
    step run alone; it went uncounted."""
    before = statistics(small, "add_one")["failed"]
    hog = _channel(small)
    try:
        held = [
            asyncio.ensure_future(infer(hog, vector_request("chain", "X", n, 4)))
            for n in range(SMALL_SHARE)
        ]
        assert await asyncio.to_thread(wait_for, lambda: pending(small, "add_one") == SMALL_SHARE)
        for n in range(3):
            with pytest.raises(GRPCError) as late:
                await infer(hog, vector_request("chain", "X", n, 4, timeout_us=200_000))
            assert late.value.status is Status.DEADLINE_EXCEEDED, late.value
        assert statistics(small, "add_one")["failed"] - before == 3
        os.kill(small_stopped, signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*held), 60)
    finally:
        hog.close()


async def test_an_ensembles_own_steps_never_refuse_it(small: ServerProcess) -> None:
    """One request of ``fan``: 12 steps at once, each a request of add_one sent alone,
    each taking a place in its connection's share (4, 4 more waiting). Its last 4 steps
    were refused 503 'this connection has 4 requests at the workers and 4 more waiting',
    and the request with them: refused because of itself. A step waits for its place,
    never refused for the waiting; the request is answered."""
    before = statistics(small, "add_one")["failed"]
    channel = _channel(small)
    try:
        reply = await asyncio.wait_for(infer(channel, vector_request("fan", "X", 2, 4)), 60)
        assert sorted(out.name for out in reply.outputs) == sorted(f"Y{n}" for n in range(FAN))
        for raw in reply.raw_output_contents:
            assert np.frombuffer(raw, np.float32).tolist() == [3.0] * 4
        # (the steps waited in the front, not at the worker: its queue of 8 never overflowed)
        assert statistics(small, "add_one")["failed"] == before
    finally:
        channel.close()


@pytest.fixture(scope="module")
def two_fronts() -> Iterator[ServerProcess]:
    """Two fronts, a worker's queue of 8 (a connection's share 4), and the worker endpoint
    ``onnxruntime`` serving ``simple``: a model only the primary serves."""
    args = ["--http-workers", "2", "--model-control-mode", "explicit"]
    args += ["--max-queue-per-worker", str(SMALL_QUEUE), "--worker-heartbeat-timeout", "300"]
    proc = ServerProcess(args=args).wait_ready()
    body = json.dumps({"model": "simple", "device": "cpu"}).encode()
    load = urllib.request.Request(
        f"{proc.url}/v2/workers/onnxruntime/load", data=body, method="POST"
    )
    with urllib.request.urlopen(load, timeout=120) as answer:
        assert answer.read() == b"onnxruntime"
    yield proc
    assert proc.stop() == 0, proc.log[-4000:]
    assert "Traceback" not in proc.log, proc.log[-4000:]


def _another_client_is_taken(probe: H2c, request: pb.ModelInferRequest) -> None:
    """Another client's call, with the workers stopped, is taken at the worker (not
    refused for a full queue): it waits there until its 500 ms timeout."""
    late = pb.ModelInferRequest()
    late.CopyFrom(request)
    late.parameters["timeout"].int64_param = 500_000
    answer = probe.wait(probe.grpc("ModelInfer", late.SerializeToString()))
    assert _grpc_status(answer) == Status.DEADLINE_EXCEEDED.value, answer


def _grpc_status(answer: Answer) -> int:
    return int(answer.trailers.get("grpc-status", answer.headers.get("grpc-status", "-1")))


def test_calls_another_front_forwards_to_the_primary_keep_to_their_share(
    two_fronts: ServerProcess,
) -> None:
    """A connection on the other front calling a worker endpoint's model: its calls are
    forwarded to the primary over its private socket, which counts no one's (one
    connection of many clients), so they are counted at the front the client is on:
    4 at the worker, 4 waiting, the other 4 refused, and another client still has its
    place (without: 8 at the worker, the queue full, the other client refused
    'overloaded')."""
    grpc_port = int(two_fronts.grpc_url.rsplit(":", 1)[1])
    workers = two_fronts.worker_pids()
    request = simple_request(3)
    request.model_name = "onnxruntime"  # (the endpoint's name)
    extra = socket_to_front(two_fronts, front_pid(two_fronts, "extra front"), port=grpc_port)
    other = socket_to_front(two_fronts, front_pid(two_fronts, "primary"), port=grpc_port)
    with (
        H2c("127.0.0.1", grpc_port, sock=extra) as hog,
        H2c("127.0.0.1", grpc_port, sock=other) as probe,
    ):
        assert _grpc_status(hog.wait(hog.grpc("ModelInfer", request.SerializeToString()))) == 0
        for worker in workers:
            os.kill(worker, signal.SIGSTOP)
        try:
            calls = [hog.grpc("ModelInfer", request.SerializeToString()) for _ in range(12)]
            for stream in calls[2 * SMALL_SHARE :]:
                assert _grpc_status(hog.wait(stream)) == Status.UNAVAILABLE.value
            _another_client_is_taken(probe, request)
        finally:
            for worker in workers:
                os.kill(worker, signal.SIGCONT)
        for stream in calls[: 2 * SMALL_SHARE]:
            assert _grpc_status(hog.wait(stream)) == 0


def test_forwarded_calls_ended_at_their_deadline_keep_their_place_until_the_worker_answers(
    two_fronts: ServerProcess,
) -> None:
    """Calls of 300 ms from one connection on the other front, forwarded to the primary,
    the workers stopped: three rounds of a worker queue's count (8). Each call ends at its
    deadline while the worker still has it; the primary counts it in that connection's
    share until the worker answers, as it counts its own connections', so 4 are at the
    worker whatever the rounds, the others end at their deadline waiting for a place, and
    another client's call is still taken at the worker. (Counted only at the front until
    the primary answered, each place went back at the deadline: the second round filled
    the queue of 8, the third was refused 'overloaded', and so was the other client.)"""
    grpc_port = int(two_fronts.grpc_url.rsplit(":", 1)[1])
    workers = two_fronts.worker_pids()
    request = simple_request(3)
    request.model_name = "onnxruntime"  # (the endpoint's name)
    message = request.SerializeToString()
    extra = socket_to_front(two_fronts, front_pid(two_fronts, "extra front"), port=grpc_port)
    other = socket_to_front(two_fronts, front_pid(two_fronts, "primary"), port=grpc_port)
    with (
        H2c("127.0.0.1", grpc_port, sock=extra) as hog,
        H2c("127.0.0.1", grpc_port, sock=other) as probe,
    ):
        assert _grpc_status(hog.wait(hog.grpc("ModelInfer", message))) == 0
        for worker in workers:
            os.kill(worker, signal.SIGSTOP)
        try:
            for _ in range(3):
                calls = [hog.grpc("ModelInfer", message, "300m") for _ in range(SMALL_QUEUE)]
                ended = [hog.wait(stream) for stream in calls]
                statuses = [_grpc_status(answer) for answer in ended]
                assert statuses == [Status.DEADLINE_EXCEEDED.value] * SMALL_QUEUE, ended
            _another_client_is_taken(probe, request)
        finally:
            for worker in workers:
                os.kill(worker, signal.SIGCONT)
        # The worker skips the expired calls; the connection's places are back.
        assert _grpc_status(hog.wait(hog.grpc("ModelInfer", message))) == 0
