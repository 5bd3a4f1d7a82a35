"""A replica's end of its batch socket: checked requests of batching models, to the primary.

The replica's data plane hands each request of a batching version here once it has
checked it (``strategies.Batched``: metadata, shapes, its response cache, JSON decoded,
clients' regions read; ``sequenced.Sequenced`` for a sequence model) instead of to
batchers of its own (``DataPlane.batch_elsewhere``): ``PrimaryBatches.cross`` sends its
inputs' bytes and its sequence, if any, to the primary (``batch_wire.Enqueue``),
releases what held them, and waits for its answer, whose outputs become the request's
``InferResult`` (bytes of this process: nothing to give back). The primary counts the
request in its statistics; this front counts only what failed before it was sent.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from time import monotonic_ns
from typing import Final

import numpy as np

from oipserve.errors import (
    InternalError,
    Unavailable,
    Withdrawn,
    cancelled_by_client,
    from_kind,
)
from oipserve.request.inference import Inference, InferResult, OutputTensor, Parked
from oipserve.request.placement import Placement
from oipserve.request.tensors import Deferred
from oipserve.runtime.off_loop import nothing_to_release
from oipserve.scaleout.batch_wire import (
    Answered,
    CrossingInput,
    Enqueue,
    FromPrimary,
    Refusal,
    SlotWait,
    Withdraw,
    from_primary_decoder,
)
from oipserve.scaleout.framed import FramedProtocol
from oipserve.telemetry.stats import ModelStats, refusal_reason

__all__ = ["PrimaryBatches"]

#: What a request waiting on the primary is told when the primary's socket closed.
PRIMARY_GONE: Final = "the primary front is gone; try again"


class PrimaryBatches:
    """The primary's batchers, as this front's data plane sees them (``cross``)."""

    def __init__(self) -> None:
        # PERF: asyncio.get_running_loop() makes a getpid() system call on each use.
        self._loop = asyncio.get_running_loop()
        self._protocol: FramedProtocol[FromPrimary] = FramedProtocol(
            from_primary_decoder(), self._received, self._closed
        )
        self._ids = itertools.count(1)
        #: Requests sent and not answered, by id.
        self._waiting: dict[int, asyncio.Future[Answered | Refusal]] = {}
        #: Those whose ``Inference.parked`` is told (a stream's), and the bytes of those
        #: the primary said wait for a sequence slot now (told they stopped when they end).
        self._parks: dict[int, Parked] = {}
        self._parked: dict[int, int] = {}
        self._open = False

    async def open(self, sock: socket.socket) -> None:
        """Use this front's end of its batch socket (the primary made the pair)."""
        await self._loop.connect_accepted_socket(lambda: self._protocol, sock)
        self._open = True

    async def cross(
        self,
        inference: Inference,
        stats: ModelStats,
        start: int,
        placements: list[Placement],
        deadline: float,
    ) -> InferResult:
        """The request's result from the primary's batcher of its version, its dynamic or
        its sequence batcher (a ``strategies.CheckedQueue``)."""
        rid = next(self._ids)
        model = inference.model
        tag = inference.sequence
        sequence_id, first, last = (None, False, False) if tag is None else (
            tag.sequence_id, tag.start, tag.end
        )  # fmt: skip
        try:
            if not self._open:
                raise Unavailable(PRIMARY_GONE)
            self._protocol.send(
                Enqueue(
                    rid,
                    model.name,
                    model.version,
                    model.serial,
                    [_crossing(placement) for placement in placements],
                    inference.output_names,
                    inference.priority,
                    inference.timeout_us,
                    start,
                    deadline - self._loop.time(),
                    sequence_id,
                    first,
                    last,
                    inference.parked is not None,
                )
            )
        except BaseException as exc:
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        finally:  # NOTE: the message holds a copy of the inputs' bytes
            for held in inference.owned:
                held.release()
        future: asyncio.Future[Answered | Refusal] = self._loop.create_future()
        self._waiting[rid] = future
        if inference.watch is not None:
            inference.watch(future.cancel)
        if inference.parked is not None:
            self._parks[rid] = inference.parked
        try:
            reply = await future
        except BaseException:
            if self._waiting.pop(rid, None) is not None:
                self._protocol.send(Withdraw(rid))
            if cancelled_by_client(future):
                raise Withdrawn() from None
            raise
        finally:
            if inference.parked is not None:
                self._ended(rid)
        if not isinstance(reply, Answered):
            raise from_kind(reply.kind, reply.message)
        outputs = [OutputTensor(o.name, o.datatype, o.shape, o.data) for o in reply.outputs]
        return InferResult(model, outputs, nothing_to_release)

    def _received(self, message: FromPrimary) -> None:
        if isinstance(message, SlotWait):
            self._slot_wait(message)
            return
        future = self._waiting.pop(message.id, None)
        if future is not None and not future.done():
            future.set_result(message)

    def _slot_wait(self, message: SlotWait) -> None:
        """The primary's word that a request started or stopped waiting for a slot."""
        rid = message.id
        parked = self._parks.get(rid)
        if parked is None:  # (answered, or gone, meanwhile)
            return
        if message.waiting:
            if rid not in self._parked:
                self._parked[rid] = message.nbytes
                parked(True, message.nbytes)
            return
        nbytes = self._parked.pop(rid, None)
        if nbytes is not None:
            parked(False, nbytes)

    def _ended(self, rid: int) -> None:
        """Request ``rid`` ended: if it still waited for a slot, its stream is told it no
        longer does (its answer may come without the primary's word: its socket closed)."""
        parked = self._parks.pop(rid, None)
        nbytes = self._parked.pop(rid, None)
        if parked is not None and nbytes is not None:
            parked(False, nbytes)

    def _closed(self) -> None:
        self._open = False
        waiting = list(self._waiting.values())
        self._waiting.clear()
        for future in waiting:
            if not future.done():
                future.set_exception(Unavailable(PRIMARY_GONE))


def _crossing(placement: Placement) -> CrossingInput:
    """One checked input as it crosses: its bytes, wherever this front holds them."""
    tensor, shape, _, data = placement
    if data is None:
        if tensor.located is None:
            raise InternalError(f"input '{tensor.name}' has no data in this front")
        held, offset, size = tensor.located
        view = held.buf[offset : offset + size]
    elif isinstance(data, Deferred):
        raise InternalError(f"input '{tensor.name}' was not decoded before it crossed")
    elif isinstance(data, np.ndarray):
        view = data.view(np.uint8).reshape(-1).data
    else:
        view = memoryview(data)
    return CrossingInput(tensor.name, tensor.datatype, tensor.shape, shape, tensor.image, view)
