"""``json_offload.decode`` gives its lease back exactly when the worker can no longer write it.

A caller may leave before the worker answers (its deadline passed, its client went away):
the lease the worker decodes into must then stay leased until the reply comes, or the
pool could lend it to another request while the worker still writes into it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator

import pytest

from oipserve.errors import DeadlineExceeded, InvalidInput
from oipserve.request.inference import InputTensor
from oipserve.request.json_offload import decode
from oipserve.request.tensors import Deferred
from oipserve.wire.messages import ErrorKind, Failed, JsonDecoded
from oipserve.wire.shm import BufferPool


class FakeWorker:
    """Records the call; the test resolves it the way the real handle would."""

    worker_id = 1

    def __init__(self) -> None:
        self.loading = 0
        self.future: asyncio.Future[object] | None = None
        self.on_done: Callable[[], None] | None = None

    def call(self, make: Callable[[int], object], on_done: Callable[[], None], deadline: float):
        make(7)
        self.future = asyncio.get_running_loop().create_future()
        self.on_done = on_done
        return self.future

    def reply(self, message: object) -> None:
        assert self.on_done is not None and self.future is not None
        self.on_done()
        if not self.future.done():
            self.future.set_result(message)


@pytest.fixture
def pool() -> Iterator[BufferPool]:
    pool = BufferPool(f"oipserve-test-{os.getpid()}-")
    yield pool
    pool.close()


def _tensor(pool: BufferPool) -> InputTensor:
    body = pool.acquire(1024)
    deferred = Deferred(lambda: [], 100, (body, 0, 10))
    return InputTensor("x", "FP32", [4], values=deferred)


async def _run(pool: BufferPool, script: Callable[[FakeWorker, asyncio.Task], object]) -> object:
    worker = FakeWorker()
    task = asyncio.ensure_future(decode(worker, [(_tensor(pool), 4)], pool, 0.0))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    return await script(worker, task)  # type: ignore[misc]


def test_a_reply_hands_the_lease_to_the_caller(pool: BufferPool) -> None:
    async def script(worker: FakeWorker, task: asyncio.Task) -> object:
        worker.reply(JsonDecoded(7))
        return await task

    lease = asyncio.run(_run(pool, script))
    assert pool.leased_count == 2  # the body's and the decoded tensors'
    lease.release()  # type: ignore[attr-defined]


def test_a_failure_gives_the_lease_back(pool: BufferPool) -> None:
    async def script(worker: FakeWorker, task: asyncio.Task) -> object:
        worker.reply(Failed(7, ErrorKind.INVALID_INPUT, "bad data"))
        with pytest.raises(InvalidInput, match="bad data"):
            await task
        return None

    asyncio.run(_run(pool, script))
    assert pool.leased_count == 1  # the body's only


def test_a_caller_past_its_deadline_leaves_the_lease_until_the_reply(pool: BufferPool) -> None:
    async def script(worker: FakeWorker, task: asyncio.Task) -> object:
        assert worker.future is not None
        assert worker.loading == 1  # its heartbeats may wait while it decodes
        worker.future.set_exception(DeadlineExceeded())  # as WorkerHandle._expire_overdue
        with pytest.raises(DeadlineExceeded):
            await task
        assert pool.leased_count == 2, "released while the worker may still write into it"
        assert worker.loading == 0
        worker.reply(JsonDecoded(7))
        return None

    asyncio.run(_run(pool, script))
    assert pool.leased_count == 1


def test_a_worker_death_gives_the_lease_back(pool: BufferPool) -> None:
    async def script(worker: FakeWorker, task: asyncio.Task) -> object:
        assert worker.future is not None and worker.on_done is not None
        worker.on_done()  # as WorkerHandle._cut_off: on_done first, then the error
        worker.future.set_exception(RuntimeError("worker died"))
        with pytest.raises(RuntimeError):
            await task
        return None

    asyncio.run(_run(pool, script))
    assert pool.leased_count == 1
