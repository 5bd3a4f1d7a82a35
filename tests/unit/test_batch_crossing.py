"""A replica's checked requests crossing to the primary's batchers, over a real socket pair:
``scaleout.batch_link.PrimaryBatches`` on one end, ``scaleout.batch_desk.BatchDesk`` on the
other, the primary's data plane a stand-in that records what reached it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np
import pytest

from oipserve.dataplane.batched import CrossedAnswer
from oipserve.errors import InvalidInput, ServerError, Unavailable, Withdrawn
from oipserve.models.registry import ModelVersion
from oipserve.request.inference import Inference, InferResult, InputTensor, OutputTensor
from oipserve.request.placement import Placement
from oipserve.request.sequence_params import SequenceTag
from oipserve.scaleout.batch_desk import BatchDesk
from oipserve.scaleout.batch_link import PRIMARY_GONE, PrimaryBatches
from oipserve.scheduling.scheduler import QueueRejected
from oipserve.telemetry.stats import ModelStats


def _version(serial: int = 7) -> ModelVersion:
    version = ModelVersion("batched", "1", "", None)
    version.serial = serial
    return version


@dataclass
class _Registry:
    models: dict[str, dict[str, ModelVersion]]


def _stats() -> ModelStats:
    return ModelStats("batched", "1")


class _Held:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


class _PrimaryPlane:
    """The primary's ``cross_in``: each request waits for the test's answer."""

    def __init__(self) -> None:
        self.requests: list[tuple[Inference, list[Placement], int, float]] = []
        self.answers: asyncio.Queue[Callable[[Inference], InferResult]] = asyncio.Queue()
        self.withdrawn = 0
        self._waiting: set[asyncio.Task[None]] = set()

    def cross_in(
        self,
        inference: Inference,
        placements: list[Placement],
        start: int,
        deadline: float,
        answer: CrossedAnswer,
        flush: Callable[[], None],
    ) -> None:
        self.requests.append((inference, placements, start, deadline))
        task = asyncio.ensure_future(self._answer(inference, answer, flush))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _answer(
        self,
        inference: Inference,
        answer: CrossedAnswer,
        flush: Callable[[], None],
    ) -> None:
        try:
            result = await self._wait(inference)
        except Exception as exc:  # noqa: BLE001 (crosses as a refusal)
            answer(None, exc)
        else:
            answer(result, None)
        flush()

    async def _wait(self, inference: Inference) -> InferResult:
        future = asyncio.get_running_loop().create_future()
        assert inference.watch is not None
        inference.watch(future.cancel)
        answer = asyncio.ensure_future(self.answers.get())
        try:
            await asyncio.wait([future, answer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            answer.cancel()
        if future.cancelled():
            self.withdrawn += 1
            raise Withdrawn("the client went away before its request ran")
        return answer.result()(inference)


@dataclass
class _Ends:
    replica: PrimaryBatches
    desk: BatchDesk
    plane: _PrimaryPlane
    registry: _Registry


@pytest.fixture
async def ends() -> AsyncIterator[_Ends]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    plane = _PrimaryPlane()
    registry = _Registry({"batched": {"1": _version()}})
    desk = BatchDesk(plane, registry)
    await desk.open(ours)
    replica = PrimaryBatches()
    await replica.open(theirs)
    yield _Ends(replica, desk, plane, registry)
    desk.close()


def _request(
    watch: Callable[[Callable[[], object]], None] | None = None,
) -> tuple[Inference, list[Placement], _Held]:
    """A checked request of ``batched``: an FP32 array and a view of received bytes."""
    values = np.arange(4, dtype=np.float32).reshape(1, 4)
    text = memoryview(b"\x05\x00\x00\x00hello")
    x = InputTensor("INPUT0", "FP32", [1, 4], values=values.tolist())
    t = InputTensor("TEXT", "BYTES", [1, 1], raw=text)
    held = _Held()
    inference = Inference(
        _version(), [x, t], ["OUTPUT0"], [held], priority=2, timeout_us=500, watch=watch
    )  # type: ignore[arg-type]
    return inference, [(x, [1, 4], 16, values), (t, [1, 1], 9, text)], held


async def _send(ends: _Ends, inference: Inference, placements: list[Placement], stats: ModelStats):
    deadline = asyncio.get_running_loop().time() + 30
    return asyncio.ensure_future(ends.replica.cross(inference, stats, 1234, placements, deadline))


async def _reached(ends: _Ends, count: int) -> None:
    async with asyncio.timeout(5):
        while len(ends.plane.requests) < count:
            await asyncio.sleep(0.001)


def _doubled(inference: Inference) -> InferResult:
    (x, _) = inference.inputs
    assert x.raw is not None
    data = (np.frombuffer(x.raw, np.float32) * 2).tobytes()
    output = OutputTensor("OUTPUT0", "FP32", [1, 4], memoryview(data))
    released: list[int] = []
    return InferResult(inference.model, [output], lambda: released.append(1))


async def test_a_request_crosses_with_its_bytes_and_its_answer_comes_back(ends: _Ends) -> None:
    inference, placements, held = _request()
    stats = _stats()
    call = await _send(ends, inference, placements, stats)
    await _reached(ends, 1)
    assert held.released == 1  # the message holds a copy: released once sent
    crossed, crossed_placements, start, deadline = ends.plane.requests[0]
    assert crossed.model is ends.registry.models["batched"]["1"]
    assert (crossed.priority, crossed.timeout_us, crossed.output_names) == (2, 500, ["OUTPUT0"])
    assert start == 1234 and 29 < deadline - asyncio.get_running_loop().time() <= 30
    assert [(t.name, t.datatype, t.shape, shape, n) for t, shape, n, _ in crossed_placements] == [
        ("INPUT0", "FP32", [1, 4], [1, 4], 16),
        ("TEXT", "BYTES", [1, 1], [1, 1], 9),
    ]
    assert bytes(crossed_placements[1][3]) == b"\x05\x00\x00\x00hello"  # type: ignore[arg-type]
    ends.plane.answers.put_nowait(_doubled)
    result = await asyncio.wait_for(call, 5)
    (output,) = result.outputs
    assert (output.name, output.datatype, output.shape) == ("OUTPUT0", "FP32", [1, 4])
    assert np.frombuffer(output.data, np.float32).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert stats.fail_count == 0  # counted where it ran


@pytest.mark.parametrize(
    ("raised", "expected", "status"),
    [
        (QueueRejected("Exceeds maximum queue size"), Unavailable, 503),
        (
            InvalidInput("the inputs of model 'batched' must share their first dimension"),
            InvalidInput,
            400,
        ),
    ],
    ids=["queue-full", "invalid"],
)
async def test_a_refusal_keeps_its_kind_and_message(
    ends: _Ends, raised: ServerError, expected: type[ServerError], status: int
) -> None:
    def refuse(_inference: Inference) -> InferResult:
        raise raised

    inference, placements, _ = _request()
    call = await _send(ends, inference, placements, _stats())
    ends.plane.answers.put_nowait(refuse)
    with pytest.raises(expected) as caught:
        await asyncio.wait_for(call, 5)
    assert (caught.value.message, caught.value.status) == (raised.message, status)


async def test_a_client_that_leaves_withdraws_its_request_from_the_primary(ends: _Ends) -> None:
    leaving: list[Callable[[], object]] = []
    inference, placements, _ = _request(watch=leaving.append)
    call = await _send(ends, inference, placements, _stats())
    await _reached(ends, 1)
    (leave,) = leaving
    leave()
    with pytest.raises(Withdrawn):
        await asyncio.wait_for(call, 5)
    async with asyncio.timeout(5):
        while ends.plane.withdrawn == 0:
            await asyncio.sleep(0.001)


async def test_a_request_for_a_version_the_primary_replaced_is_refused_retryably(
    ends: _Ends,
) -> None:
    ends.registry.models["batched"]["1"] = _version(serial=8)
    inference, placements, _ = _request()
    call = await _send(ends, inference, placements, _stats())
    with pytest.raises(Unavailable, match="is being loaded or unloaded; try again"):
        await asyncio.wait_for(call, 5)
    assert ends.plane.requests == []


async def test_requests_waiting_when_the_primary_goes_fail_and_later_ones_at_once(
    ends: _Ends,
) -> None:
    inference, placements, _ = _request()
    call = await _send(ends, inference, placements, _stats())
    await _reached(ends, 1)
    ends.desk.close()
    with pytest.raises(Unavailable, match=PRIMARY_GONE):
        await asyncio.wait_for(call, 5)
    inference, placements, held = _request()
    stats = _stats()
    with pytest.raises(Unavailable, match=PRIMARY_GONE):
        await asyncio.wait_for(await _send(ends, inference, placements, stats), 5)
    assert held.released == 1 and stats.fail_count == 1  # refused here, counted here


async def test_a_replica_that_goes_withdraws_what_it_sent(ends: _Ends) -> None:
    inference, placements, _ = _request()
    call = await _send(ends, inference, placements, _stats())
    await _reached(ends, 1)
    transport = ends.replica._protocol.transport  # noqa: SLF001 (the replica's end dies)
    assert transport is not None
    transport.abort()
    async with asyncio.timeout(5):
        while ends.plane.withdrawn == 0:
            await asyncio.sleep(0.001)
    with pytest.raises(Unavailable, match=PRIMARY_GONE):
        await asyncio.wait_for(call, 5)


async def test_withdrawals_early_or_late_leave_nothing_behind(ends: _Ends) -> None:
    """A ``Withdraw`` that comes before the primary queued the request still withdraws it;
    one that crosses its answer is dropped; neither is remembered afterwards."""
    leaving: list[Callable[[], object]] = []
    inference, placements, _ = _request(watch=leaving.append)
    early = await _send(ends, inference, placements, _stats())
    await asyncio.sleep(0)  # sent, not yet received
    leaving.pop()()
    with pytest.raises(Withdrawn):
        await asyncio.wait_for(early, 5)
    inference, placements, _ = _request(watch=leaving.append)
    late = await _send(ends, inference, placements, _stats())
    await _reached(ends, 2)
    ends.plane.answers.put_nowait(_doubled)
    await asyncio.sleep(0)
    leaving.pop()()  # while the answer is on its way
    with pytest.raises(Withdrawn):
        await asyncio.wait_for(late, 5)
    async with asyncio.timeout(5):
        while ends.plane.withdrawn < 1 or ends.desk._active:  # noqa: SLF001
            await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)  # the late Withdraw arrives
    assert (ends.desk._active, ends.desk._gone, ends.desk._withdraw) == (set(), set(), {})  # noqa: SLF001


async def test_a_sequence_request_crosses_with_its_sequence(ends: _Ends) -> None:
    inference, placements, _ = _request()
    inference.sequence = SequenceTag("client-7", True, False)
    deadline = asyncio.get_running_loop().time() + 30
    call = asyncio.ensure_future(
        ends.replica.cross(inference, _stats(), 1234, placements, deadline)
    )
    await _reached(ends, 1)
    tag = ends.plane.requests[0][0].sequence
    assert tag is not None and (tag.sequence_id, tag.start, tag.end) == ("client-7", True, False)
    ends.plane.answers.put_nowait(_doubled)
    assert len((await asyncio.wait_for(call, 5)).outputs) == 1
    inference, placements, _ = _request()  # no sequence: none crosses
    call = await _send(ends, inference, placements, _stats())
    await _reached(ends, 2)
    assert ends.plane.requests[1][0].sequence is None
    ends.plane.answers.put_nowait(_doubled)
    await asyncio.wait_for(call, 5)


async def test_a_streams_request_is_told_while_it_waits_for_a_slot_in_the_primary(
    ends: _Ends,
) -> None:
    """The primary's sequence batcher tells when a request starts and stops waiting for a
    slot (``Inference.parked``): the replica's stream hears it (``SlotWait``), so that it
    reads on. A request that ends while the primary said it waits (the primary gone) is
    told it stopped, so that its stream's count comes back."""
    told: list[tuple[bool, int]] = []

    def parked(waiting: bool, nbytes: int) -> None:
        told.append((waiting, nbytes))

    inference, placements, _ = _request()
    inference.sequence = SequenceTag(7, True, False)
    inference.parked = parked
    call = await _send(ends, inference, placements, _stats())
    await _reached(ends, 1)
    crossed = ends.plane.requests[0][0]
    assert crossed.parked is not None
    crossed.parked(True, 25)
    crossed.parked(False, 25)
    ends.plane.answers.put_nowait(_doubled)
    await asyncio.wait_for(call, 5)
    assert told == [(True, 25), (False, 25)]

    told.clear()
    inference, placements, _ = _request()
    inference.sequence = SequenceTag(8, True, False)
    inference.parked = parked
    call = await _send(ends, inference, placements, _stats())
    await _reached(ends, 2)
    second = ends.plane.requests[1][0].parked
    assert second is not None
    second(True, 25)
    async with asyncio.timeout(5):
        while not told:
            await asyncio.sleep(0.001)
    ends.desk.close()  # the primary goes: the request fails, its wait is over
    with pytest.raises(Unavailable):
        await asyncio.wait_for(call, 5)
    assert told == [(True, 25), (False, 25)]
