"""A caller of ``DynamicBatcher`` in the unit tests: a future that withdraws its request.

The data plane (``BatchRunner.infer``) awaits ``enqueue``'s future and calls ``withdraw``
when that await ends in an error; a test that only holds a future gets the same contract
from a done callback: cancel the future and the request leaves the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

from oipserve.scheduling.scheduler import DynamicBatcher


def submit(
    batcher: DynamicBatcher,
    request: Any,
    batch: int,
    signature: Hashable,
    priority: int,
    timeout_us: int,
    crossed: Callable[[], None] | None = None,
) -> asyncio.Future[Any]:
    """Queue ``request``; the future resolves to its result (cancel it to withdraw it)."""
    entry = batcher.enqueue(request, batch, signature, priority, timeout_us, crossed)
    entry.future.add_done_callback(lambda _: batcher.withdraw(entry))
    return entry.future
