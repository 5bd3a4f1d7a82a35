"""What a request goes through before a worker runs it, alone or in a batch.

The two strategies that send requests to workers (``strategies.Unbatched``,
``strategies.Batched``) take each request in the same way, in this order:

1. its deadline: ``--infer-timeout``, or its own ``timeout`` parameter when shorter;
2. ``check``: every input against the model's metadata (names, datatype, shape, element
   count, batch size), the requested outputs and the classification asked for;
3. ``decode_in_worker``: large JSON ``data`` decoded by a worker into a segment
   (``json_offload``); small JSON ``data`` was decoded by ``check``.

A batched request also gets the inputs that lie in clients' regions read into segments
(``copy_regions``): a batch joins its requests' inputs in a segment the front writes.
"""

from __future__ import annotations

import asyncio

from oipserve.dataplane.dispatch import Dispatch
from oipserve.errors import RequestRefusal
from oipserve.models.registry import ModelVersion
from oipserve.request import json_offload
from oipserve.request.checks import check_request
from oipserve.request.classification import check_classification
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import Inference
from oipserve.request.placement import Placement, check_size
from oipserve.request.tensors import Deferred
from oipserve.runtime.worker_share import worker_in_share
from oipserve.wire.datatypes import element_count
from oipserve.wire.shm import BufferPool, Lease

__all__ = ["Intake", "has_deferred"]


def has_deferred(placements: list[Placement]) -> bool:
    """Whether an input's JSON ``data`` waits for a worker to decode it."""
    return any(isinstance(data, Deferred) for _, _, _, data in placements)


class Intake:
    """Deadlines, checks and the inputs' data made ready for placement."""

    __slots__ = ("inputs", "dispatch", "infer_timeout", "_loop")

    def __init__(
        self,
        inputs: BufferPool,
        dispatch: Dispatch,
        infer_timeout: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        #: The front's pool of input segments.
        self.inputs = inputs
        self.dispatch = dispatch
        #: Seconds an inference may take unless its ``timeout`` parameter is shorter.
        self.infer_timeout = infer_timeout
        self._loop = loop

    def deadline(self, inference: Inference) -> float:
        """When (loop time) the request fails with DeadlineExceeded, wherever it is."""
        timeout = self.infer_timeout
        if inference.timeout_us and inference.timeout_us / 1e6 < timeout:
            timeout = inference.timeout_us / 1e6
        deadline = self._loop.time() + timeout
        if inference.deadline is not None and inference.deadline < deadline:
            return inference.deadline
        return deadline

    @staticmethod
    def check(inference: Inference) -> list[Placement]:
        """The request checked against its model: one placement per input (InvalidInput
        naming what is wrong otherwise)."""
        model = inference.model
        try:
            placements = check_request(model, inference.inputs, inference.output_names)
        except RequestRefusal as exc:
            raise exc.of_request(inference.request_id) from None
        check_classification(model, inference.classification, inference.into_regions)
        return placements

    async def decode_in_worker(
        self,
        model: ModelVersion,
        placements: list[Placement],
        owned: list[Lease | RegionUse],
        deadline: float,
    ) -> list[Placement]:
        """Large JSON ``data`` decoded by one of the model's workers (``json_offload``).

        Each such input is ``located`` afterwards, in a lease held in ``owned``.
        """
        texts = [
            (tensor, element_count(tensor.shape))
            for tensor, _, _, data in placements
            if isinstance(data, Deferred)
        ]
        # (a place in its connection's share while the worker has the job, as for the
        #  inference after it: sent outside it, an h2c connection's filled the queue)
        dispatch = self.dispatch
        worker, done = await worker_in_share(
            dispatch.max_share, deadline, lambda: dispatch.pick(model)
        )
        owned.append(await json_offload.decode(worker, texts, self.inputs, deadline, done))
        return [
            (tensor, shape, nbytes, None if isinstance(data, Deferred) else data)
            for tensor, shape, nbytes, data in placements
        ]

    def copy_regions(
        self, inference: Inference, placements: list[Placement], owned: list[Lease | RegionUse]
    ) -> None:
        """Inputs in clients' regions of a batched request, read into pooled segments.

        A batch joins the inputs of several requests into one segment, which the front
        writes; it reads a client's region with ``pread`` (a client that truncated its
        object gets a 400 for its own request, never a SIGBUS in the front). A request
        that runs alone then reads its input from that segment in place.
        """
        for tensor, _, nbytes, _ in placements:
            use = tensor.region
            if use is None:
                continue
            lease = self.inputs.acquire(max(nbytes, 1))
            owned.append(lease)
            use.read_into(lease.buf[:nbytes])
            use.release()
            tensor.region = None
            tensor.located = (lease, 0, nbytes)
            if tensor.datatype == "BYTES":
                count = element_count(tensor.shape)
                try:
                    check_size(tensor, lease.buf[:nbytes], count, inference.model.name)
                except RequestRefusal as exc:
                    raise exc.of_request(inference.request_id) from None
