"""One worker process serving two fronts (the first step of ``--http-workers``).

The test process plays both fronts: the ``WorkerPool`` that starts the worker (the
starting front) and a ``WorkerLink`` connected to the worker's listener (another
front). Each gets its own answers and its own output segments; the other front
cannot load or unload; its leaving frees exactly its segments; the worker's death
cuts both off; a replacement listens at a new address.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import numpy as np
import pytest

from oipserve.pool.handle import WorkerHandle
from oipserve.pool.link import WorkerDied, WorkerLink
from oipserve.pool.worker_pool import WorkerPool
from oipserve.runtime.workerproc import WorkerOptions
from oipserve.wire.messages import ErrorKind, Failed, Infer, LoadModel, TensorDesc
from oipserve.wire.shm import BufferPool, SegmentCache
from tests.support.server import SAMPLE_REPOSITORY, shm_entries, wait_for

SIMPLE = str(SAMPLE_REPOSITORY / "simple/1/model.onnx")
CPU = [("CPUExecutionProvider", {})]


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    pool = WorkerPool(os.getpid(), WorkerOptions("warning"), fronts=2)
    yield pool
    await pool.stop(10)


async def _started(pool: WorkerPool) -> WorkerHandle:
    worker = await pool.add_worker("cpu", 1)
    await worker.load("simple/1", SIMPLE, CPU)
    return worker


async def _other_front(worker: WorkerHandle) -> WorkerLink:
    link = WorkerLink(worker.worker_id, worker.device, worker.segment_prefix)
    await link.connect(worker.front_address)
    link.models = dict(worker.models)
    return link


async def _add(
    link: WorkerLink, inputs: BufferPool, outputs: SegmentCache, base: int
) -> tuple[np.ndarray, np.ndarray, str]:
    """``simple`` through one link: OUTPUT0 = a + b, OUTPUT1 = a - b; and the segment."""
    a = np.arange(base, base + 16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    lease = inputs.acquire(128)
    lease.buf[:64] = a.tobytes()
    lease.buf[64:128] = b.tobytes()
    descs = [
        TensorDesc("INPUT0", "INT32", [1, 16], lease.name, 0, 64),
        TensorDesc("INPUT1", "INT32", [1, 16], lease.name, 64, 64),
    ]
    done = link.inferred(
        await link.call(
            lambda rid: Infer(rid, "simple/1", descs, ["OUTPUT0", "OUTPUT1"], [], []),
            lease.release,
        )
    )
    buf = outputs.get(done.segment).buf
    got = [
        np.frombuffer(buf[d.offset : d.offset + d.nbytes], dtype=np.int32).copy()
        for d in done.outputs
    ]
    link.release_outputs(done.segment)
    assert got[0].tolist() == (a + b).ravel().tolist()
    assert got[1].tolist() == (a - b).ravel().tolist()
    return got[0], got[1], done.segment


async def test_two_fronts_get_their_own_answers_and_segments(pool: WorkerPool) -> None:
    worker = await _started(pool)
    assert worker.front_address.startswith("\0" + worker.segment_prefix)
    link = await _other_front(worker)
    assert link.pid == worker.pid and link.alive
    inputs = BufferPool(f"{pool.prefix}front2-in-")
    outputs = SegmentCache()
    try:
        # Interleaved on both connections, many in flight on each.
        answers = await asyncio.gather(
            *(_add(worker, inputs, outputs, i) for i in range(0, 40, 2)),
            *(_add(link, inputs, outputs, i) for i in range(1, 40, 2)),
        )
        starters = {segment for _, _, segment in answers[:20]}
        others = {segment for _, _, segment in answers[20:]}
        # Each front's outputs lie in segments of its own connection.
        assert all(s.startswith(worker.segment_prefix) and "-c" not in s for s in starters)
        assert all(s.startswith(f"{worker.segment_prefix}c1-") for s in others)
        assert worker.in_flight == 0 and link.in_flight == 0
    finally:
        outputs.close()
        inputs.close()
        link.transport.close()  # type: ignore[union-attr]


async def test_only_the_starting_front_loads(pool: WorkerPool) -> None:
    worker = await _started(pool)
    link = await _other_front(worker)
    try:
        reply = await link.call(lambda rid: LoadModel(rid, "simple/2", SIMPLE, 1, CPU))
        assert isinstance(reply, Failed)
        assert "only the front that started this worker" in reply.message
        assert "simple/2" not in worker.models
        # The worker serves on: both fronts still get answers.
        inputs = BufferPool(f"{pool.prefix}front2-in-")
        outputs = SegmentCache()
        await _add(link, inputs, outputs, 0)
        await _add(worker, inputs, outputs, 0)
        outputs.close()
        inputs.close()
    finally:
        link.transport.close()  # type: ignore[union-attr]
    assert reply.kind == ErrorKind.INTERNAL


async def test_a_front_that_leaves_takes_only_its_segments(pool: WorkerPool) -> None:
    worker = await _started(pool)
    link = await _other_front(worker)
    inputs = BufferPool(f"{pool.prefix}front2-in-")
    outputs = SegmentCache()
    gone: list[WorkerLink] = []
    link.add_death_listener(gone.append)
    try:
        await _add(link, inputs, outputs, 0)
        await _add(worker, inputs, outputs, 0)
        theirs = f"{worker.segment_prefix}c1-"
        assert any(n.startswith(theirs) for n in shm_entries(os.getpid()))
        link.transport.close()  # type: ignore[union-attr]
        assert await asyncio.to_thread(
            wait_for, lambda: not any(n.startswith(theirs) for n in shm_entries(os.getpid()))
        )
        assert gone == [link] and not link.alive
        # The starting front's segments stay, and it is still served.
        assert any(
            n.startswith(worker.segment_prefix) and not n.startswith(theirs)
            for n in shm_entries(os.getpid())
        )
        await _add(worker, inputs, outputs, 5)
        # A second front may connect afterwards; its segments are numbered anew.
        again = await _other_front(worker)
        _, _, segment = await _add(again, inputs, outputs, 7)
        assert segment.startswith(f"{worker.segment_prefix}c2-")
        again.transport.close()  # type: ignore[union-attr]
    finally:
        outputs.close()
        inputs.close()


async def test_the_workers_death_cuts_off_every_front_and_the_replacement_listens_anew(
    pool: WorkerPool,
) -> None:
    worker = await _started(pool)
    link = await _other_front(worker)
    gone: list[WorkerLink] = []
    link.add_death_listener(gone.append)
    first_address, first_pid = worker.front_address, worker.pid
    assert first_pid is not None
    replaced = asyncio.Event()

    async def on_replaced(new: WorkerHandle) -> None:
        # NOTE: the replacement's models come from the record that on_replaced keeps (in
        #   the server, the model manager's registry), not from the dead process.
        await new.load("simple/1", SIMPLE, CPU)
        replaced.set()

    pool.on_replaced(on_replaced)
    os.kill(first_pid, signal.SIGKILL)
    await asyncio.wait_for(replaced.wait(), 60)
    assert gone == [link] and not link.alive
    with pytest.raises(WorkerDied):
        link.call(lambda rid: Infer(rid, "simple/1", [], ["OUTPUT0"], [], []))
    assert worker.front_address != first_address and worker.pid != first_pid
    again = await _other_front(worker)
    inputs = BufferPool(f"{pool.prefix}front2-in-")
    outputs = SegmentCache()
    try:
        await _add(again, inputs, outputs, 1)
    finally:
        outputs.close()
        inputs.close()
        again.transport.close()  # type: ignore[union-attr]


async def test_a_worker_without_other_fronts_listens_nowhere() -> None:
    pool = WorkerPool(os.getpid(), WorkerOptions("warning"))
    try:
        worker = await pool.add_worker("cpu", 1)
        assert worker.front_address == ""
    finally:
        await pool.stop(10)


async def test_a_front_that_reuses_a_segment_name_is_read_afresh(pool: WorkerPool) -> None:
    """Input mappings belong to the connection that used them: a later front whose segment
    has the same name as a departed front's gets its own data read, not the old mapping's.
    """
    worker = await _started(pool)
    outputs = SegmentCache()
    for base in (0, 500):
        link = await _other_front(worker)
        # The same prefix each time: the first segment gets the same name both times.
        inputs = BufferPool(f"{pool.prefix}reused-in-")
        try:
            await _add(link, inputs, outputs, base)  # asserts the answer is this front's
        finally:
            inputs.close()
            link.transport.close()  # type: ignore[union-attr]
    outputs.close()
