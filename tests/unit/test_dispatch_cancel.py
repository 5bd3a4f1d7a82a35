"""A request cancelled in the loop iteration its worker's reply lands (a gRPC stream reset
while the worker answers) gives the reply's output segment back (``dispatch.drop_reply``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from oipserve.dataplane.dispatch import Dispatch
from oipserve.pool.link import WorkerLink
from oipserve.wire.messages import InferDone
from oipserve.wire.shm import SegmentCache


def test_a_reply_that_races_the_reset_gives_its_outputs_back() -> None:
    """stream-past-window grew /dev/shm past its bound under load (178, 336 MiB): each
    reset pair's requests running in the worker were cancelled, and a reply that came in
    the loop iteration of the cancel woke its task to CancelledError with the reply
    unread, the link (its future done) releasing nothing: that output segment stayed
    leased in the worker for good (two 10 s attacks: +198 MiB, then +198 MiB more; now
    +68, then +0 on the same front). The race, without a server: the reply and the
    cancel in one iteration; the outputs must go back to the worker."""

    async def race() -> list[str]:
        worker = WorkerLink(1, "cpu", "oipserve-0-w1-")
        worker.alive, worker._loop = True, asyncio.get_running_loop()
        worker.transport = SimpleNamespace(write=lambda data: None)  # type: ignore[assignment]
        released: list[str] = []
        worker.release_outputs = released.append  # type: ignore[method-assign, assignment]
        model: Any = SimpleNamespace(key="identity_fp32/1")
        task = asyncio.ensure_future(Dispatch(SegmentCache(), 256).send(worker, model, [], [], []))
        await asyncio.sleep(0)  # sent; waiting for the reply
        (rid,) = worker.pending
        worker.on_message(InferDone(rid, "oipserve-0-w1-7", [], []))
        task.cancel()  # the stream reset in the same iteration
        with pytest.raises(asyncio.CancelledError):
            await task
        return released

    assert asyncio.run(race()) == ["oipserve-0-w1-7"]
