"""``BufferPool.acquire_async``: large new segments are made in a thread, never lost."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator

import pytest

from oipserve.wire import shm
from oipserve.wire.shm import CREATE_IN_THREAD, BufferPool


@pytest.fixture
def pool() -> Iterator[BufferPool]:
    pool = BufferPool(f"oipserve-test-{os.getpid()}-")
    yield pool
    pool.close()


def test_a_large_new_segment_is_created_off_the_loop(
    pool: BufferPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    reserve = os.posix_fallocate

    # NOTE: the system call a segment's creation makes, spied on where the module looks
    #   it up at each call (a compiled ``Segment.create`` is not looked up on its class).
    def spy(fd: int, offset: int, size: int) -> None:
        threads.append(threading.current_thread().name)
        reserve(fd, offset, size)

    monkeypatch.setattr(shm.os, "posix_fallocate", spy)

    async def run() -> None:
        small = await pool.acquire_async(1024)
        large = await pool.acquire_async(CREATE_IN_THREAD)
        large.release()
        again = await pool.acquire_async(CREATE_IN_THREAD)  # the idle one, at once
        assert again.name == large.name
        small.release()
        again.release()

    asyncio.run(run())
    assert threads[0] == "MainThread" and threads[1] != "MainThread"
    assert len(threads) == 2


def test_a_cancelled_acquire_leaves_its_segment_idle(pool: BufferPool) -> None:
    async def run() -> None:
        task = asyncio.ensure_future(pool.acquire_async(CREATE_IN_THREAD))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # the thread finishes; its segment joins the idle ones
            if pool.total_bytes:
                break
            await asyncio.sleep(0.01)
        assert pool.leased_count == 0
        assert pool.total_bytes >= CREATE_IN_THREAD

    asyncio.run(run())
