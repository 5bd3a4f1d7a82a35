"""A connection's share of the workers' queues (``runtime/worker_share.py``): the edges a
server cannot be made to hit on cue (a place handed to a request cancelled in that loop
iteration, a place handed past one that expired). The behaviour through a server:
tests/e2e/test_worker_share.py."""

from __future__ import annotations

import asyncio

import pytest

from oipserve.errors import DeadlineExceeded, Unavailable
from oipserve.runtime.worker_share import ForwardedShares, WorkerShare, share_of


def test_a_connection_has_half_a_workers_queue_and_at_least_one() -> None:
    assert (share_of(256), share_of(3), share_of(1)) == (128, 1, 1)


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_places_are_handed_on_in_the_order_they_were_asked_for() -> None:
    share = WorkerShare(asyncio.get_running_loop())
    assert share.take(2) and share.take(2) and not share.take(2)
    order: list[int] = []

    async def wait(n: int) -> None:
        await share.wait(asyncio.get_running_loop().time() + 10, 10)
        order.append(n)

    waiters = [asyncio.ensure_future(wait(n)) for n in range(3)]
    await _settle()
    assert (share.held, share.waiting) == (2, 3)
    share.back()
    await _settle()
    assert order == [0] and share.held == 2  # the place went to the first, not freed
    assert not share.take(2)  # nobody overtakes those waiting: not even with a place free
    share.back()
    share.back()
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2] and (share.held, share.waiting) == (2, 0)
    share.back()
    share.back()
    assert share.held == 0 and share.take(2)


async def test_a_place_handed_to_a_cancelled_request_goes_to_the_next() -> None:
    share = WorkerShare(asyncio.get_running_loop())
    assert share.take(1)
    deadline = asyncio.get_running_loop().time() + 10
    first = asyncio.ensure_future(share.wait(deadline, 10))
    second = asyncio.ensure_future(share.wait(deadline, 10))
    await _settle()
    share.back()  # the place to ``first`` ...
    first.cancel()  # ... cancelled in the same iteration, before it ran again
    await asyncio.wait_for(second, 5)  # ``second`` has it
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (share.held, share.waiting) == (1, 0)


async def test_a_request_cancelled_or_expired_while_waiting_leaves_the_line() -> None:
    loop = asyncio.get_running_loop()
    share = WorkerShare(loop)
    assert share.take(1)
    cancelled = asyncio.ensure_future(share.wait(loop.time() + 10, 10))
    expired = asyncio.ensure_future(share.wait(loop.time() + 0.05, 10))
    last = asyncio.ensure_future(share.wait(loop.time() + 10, 10))
    await _settle()
    cancelled.cancel()
    with pytest.raises(DeadlineExceeded, match="waited in the front for this connection"):
        await expired
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert share.waiting == 1
    share.back()
    await asyncio.wait_for(last, 5)
    share.back()
    assert (share.held, share.waiting) == (0, 0)


async def test_a_place_given_back_skips_a_request_cancelled_unseen() -> None:
    """A cancel and the place in one loop iteration, the cancelled request not yet run
    again: the place goes to the next (a place handed to the cancelled one was lost)."""
    loop = asyncio.get_running_loop()
    share = WorkerShare(loop)
    assert share.take(1)
    cancelled = asyncio.ensure_future(share.wait(loop.time() + 10, 10))
    waiting = asyncio.ensure_future(share.wait(loop.time() + 10, 10))
    await _settle()
    cancelled.cancel()
    share.back()
    await asyncio.wait_for(waiting, 5)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert (share.held, share.waiting) == (1, 0)


async def test_past_a_shares_count_of_waiting_requests_the_next_is_refused_at_once() -> None:
    """A connection waits with at most ``limit`` requests: the next is a 503 with
    Retry-After, not a request that holds its input and window for as long as they wait."""
    loop = asyncio.get_running_loop()
    share = WorkerShare(loop)
    assert share.take(2) and share.take(2)
    waiting = [asyncio.ensure_future(share.wait(loop.time() + 10, 2)) for _ in range(2)]
    await _settle()
    with pytest.raises(Unavailable) as refused:
        await share.wait(loop.time() + 10, 2)
    assert refused.value.retry_after == 1 and "2 more waiting" in str(refused.value)
    assert share.waiting == 2
    share.back()
    await asyncio.wait_for(waiting[0], 5)
    again = asyncio.ensure_future(share.wait(loop.time() + 10, 2))  # one waits now: taken
    await _settle()
    assert share.waiting == 2 and not again.done()
    for turn in (waiting[1], again):
        turn.cancel()
    await asyncio.gather(waiting[1], again, return_exceptions=True)
    assert (share.held, share.waiting) == (2, 0)


async def test_a_connections_requests_hold_at_most_three_quarters_of_its_window() -> None:
    """Counted in bytes too (what the connection's whole requests hold of its receive
    window): a place at once up to half the window, a wait up to three quarters, past it
    503; a request alone is never refused for its bytes, nor an ensemble's step (not
    ``bounded``)."""
    loop = asyncio.get_running_loop()
    held = [0]
    share = WorkerShare(loop, lambda: held[0], 16)
    held[0] = 20  # more than the window: alone, it is taken
    assert share.take(100)
    held[0] = 8
    assert share.take(100)
    held[0] = 9
    assert not share.take(100)
    waiting = asyncio.ensure_future(share.wait(loop.time() + 10, 100))
    await _settle()
    held[0] = 13
    with pytest.raises(Unavailable) as refused:
        await share.wait(loop.time() + 10, 100)
    assert refused.value.retry_after == 1 and "receive window" in str(refused.value)
    step = asyncio.ensure_future(share.wait(loop.time() + 10, 100, bounded=False))
    await _settle()
    assert share.waiting == 2
    share.back()
    share.back()
    await asyncio.wait_for(asyncio.gather(waiting, step), 5)
    assert (share.held, share.waiting) == (2, 0)


async def test_the_primary_drops_a_forwarded_connections_share_once_it_holds_nothing() -> None:
    """The primary keeps a share for each mark of another front's client connection
    (``ForwardedShares``), the same one for each of its calls while it holds a place or a
    request waits for one; one that holds nothing is dropped when the marks reach their
    bound (64, then twice those kept), as the primary never hears of the connection's
    close: the marks of closed connections never pile up."""
    loop = asyncio.get_running_loop()
    shares = ForwardedShares()
    busy = shares.of("7.1", loop)
    assert busy.take(1) and shares.of("7.1", loop) is busy
    assert busy.serial != shares.of("7.2", loop).serial
    for n in range(3, 65):
        assert shares.of(f"7.{n}", loop).held == 0
    assert len(shares) == 64
    shares.of("8.1", loop)  # the bound: those holding nothing go, the busy one stays
    assert len(shares) == 2 and shares.of("7.1", loop) is busy
    busy.back()
    for n in range(2, 64):
        shares.of(f"8.{n}", loop)
    shares.of("8.64", loop)
    assert len(shares) == 1 and shares.of("7.1", loop) is not busy  # made anew
