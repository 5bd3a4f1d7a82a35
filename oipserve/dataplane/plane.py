"""Health, metadata and inference, independent of any wire protocol.

REST (and gRPC) adapters parse their wire format into ``InputTensor``s and
render ``InferResult``s; everything between (validation against the model's
metadata, placing tensors in shared memory, choosing a worker, waiting for
it) happens here, once, for every protocol.

The inference path, top to bottom (``DataPlane.infer``):
1. resolve the model version (404 unknown, 503 not ready);
2. check every input against the model's metadata (names, datatype, shape,
   element count, batch size) and the requested outputs; large JSON ``data``
   is then decoded by a worker into a segment (``json_offload``), small
   JSON ``data`` here;
3. put input data into shared memory: JSON values and host buffers are
   copied into one pooled segment; binary payloads already received into a
   segment are referenced where they lie;
4. send a descriptor to the least busy worker and await its reply;
5. return views of the worker's output segment, outputs asked for as classes
   replaced by their top-k strings (``classification``); the caller releases them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from time import monotonic_ns
from typing import Protocol

import oipserve
from oipserve.dataplane.batched import BatchRunner
from oipserve.errors import InvalidInput
from oipserve.models.config_response import model_config_document
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request import json_offload
from oipserve.request.checks import check_request, output_targets
from oipserve.request.classification import check_classification, classify
from oipserve.request.client_regions import ClientRegions, RegionUse
from oipserve.request.echo import answer_echo
from oipserve.request.inference import Inference, InferResult, client_outputs
from oipserve.request.placement import Placement, check_size, place
from oipserve.request.tensors import Deferred
from oipserve.runtime.busy_poll import BusyPoll
from oipserve.runtime.off_loop import nothing_to_release
from oipserve.telemetry.stats import StatsRegistry, failure_reason, refusal_reason
from oipserve.wire.datatypes import element_count
from oipserve.wire.json_request import InferRequest
from oipserve.wire.messages import ObjectRef, OutputTarget
from oipserve.wire.shm import BufferPool, Lease, SegmentCache

log = logging.getLogger("oipserve.dataplane")


class Workers(Protocol):
    """What the data plane needs of the workers: the prefix of its segments and a link to
    each (``WorkerPool`` in the primary front, ``replicas.process.Links`` in the others)."""

    @property
    def prefix(self) -> str: ...

    @property
    def workers(self) -> Sequence[WorkerLink]: ...


class DataPlane:
    def __init__(
        self,
        registry: ModelRegistry,
        pool: Workers,
        max_queue: int,
        infer_timeout: float = 120.0,
        regions: ClientRegions | None = None,
        server_name: str = "oipserve",
        busy_poll_window: float = 0.0,
    ) -> None:
        self.registry = registry
        #: The ``name`` of the server metadata (``--server-name``).
        self.server_name = server_name
        self.pool = pool
        self.max_queue = max_queue
        #: Seconds an inference may take unless its ``timeout`` parameter is shorter.
        self.infer_timeout = infer_timeout
        # PERF: asyncio.get_running_loop() makes a getpid() system call on each use.
        self._loop = asyncio.get_running_loop()
        #: Told of each request's start and end: polls at low load (``--busy-poll-us``).
        self.busy_poll = BusyPoll(self._loop, busy_poll_window)
        self.inputs = BufferPool(pool.prefix + "in-", on_drop=self._forget_input)
        self.outputs = SegmentCache()
        #: Per model version: what the statistics extension and /metrics report.
        self.stats = StatsRegistry(registry)
        self.batches = BatchRunner(self.inputs, self.outputs)
        self.shutting_down = False
        #: Clients' registered shared-memory regions (off unless --allow-client-shm).
        self.regions = regions if regions is not None else ClientRegions(False, pool.prefix)
        self.regions.on_closed = self._forget_regions

    def _forget_regions(self, objects: list[ObjectRef]) -> None:
        for worker in self.pool.workers:
            worker.forget_regions(objects)

    def _forget_input(self, name: str) -> None:
        for worker in self.pool.workers:
            worker.forget_inputs([name])

    def worker_gone(self, worker: WorkerLink) -> None:
        self.outputs.forget_prefix(worker.segment_prefix)

    # ---- health and metadata ------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return not self.shutting_down and self.registry.all_ready()

    def server_metadata(self) -> dict[str, object]:
        return {
            "name": self.server_name,
            "version": oipserve.__version__,
            "extensions": [
                "binary_tensor_data",
                "classification",
                "model_configuration",
                "model_repository",
                "statistics",
                "system_shared_memory",
            ],
        }

    def model_metadata(self, name: str, version: str | None) -> dict[str, object]:
        model = self.registry.resolve(name, version)
        versions = self.registry.models[name]
        return {
            "name": name,
            "versions": [version]
            if version is not None
            else [v for v, m in versions.items() if m.state == "READY"],
            "platform": model.platform,
            "inputs": [_tensor_metadata(t.name, t.datatype, t.shape) for t in model.inputs],
            "outputs": [_tensor_metadata(t.name, t.datatype, t.shape) for t in model.outputs],
        }

    def model_config(self, name: str, version: str | None) -> dict[str, object]:
        """The model's configuration in Triton's JSON form (model_configuration extension)."""
        return model_config_document(self.registry.resolve(name, version))

    # ---- inference ----------------------------------------------------------

    def resolve(self, name: str, version: str | None) -> ModelVersion:
        return self.registry.resolve(name, version)

    async def infer(self, inference: Inference) -> InferResult:
        """Run one request; its ``owned`` leases are released once the worker is done
        reading, and its ``into_regions`` uses once the call returns, in every case.

        Every request is counted once in the version's statistics: a success with the
        worker's phase times, or a failure with its reason (``oipserve.telemetry.stats``).
        """
        counts = inference.classification
        if counts and inference.text_outputs:
            # NOTE: classified in the front from the raw values: never printed by a worker.
            inference.text_outputs = [name for name in inference.text_outputs if name not in counts]
        model = inference.model
        model.in_flight += 1
        since = self.busy_poll.started()
        try:
            result = await self._run(inference)
            if inference.into_regions:
                _deliver(result, inference.into_regions)
            return await classify(result, counts) if counts else result
        finally:
            model.in_flight -= 1
            self.busy_poll.ended(since)
            for use in inference.into_regions.values():
                use.release()

    async def _run(self, inference: Inference) -> InferResult:
        model, inputs, owned = inference.model, inference.inputs, inference.owned
        into = inference.into_regions
        counts = inference.classification
        stats = self.stats.of(model)
        start = monotonic_ns()
        if model.echo:
            try:
                if into or any(tensor.region is not None for tensor in inputs):
                    raise InvalidInput(
                        f"model '{model.name}' is answered by the front (echo) and takes no "
                        "shared memory regions"
                    )
                check_classification(model, counts, into)
                result = answer_echo(model, inputs, inference.output_names, owned)
            except BaseException as exc:
                stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
                raise
            stats.executed(1, 0, 0, 0)  # answered here: no queue, no compute phases
            stats.request_succeeded(1, monotonic_ns() - start, 0, 0, 0, 0)
            return result
        timeout = self.infer_timeout
        if inference.timeout_us and inference.timeout_us / 1e6 < timeout:
            timeout = inference.timeout_us / 1e6
        deadline = self._loop.time() + timeout
        policy = model.config.dynamic_batching if model.config else None
        lease: Lease | None = None
        targets: list[OutputTarget] = []
        try:
            placements = check_request(model, inputs, inference.output_names)
            check_classification(model, counts, into)
            if any(isinstance(data, Deferred) for _, _, _, data in placements):
                placements = await self._decode_in_worker(model, placements, owned, deadline)
            if into:
                targets = output_targets(model, inputs, into)
            if policy is not None:
                model.check_serving()  # the batcher would otherwise queue it
                self._copy_regions(placements, owned)
            else:
                descs, lease = await place(placements, self.inputs)
                worker = model.pick(self.max_queue)
        except BaseException as exc:
            for held in owned:
                held.release()
            if lease is not None:
                lease.release()
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        if policy is not None:
            return await self.batches.infer(inference, policy, stats, start, placements, deadline)
        if lease is not None:
            owned.append(lease)

        def inputs_free() -> None:
            for held in owned:
                held.release()

        batch = inputs[0].shape[0] if model.max_batch_size > 0 and inputs[0].shape else 1
        # NOTE: pending until the worker answers: the front cannot see when a pipelined
        #   worker starts a request (docs/metrics.md).
        stats.pending += 1
        sent = monotonic_ns()
        try:
            done = await worker.infer(
                model.key, descs, inference.output_names, inputs_free, deadline, targets,
                inference.text_outputs,
            )  # fmt: skip
        except BaseException as exc:
            stats.request_failed(failure_reason(exc), monotonic_ns() - start)
            raise
        finally:
            stats.pending -= 1
        for name in done.dropped:
            self.outputs.forget(name)
        # NOTE: no segment when every output went into clients' regions.
        buf = self.outputs.get(done.segment).buf if done.segment else _EMPTY
        try:
            outputs = client_outputs(
                model,
                [
                    (d, _EMPTY if d.region is not None else buf[d.offset : d.offset + d.nbytes])
                    for d in done.outputs
                ],
            )
            for tensor, desc in zip(outputs, done.outputs, strict=True):
                if desc.region is not None:
                    tensor.put_in_region(into[tensor.name], desc.nbytes)
        except BaseException:
            if done.segment:
                worker.release_outputs(done.segment)
            raise
        stats.ran_alone(batch, start, sent, done)
        if not done.segment:
            return InferResult(model, outputs, nothing_to_release)
        return InferResult(model, outputs, lambda: worker.release_outputs(done.segment))

    async def parse_json(
        self, model: ModelVersion, lease: Lease, start: int, body: memoryview
    ) -> tuple[InferRequest, list[tuple[int, int] | None]] | None:
        """A large JSON body parsed by one of the model's workers (``json_offload``).

        None when the front should parse it itself: a small body, or a model that
        the front answers (echo).
        """
        if model.echo or len(body) < json_offload.PARSE_MIN:
            return None
        worker = model.pick(self.max_queue)
        deadline = self._loop.time() + self.infer_timeout
        return await json_offload.parse(worker, lease, start, body, deadline)

    async def _decode_in_worker(
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
        worker = model.pick(self.max_queue)
        owned.append(await json_offload.decode(worker, texts, self.inputs, deadline))
        return [
            (tensor, shape, nbytes, None if isinstance(data, Deferred) else data)
            for tensor, shape, nbytes, data in placements
        ]

    def _copy_regions(self, placements: list[Placement], owned: list[Lease | RegionUse]) -> None:
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
                check_size(tensor, lease.buf[:nbytes], element_count(tensor.shape))

    def refused(self, model: ModelVersion, exc: BaseException) -> None:
        """Count a request a protocol adapter refused after resolving its model.

        (A malformed body for a known model.) Its time is not measured: the data plane
        never saw it; it counts with 0 ns.
        """
        self.stats.of(model).request_failed(refusal_reason(exc), 0)


_EMPTY = memoryview(b"")


def _deliver(result: InferResult, into: dict[str, RegionUse]) -> None:
    """Outputs wanted in clients' regions that the worker did not write there: written now.

    (Outputs of batched requests: the worker wrote the whole batch into its own segment.)
    """
    try:
        for tensor in result.outputs:
            use = into.get(tensor.name)
            if use is not None and tensor.region is None:
                use.write(tensor.data)
                tensor.put_in_region(use, len(tensor.data))
    except BaseException:
        result.release()
        raise


def _tensor_metadata(name: str, datatype: str, shape: tuple[int, ...]) -> dict[str, object]:
    return {"name": name, "datatype": datatype, "shape": list(shape)}
