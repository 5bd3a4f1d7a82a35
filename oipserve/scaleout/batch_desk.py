"""The primary's end of the batch sockets: other fronts' checked requests, into its batchers.

One ``BatchDesk`` per replica (``batch_wire`` has the protocol). Each ``Enqueue`` becomes
an ``Inference`` of the primary's own version of that model, its inputs' bytes the data
of the message, and joins the version's batcher through ``DataPlane.cross_in``, as a
request of this front would: one queue, one queue policy, batches over every front's
clients. It is counted here, once (the replica counts only what it refused before
sending). Its outputs go back as bytes; the worker's segment is released as soon as they
are copied into the answer.

A ``Withdraw`` cancels the request as a client that leaves this front does (it leaves the
queue, or its part of a running batch is dropped). A replica whose socket closes (it
died, or stopped) withdraws everything it had sent.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Protocol

from oipserve.dataplane.batched import CrossedAnswer
from oipserve.errors import InternalError, ServerError, Unavailable, kind_of
from oipserve.models.registry import ModelVersion
from oipserve.request.inference import Inference, InferResult, InputTensor, OutputTensor, Parked
from oipserve.request.placement import Placement
from oipserve.request.sequence_params import SequenceTag
from oipserve.scaleout.batch_wire import (
    Answered,
    CrossingOutput,
    Enqueue,
    Refusal,
    SlotWait,
    ToPrimary,
    to_primary_decoder,
)
from oipserve.scaleout.framed import FramedProtocol

__all__ = ["BatchDesk"]

log = logging.getLogger("oipserve.replicas")


class CheckedBatches(Protocol):
    """What the desk needs of this front's data plane (``DataPlane``)."""

    def cross_in(
        self,
        inference: Inference,
        placements: list[Placement],
        start: int,
        deadline: float,
        answer: CrossedAnswer,
        flush: Callable[[], None],
    ) -> None: ...


class Versions(Protocol):
    """What the desk needs of this front's registry (``ModelRegistry``): its versions."""

    @property
    def models(self) -> dict[str, dict[str, ModelVersion]]: ...


class BatchDesk:
    """The requests one replica sends to this front's batchers, and their answers."""

    # NOTE: compiled (mypyc); the plane and the registry are typed by what the desk uses,
    #   so that the unit tests can stand in for them.
    def __init__(self, plane: CheckedBatches, registry: Versions) -> None:
        self._plane = plane
        self._registry = registry
        # PERF: asyncio.get_running_loop() makes a getpid() system call on each use.
        self._loop = asyncio.get_running_loop()
        self._protocol: FramedProtocol[ToPrimary] = FramedProtocol(
            to_primary_decoder(), self._received, self._closed
        )
        # PERF: a batch's answers are written together as soon as they are queued, before
        #   this front's own responses of the turn (the batcher calls this flush between
        #   the two: ``DynamicBatcher._dispatch``), not at the turn's end: the replica's
        #   clients waited for them, and at c=16 over two fronts their next requests then
        #   came after the batch's delay, and the batches were split (docs/scaling.md,
        #   "Batches formed across fronts"). Nor each as it is known: a write and a
        #   wake-up of the replica an answer.
        self._flush = self._protocol.flush
        #: Requests not answered yet: what withdraws each (its batcher's future's cancel).
        self._withdraw: dict[int, Callable[[], object]] = {}
        #: Requests received and not answered yet.
        self._active: set[int] = set()
        #: Those withdrawn before they reached their batcher; all once the socket closed.
        self._gone: set[int] = set()
        self._open = True

    async def open(self, sock: socket.socket) -> None:
        """Serve the primary's end of a replica's batch socket."""
        await self._loop.connect_accepted_socket(lambda: self._protocol, sock)

    def close(self) -> None:
        transport = self._protocol.transport
        if transport is not None:
            transport.close()

    def _received(self, message: ToPrimary) -> None:
        if isinstance(message, Enqueue):
            self._enqueue(message)
            return
        withdraw = self._withdraw.pop(message.id, None)
        if withdraw is not None:
            withdraw()
        elif message.id in self._active:  # not queued yet (a sequence's: in its task)
            self._gone.add(message.id)
        # (else it was answered already: the replica drops the answer)

    def _closed(self) -> None:
        self._open = False
        withdraws = list(self._withdraw.values())
        self._withdraw.clear()
        for withdraw in withdraws:
            withdraw()

    def _watch(self, rid: int) -> Callable[[Callable[[], object]], None]:
        """The request's ``watch``: its batcher's withdrawal, kept for a ``Withdraw``."""

        def watch(withdraw: Callable[[], object]) -> None:
            if rid in self._gone or not self._open:
                withdraw()
            else:
                self._withdraw[rid] = withdraw

        return watch

    def _enqueue(self, message: Enqueue) -> None:
        """Queue a request (no task of its own: ``DataPlane.cross_in``)."""
        rid = message.id
        self._active.add(rid)
        try:
            inference, placements = self._inference(message)
            deadline = self._loop.time() + message.seconds_left
            self._plane.cross_in(
                inference, placements, message.start_ns, deadline, self._answer(rid), self._flush
            )
        except BaseException as exc:
            self._answered(rid, None, exc)

    def _answer(self, rid: int) -> CrossedAnswer:
        def answer(result: InferResult | None, error: BaseException | None) -> None:
            self._answered(rid, result, error)

        return answer

    def _answered(self, rid: int, result: InferResult | None, error: BaseException | None) -> None:
        """Request ``rid``'s answer or refusal, queued for the replica."""
        self._withdraw.pop(rid, None)
        self._gone.discard(rid)
        self._active.discard(rid)
        if result is None:
            if not isinstance(error, ServerError | asyncio.CancelledError):
                log.error("a request another front sent to be batched failed", exc_info=error)
            kind, text = kind_of(error if error is not None else InternalError("no answer"))
            self._protocol.send(Refusal(rid, kind, text))
            return
        try:  # NOTE: encoded (copied) before the worker's segment goes back
            self._protocol.send(Answered(rid, [_output(tensor) for tensor in result.outputs]))
        finally:
            result.release()

    def _inference(self, message: Enqueue) -> tuple[Inference, list[Placement]]:
        model = self._version(message)
        placements: list[Placement] = []
        tensors = []
        for item in message.inputs:
            tensor = InputTensor(item.name, item.datatype, item.shape, raw=item.data)
            tensor.image = item.image
            tensors.append(tensor)
            placements.append((tensor, item.model_shape, len(item.data), item.data))
        rid = message.id
        inference = Inference(
            model,
            tensors,
            message.outputs,
            [],
            priority=message.priority,
            timeout_us=message.timeout_us,
            watch=self._watch(rid),
        )
        if message.sequence_id is not None:
            inference.sequence = SequenceTag(
                message.sequence_id, message.sequence_start, message.sequence_end
            )
            if message.parked:
                inference.parked = self._parked(rid)
        return inference, placements

    def _parked(self, rid: int) -> Parked:
        """The request's ``parked``: told to the replica, whose stream counts it."""

        def parked(waiting: bool, nbytes: int) -> None:
            self._protocol.send(SlotWait(rid, waiting, nbytes))

        return parked

    def _version(self, message: Enqueue) -> ModelVersion:
        """This front's version the replica checked the request against."""
        model = self._registry.models.get(message.name, {}).get(message.version)
        if model is None or model.serial != message.serial:
            raise Unavailable(
                f"model '{message.name}' version {message.version} is being loaded or "
                "unloaded; try again"
            )
        return model


def _output(tensor: OutputTensor) -> CrossingOutput:
    return CrossingOutput(tensor.name, tensor.datatype, tensor.shape, tensor.data)
