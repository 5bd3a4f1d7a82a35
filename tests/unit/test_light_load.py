"""Each Infer says whether its front had anything else in flight (``Infer.light``), with or
without ``--low-load-colocation``: a worker polls for its next request only after one sent
at a busier time (``workers.busy_poll``). Whatever sends it: a request alone, an ensemble's
chain or step, a sequence's batch (``Dispatch.light``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

import numpy as np

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.ensemble_chains import _send as chain_send
from oipserve.dataplane.ensemble_run import StepDispatch
from oipserve.dataplane.intake import Intake
from oipserve.dataplane.plane import DataPlane
from oipserve.dataplane.sequence_slots import SequenceStep
from oipserve.dataplane.sequenced import Sequenced
from oipserve.models.config.sequence import SequencePolicy
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request.inference import InputTensor
from oipserve.runtime.busy_poll import BusyPoll
from oipserve.scheduling.sequence import Sequence
from oipserve.wire.messages import Infer
from oipserve.wire.shm import BufferPool, SegmentCache
from tests.support.worker_links import LinkToNoWorker


def test_an_infer_is_light_while_it_is_its_front_s_only_request_in_flight() -> None:
    async def scenario() -> list[bool]:
        plane = DataPlane(ModelRegistry(), SimpleNamespace(prefix="oipserve-light-"), 1)  # type: ignore[arg-type]
        link = LinkToNoWorker()
        model = ModelVersion("identity_fp32", "1", "", None)
        sends = []
        for _ in range(2):  # the first alone in flight, the second beside it
            plane.busy_poll.started()
            sends.append(asyncio.ensure_future(plane.dispatch.send(link.link, model, [], [], [])))
            await asyncio.sleep(0)
        for task in sends:
            task.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
        return [m.light for m in link.sent() if isinstance(m, Infer)]

    assert asyncio.run(scenario()) == [True, False]


def _dispatch(in_flight: int) -> Dispatch:
    """A front's dispatch whose front has ``in_flight`` requests in flight (never polling)."""
    dispatch = Dispatch(SegmentCache(), 8)
    dispatch.busy_poll = BusyPoll(asyncio.get_running_loop(), 0.0)
    dispatch.busy_poll.in_flight = in_flight
    return dispatch


async def _sent_light(send: Callable[[Dispatch, WorkerLink], Awaitable[object]]) -> list[bool]:
    """``Infer.light`` of what ``send`` sends with one request in flight, then with two."""
    lights = []
    for in_flight in (1, 2):
        link = LinkToNoWorker()
        sending = asyncio.ensure_future(send(_dispatch(in_flight), link.link))
        await asyncio.sleep(0)  # sent; waiting for the reply
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        lights.extend(m.light for m in link.sent() if isinstance(m, Infer))
    return lights


async def test_an_ensemble_chain_says_light_as_a_request_alone_does() -> None:
    request = SimpleNamespace(owned=[], model=ModelVersion("add_one", "1", "", None))
    chain = SimpleNamespace(outputs=["Y"], messages=[], steps=())

    def send(dispatch: Dispatch, link: WorkerLink) -> Awaitable[object]:
        deadline = asyncio.get_running_loop().time() + 5.0
        return chain_send(dispatch, link, request, chain, [], deadline)  # type: ignore[arg-type]

    assert await _sent_light(send) == [True, False]


async def test_an_ensemble_step_sends_as_its_front_s_dispatch_does() -> None:
    """A step that runs alone goes through a ``StepDispatch`` made from the front's
    dispatch: its Infer says light, and it follows a co-located worker's CPU."""
    model = ModelVersion("add_one", "1", "", None)

    def send(dispatch: Dispatch, link: WorkerLink) -> Awaitable[object]:
        step = StepDispatch(dispatch, [])
        assert step.busy_poll is dispatch.busy_poll and step.affinity is dispatch.affinity
        return step.send(link, model, [], [], [])

    assert await _sent_light(send) == [True, False]


async def test_a_sequence_batch_says_light_as_a_request_alone_does() -> None:
    model = ModelVersion("accumulate", "1", "", None)
    placement = (InputTensor("IN", "FP32", [1]), [1], 4, np.ones(1, np.float32))
    inputs = BufferPool(f"oipserve-{os.getpid()}-light-")
    loop = asyncio.get_running_loop()

    def send(dispatch: Dispatch, link: WorkerLink) -> Awaitable[object]:
        batches = Sequenced(Intake(inputs, dispatch, 5.0, loop), dispatch, model, SequencePolicy())
        inference = SimpleNamespace(output_names=[], owned=[], parked=None)
        tag = SimpleNamespace(start=True, end=False)
        step = SequenceStep([placement], inference, tag, 0, None, loop.create_future())  # type: ignore[arg-type]
        return batches._execute(link, [Sequence(1, "s1")], [step])

    try:
        assert await _sent_light(send) == [True, False]
    finally:
        inputs.close()
