"""Work kept off the event loop: in a thread, holding what it uses until it is done
(``in_thread``; ``releasing_on_failure`` when the work's size decides), with copies that
let go of the GIL meanwhile (``copy_into``), and large anonymous memory unmapped in a
thread once nothing sends from it (``unmap_off_loop``, after ``CorkedTransport.sent``)."""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Callable
from typing import Final, TypeVar

import numpy as np

Result = TypeVar("Result")


def nothing_to_release() -> None:
    """The ``release`` of work that holds nothing (one no-op for every such caller)."""


async def in_thread(
    work: Callable[[], Result], release: Callable[[], None], *, after_success: bool
) -> Result:
    """``work()`` in a thread, then ``release()`` on the loop.

    ``release`` runs after a failure, and after success too when ``after_success``. If
    the awaiting task is cancelled meanwhile, it runs once the thread has finished: the
    thread may still be reading or writing what ``release`` gives back (a segment, a
    lease), and releases queue messages to workers, which only the loop may do.
    """
    running = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        result = await asyncio.shield(running)
    except BaseException:
        if running.done():
            release()
        else:
            running.add_done_callback(lambda _: release())
        raise
    if after_success:
        release()
    return result


async def releasing_on_failure(
    work: Callable[[], Result], release: Callable[[], None], *, in_a_thread: bool
) -> Result:
    """``work()``, and ``release()`` if it fails: in a thread when ``in_a_thread`` (then
    also if the awaiting task is abandoned, as ``in_thread`` does), else on the loop.

    For work whose size decides where it runs: small on the loop, large in a thread.
    """
    if in_a_thread:
        return await in_thread(work, release, after_success=False)
    try:
        return work()
    except BaseException:
        release()
        raise


#: Copies from this size go through numpy, which lets go of the GIL while it copies.
_COPY_WITHOUT_GIL: Final = 1024 * 1024


def copy_into(
    target: memoryview, offset: int, nbytes: int, data: bytes | bytearray | memoryview | np.ndarray
) -> None:
    """``data`` (bytes-like or an array) into ``target[offset : offset + nbytes]``."""
    if isinstance(data, np.ndarray):
        data = data.view(np.uint8).reshape(-1).data
    if nbytes < _COPY_WITHOUT_GIL:
        target[offset : offset + nbytes] = data
    else:
        into = np.frombuffer(target, np.uint8, nbytes, offset)
        np.copyto(into, np.frombuffer(data, np.uint8))


def unmap_off_loop(payload: object) -> None:
    """Return a large payload's memory to the system in a thread, once it is done with.

    Unmapping 100 MB of touched pages takes tens of milliseconds; done by the last
    reference's ``del`` it would hold the loop that long. Where something still holds a
    view of it, it is left to be freed with that view.
    """
    if type(payload) is not memoryview:
        return
    memory = payload.obj
    if not isinstance(memory, mmap.mmap):
        return
    try:
        payload.release()
    except BufferError:
        return  # viewed through this view still (an answer echoing it): freed with it

    def close() -> None:
        try:
            memory.close()
        except BufferError:
            pass  # still viewed: freed with the last view

    asyncio.get_running_loop().run_in_executor(None, close)
