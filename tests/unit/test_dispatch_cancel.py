"""A request cancelled in the loop iteration its worker's reply lands (a gRPC stream reset
while the worker answers) gives the reply's output segment back (``dispatch.drop_reply``)."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from oipserve.dataplane.dispatch import Dispatch
from oipserve.errors import Unavailable
from oipserve.front.grpc.h2.connection import Connection
from oipserve.models.registry import ModelVersion
from oipserve.runtime.abandoned_work import ABANDONED_WORK, LIMIT, AbandonedWork
from oipserve.wire.messages import ErrorKind, Failed, InferDone, Release
from oipserve.wire.shm import SegmentCache
from tests.support.worker_links import LinkToNoWorker


def _released(link: LinkToNoWorker) -> list[str]:
    """The output segments the link gave back to its worker."""
    return [name for m in link.sent() if isinstance(m, Release) for name in m.segments]


def test_a_reply_that_races_the_reset_gives_its_outputs_back() -> None:
    """stream-past-window grew /dev/shm past its bound under load (178, 336 MiB): each
    reset pair's requests running in the worker were cancelled, and a reply that came in
    the loop iteration of the cancel woke its task to CancelledError with the reply
    unread, the link (its future done) releasing nothing: that output segment stayed
    leased in the worker for good (two 10 s attacks: +198 MiB, then +198 MiB more; now
    +68, then +0 on the same front). The race, without a server: the reply and the
    cancel in one iteration; the outputs must go back to the worker."""

    async def race() -> list[str]:
        link = LinkToNoWorker()
        worker = link.link
        model = ModelVersion("identity_fp32", "1", "", None)
        task = asyncio.ensure_future(Dispatch(SegmentCache(), 256).send(worker, model, [], [], []))
        await asyncio.sleep(0)  # sent; waiting for the reply
        (rid,) = worker.pending
        worker.on_message(InferDone(rid, "oipserve-0-w1-7", [], []))
        task.cancel()  # the stream reset in the same iteration
        with pytest.raises(asyncio.CancelledError):
            await task
        return _released(link)

    assert asyncio.run(race()) == ["oipserve-0-w1-7"]


def test_a_client_s_abandoned_requests_hold_its_reading_until_the_workers_answer() -> None:
    """stream-past-window grew /dev/shm to 214-294 MiB now and then on a busy box: each
    reset pair's requests went on running in the worker, behind which they piled up (147
    at once). A connection's cancelled requests that a worker still has now count against
    it (``runtime.abandoned_work``): at ``LIMIT`` its reading is held, and given back once
    the worker has answered half of them; a worker's death answers them all."""

    async def scenario() -> tuple[list[str], list[str]]:
        link = LinkToNoWorker()
        worker = link.link
        events: list[str] = []
        work = AbandonedWork(lambda: events.append("hold"), lambda: events.append("resume"))
        context = contextvars.copy_context()
        context.run(ABANDONED_WORK.set, work)
        model = ModelVersion("identity_fp32", "1", "", None)
        dispatch = Dispatch(SegmentCache(), 256)
        loop = asyncio.get_running_loop()

        def request() -> asyncio.Task[Any]:
            sent = dispatch.send(worker, model, [], [], [])
            return loop.create_task(sent, context=context.copy())

        answered = request()  # its reply comes before the cancel: never counted
        tasks = [request() for _ in range(LIMIT + 2)]
        await asyncio.sleep(0)
        first, *rids = sorted(worker.pending)
        worker.on_message(InferDone(first, "oipserve-0-w1-0", [], []))
        answered.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(answered, *tasks, return_exceptions=True)
        assert (work.running, events) == (LIMIT + 2, ["hold"])
        for rid in rids[: LIMIT // 2 + 1]:
            worker.on_message(InferDone(rid, f"oipserve-0-w1-{rid}", [], []))
        assert (work.running, events) == (LIMIT // 2 + 1, ["hold"])
        worker.on_message(InferDone(rids[LIMIT // 2 + 1], "oipserve-0-w1-x", [], []))
        assert (work.running, events) == (LIMIT // 2, ["hold", "resume"])
        released = _released(link)
        worker._cut_off("killed")  # what it still ran is done with
        assert work.running == 0
        return events, released

    events, released = asyncio.run(scenario())
    assert events == ["hold", "resume"]
    assert len(released) == LIMIT // 2 + 3  # every reply's outputs went back


@pytest.mark.parametrize("one_client", [True, False])
def test_a_connection_s_calls_count_its_abandoned_requests_unless_it_carries_many_clients(
    one_client: bool,
) -> None:
    """A call's task (``Connection.run``) sees its connection's ``AbandonedWork``; on the
    private socket's connections (other fronts' forwarded calls, many clients on one
    connection) it sees none: one client's resets must not hold the others' calls."""

    async def seen() -> object:
        async def call() -> None:
            found.append(ABANDONED_WORK.get())

        found: list[object] = []
        connection = Connection(lambda conn, stream: None, lambda _: None, one_client=one_client)  # type: ignore[arg-type, return-value]
        await connection.run(call())
        assert ABANDONED_WORK.get() is None  # the loop's own context is left as it was
        return found[0] is connection.abandoned if one_client else found[0] is None

    assert asyncio.run(seen())


def test_nothing_is_sent_for_a_version_taken_out_of_service() -> None:
    """A batch formed before a reload and sent after it: its worker had the Unload first
    and refused it as "model 'batched/1#<id>' is not loaded here" (found by fuzzing). It
    gets the retryable 503 of a request that found the version before it went, and its
    inputs are let go; nothing reaches the worker."""

    class Held:
        released = 0

        def release(self) -> None:
            self.released += 1

    async def send_after_reload() -> tuple[str, int, list[object]]:
        link = LinkToNoWorker()
        model = ModelVersion("batched", "1", "", None)
        model.stop_serving("replaced by a reload")
        held = Held()
        dispatch = Dispatch(SegmentCache(), 256)
        with pytest.raises(Unavailable) as info:
            await dispatch.send(link.link, model, [], [held], [])  # type: ignore[list-item]
        return str(info.value), held.released, link.sent()

    message, released, sent = asyncio.run(send_after_reload())
    assert message == (
        "model 'batched' version 1 was replaced by a reload while this request was in flight; retry"
    )
    assert (released, sent) == (1, [])


def test_a_failure_says_which_output_segments_its_worker_dropped() -> None:
    """A worker that found /dev/shm full unlinks its idle output segments and fails the
    request: the front lets go of its mappings of them at once (the memory is freed only
    then), as it does for those an ``InferDone`` names. They were named only by the next
    success, and /dev/shm stayed full until then (found by fuzzing)."""

    class Outputs(SegmentCache):
        def __init__(self) -> None:
            super().__init__()
            self.forgotten: list[str] = []

        def forget(self, name: str) -> None:
            self.forgotten.append(name)

    async def fail() -> list[str]:
        outputs = Outputs()
        dispatch = Dispatch(outputs, 256)
        link = LinkToNoWorker()
        message = "no shared memory for the outputs"
        failed = Failed(7, ErrorKind.UNAVAILABLE, message, dropped=["o-1"])
        with pytest.raises(Unavailable):
            dispatch.answered(link.link, failed)
        return outputs.forgotten

    assert asyncio.run(fail()) == ["o-1"]
