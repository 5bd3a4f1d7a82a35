"""Health, metadata and inference, independent of any wire protocol.

REST (and gRPC) adapters parse their wire format into ``InputTensor``s and
render ``InferResult``s; everything between (validation against the model's
metadata, placing tensors in shared memory, choosing a worker, waiting for
it) happens here, once, for every protocol.

The inference path, top to bottom (``DataPlane.infer``):
1. the version's strategy (``strategies``), chosen at its first request: answered in the
   front (``echo``), run alone, or queued for a batch (``dynamic_batching``);
2. the strategy checks every input against the model's metadata (names, datatype, shape,
   element count, batch size) and the requested outputs, within the request's deadline
   (``intake``); large JSON ``data`` is then decoded by a worker into a segment
   (``json_offload``), small JSON ``data`` here;
3. it puts input data into shared memory: JSON values and host buffers are copied into one
   pooled segment (a batch's into one segment for all its requests); binary payloads
   already received into a segment are referenced where they lie;
4. it sends a descriptor to the least busy worker (a batch: to the instance its batcher
   took) and awaits the reply (``dispatch``);
5. the result: views of the worker's output segment, outputs wanted in clients' regions
   written there, outputs asked for as classes replaced by their top-k strings
   (``classification``); the caller releases it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from time import monotonic_ns
from typing import TYPE_CHECKING, Protocol

import oipserve
from oipserve.config.cache_config import cache_bytes
from oipserve.dataplane.batched import BatchRunner, CrossedAnswer, batching_policy
from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.ensemble import EnsembleRunner
from oipserve.dataplane.intake import Intake
from oipserve.dataplane.response_cache import ResponseCache
from oipserve.dataplane.sequenced import Sequenced
from oipserve.dataplane.strategies import (
    Batched,
    CheckedQueue,
    Strategy,
    Unbatched,
    answer_in_front,
)
from oipserve.errors import InternalError, RequestRefusal
from oipserve.models.config_response import model_config_document, model_config_message
from oipserve.models.ensemble import EnsembleVersion
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.link import WorkerLink
from oipserve.request import json_offload
from oipserve.request.classification import classify
from oipserve.request.client_regions import ClientRegions, RegionUse
from oipserve.request.inference import Inference, InferResult
from oipserve.request.placement import Placement
from oipserve.runtime.busy_poll import BusyPoll
from oipserve.runtime.colocation import FrontAffinity
from oipserve.runtime.worker_share import share_of, worker_in_share
from oipserve.telemetry.stats import ModelStats, StatsRegistry, refusal_reason
from oipserve.wire.json_request import InferRequest
from oipserve.wire.messages import ObjectRef
from oipserve.wire.shm import BufferPool, Lease, SegmentCache, idle_cap

if TYPE_CHECKING:
    from oipserve.config.settings import Settings
    from oipserve.grpc_generated.model_config_pb2 import ModelConfig

log = logging.getLogger("oipserve.dataplane")


class Workers(Protocol):
    """What the data plane needs of the workers: the prefix of its segments and a link to
    each (``WorkerPool`` in the primary front, ``scaleout.process.Links`` in the others)."""

    @property
    def prefix(self) -> str: ...

    @property
    def workers(self) -> Sequence[WorkerLink]: ...


class DataPlane:
    """What the fronts call: health, metadata, and each inference through its version's
    strategy."""

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
        # (a worker's output segment past its pool's idle cap is mapped per reply: below)
        self.outputs = SegmentCache(keep_up_to=idle_cap())
        #: Per model version: what the statistics extension and /metrics report.
        self.stats = StatsRegistry(registry)
        dispatch = Dispatch(self.outputs, max_queue)
        dispatch.busy_poll = self.busy_poll
        self._intake = Intake(self.inputs, dispatch, infer_timeout, self._loop)
        self._batches = BatchRunner(self.inputs, dispatch)
        #: In a front other than the primary: where checked requests of batching and
        #: sequence versions go, the primary's batchers (``batch_elsewhere``); None here.
        self._elsewhere: CheckedQueue | None = None
        #: The sequence batcher of each sequence version, made with its strategy.
        self._sequencers: dict[ModelVersion, Sequenced] = {}
        #: The tasks of sequence requests other fronts sent (``cross_in``), kept until done.
        self._crossing: set[asyncio.Task[None]] = set()
        #: How every request and batch goes to a worker and comes back (``Dispatch``).
        self.dispatch = dispatch
        #: The response cache (``--cache-config``); None without one (the default).
        self.cache: ResponseCache | None = None
        self._unbatched: Strategy = Unbatched(self._intake, dispatch).run
        #: Each model version's strategy, chosen at its first request (``_choose``).
        self._strategies: dict[ModelVersion, Strategy] = {}
        self._ensemble_runner: EnsembleRunner | None = None
        self.shutting_down = False
        #: Clients' registered shared-memory regions (off unless --allow-client-shm).
        self.regions = regions if regions is not None else ClientRegions(False, pool.prefix)
        self.regions.on_closed = self._forget_regions

    @classmethod
    def of(
        cls,
        settings: Settings,
        registry: ModelRegistry,
        pool: Workers,
        regions: ClientRegions,
    ) -> DataPlane:
        """A front's data plane as the flags set it, the same in the primary and in every
        other front: queue and time limits, busy polling, ``--metrics-config`` (so that
        the fronts' histograms add up) and ``--cache-config``."""
        plane = cls(
            registry,
            pool,
            settings.max_queue_per_worker,
            settings.infer_timeout,
            regions,
            settings.server_name,
            settings.busy_poll_us / 1e6,
        )
        plane.stats.configure(settings)
        plane.configure_cache(settings)
        if settings.low_load_colocation:
            plane.colocate()
        return plane

    def colocate(self) -> None:
        """``--low-load-colocation``: the loop follows the worker that pinned itself beside
        it (``runtime.colocation``). Off (the default), the dispatch does not."""
        self.dispatch.affinity = FrontAffinity()

    def configure_cache(self, settings: Settings) -> None:
        """The response cache ``--cache-config`` asks for (before the first request)."""
        size = cache_bytes(settings.cache_config)
        self.cache = ResponseCache(size) if size else None
        self.stats.cache_on = self.cache is not None

    def batch_elsewhere(self, queue: CheckedQueue) -> None:
        """Hand checked requests of batching and sequence versions to ``queue`` (before
        the first request): a front other than the primary, whose batches and sequences
        form in the primary."""
        self._elsewhere = queue

    def _forget_regions(self, objects: list[ObjectRef]) -> None:
        for worker in self.pool.workers:
            worker.forget_regions(objects)

    def _forget_input(self, name: str) -> None:
        for worker in self.pool.workers:
            worker.forget_inputs([name])

    def worker_gone(self, worker: WorkerLink) -> None:
        self.outputs.forget_prefix(worker.segment_prefix)
        for sequencer in list(self._sequencers.values()):
            sequencer.worker_gone(worker)

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
                "sequence",
                "statistics",
                "system_shared_memory",
            ],
        }

    def model_metadata(self, name: str, version: str | None) -> dict[str, object]:
        model = self.registry.resolve(name, version)
        versions = self.registry.models[name]
        return {
            "name": name,
            "versions": [model.version]  # ("01" asked: "1", as Triton answers)
            if version is not None
            else [v for v, m in versions.items() if m.state == "READY"],
            "platform": model.platform,
            "inputs": [_tensor_metadata(t.name, t.datatype, t.shape) for t in model.inputs],
            "outputs": [_tensor_metadata(t.name, t.datatype, t.shape) for t in model.outputs],
        }

    def model_config(self, name: str, version: str | None) -> dict[str, object]:
        """The model's configuration in Triton's JSON form (model_configuration extension)."""
        return model_config_document(self.registry.resolve(name, version))

    def model_config_message(self, name: str, version: str | None) -> ModelConfig:
        """The model's configuration as gRPC's ModelConfig message."""
        return model_config_message(self.registry.resolve(name, version))

    # ---- inference ----------------------------------------------------------

    def resolve(self, name: str, version: str | None) -> ModelVersion:
        return self.registry.resolve(name, version)

    async def infer(self, inference: Inference) -> InferResult:
        """Run one request; its ``owned`` leases are released once the worker is done
        reading, and its ``into_regions`` uses once the call returns, in every case.

        Every request is counted once in the version's statistics: a success with the
        worker's phase times, or a failure with its reason (``oipserve.telemetry.stats``).
        """
        model = inference.model
        strategy = self._strategies.get(model)
        if strategy is None:
            strategy = self._choose(model)
        counts = inference.classification
        if counts and inference.text_outputs:
            # NOTE: classified in the front from the raw values: never printed by a worker.
            inference.text_outputs = [name for name in inference.text_outputs if name not in counts]
        model.in_flight += 1
        since = self.busy_poll.started()
        try:
            result = await strategy(inference, self.stats.of(model), monotonic_ns())
            if inference.into_regions:
                _deliver(result, inference.into_regions)
            return await classify(result, counts) if counts else result
        except RequestRefusal as exc:  # a worker's (kind REFUSED): it knows no request id
            raise exc.of_request(inference.request_id) from None
        finally:
            model.in_flight -= 1
            self.busy_poll.ended(since)
            for use in inference.into_regions.values():
                use.release()

    def _choose(self, model: ModelVersion) -> Strategy:
        """The strategy of a version, at its first request; kept while the version is in
        the registry (a reload makes a new version, which chooses again)."""
        self._forget_gone()
        policy = batching_policy(model.config)  # ragged batching: a batcher even without one
        cache = self.cache if model.config is not None and model.config.response_cache else None
        strategy: Strategy
        sequence = model.config.sequence_batching if model.config is not None else None
        if model.echo:
            strategy = answer_in_front
        elif isinstance(model, EnsembleVersion):  # its steps run from here (dataplane.ensemble)
            strategy = self._ensembles().run
        elif sequence is not None:  # a stateful model: the sequence batcher
            sequencer = Sequenced(self._intake, self.dispatch, model, sequence, self._elsewhere)
            self._sequencers[model] = sequencer
            strategy = sequencer.run
        elif policy is not None:
            queue = self._elsewhere or self._batches.infer
            strategy = Batched(self._intake, queue, cache).run
        elif cache is not None:
            strategy = Unbatched(self._intake, self.dispatch, cache).run
        else:
            strategy = self._unbatched
        self._strategies[model] = strategy
        return strategy

    def cross_in(
        self,
        inference: Inference,
        placements: list[Placement],
        start: int,
        deadline: float,
        answer: CrossedAnswer,
        flush: Callable[[], None],
    ) -> None:
        """A request another front checked, into this front's batcher of its version (the
        primary's side of ``batch_elsewhere``): its sequence batcher for a sequence model.
        Counted in this front's statistics from ``start`` (its arrival there), answered by
        ``deadline`` (this loop's time). What refuses it at once is raised; otherwise
        ``answer(result, error)`` is called once, and ``flush`` after its batch's crossed
        answers (``BatchRunner.infer_crossed``: a dynamic batcher's request takes no task).

        (By the model, not by the request: an ensemble's steps all carry its sequence, a
        dynamically batched step too, which ignores it.)"""
        model = inference.model
        stats = self.stats.of(model)
        if model.config is not None and model.config.sequence_batching is not None:
            sequencer = self._sequencer(model)
            task = self._loop.create_task(
                _sequence_crossed(sequencer, inference, placements, stats, start, deadline, answer)
            )
            self._crossing.add(task)
            task.add_done_callback(self._crossing.discard)
            return
        try:
            model.check_serving()
        except BaseException as exc:
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        self._batches.infer_crossed(inference, stats, start, placements, deadline, answer, flush)

    def _sequencer(self, model: ModelVersion) -> Sequenced:
        """The sequence batcher of a sequence version (made with its strategy)."""
        sequencer = self._sequencers.get(model)
        if sequencer is None:
            self._strategy_of(model)
            sequencer = self._sequencers.get(model)
        if sequencer is None:
            raise InternalError(f"model '{model.name}' has no sequence batcher")
        return sequencer

    def _ensembles(self) -> EnsembleRunner:
        """The strategy of ensembles, made at the first ensemble request."""
        if self._ensemble_runner is None:
            self._ensemble_runner = EnsembleRunner(
                self._intake, self.dispatch, self._strategy_of, self.stats.of, self._unbatched
            )
        return self._ensemble_runner

    def _strategy_of(self, model: ModelVersion) -> Strategy:
        strategy = self._strategies.get(model)
        return strategy if strategy is not None else self._choose(model)

    def _forget_gone(self) -> None:
        """Forget the strategies of versions that left the registry (unloaded, reloaded)."""
        models = self.registry.models
        gone = [m for m in self._strategies if models.get(m.name, {}).get(m.version) is not m]
        for model in gone:
            del self._strategies[model]
            self._sequencers.pop(model, None)
        if gone and self.cache is not None:
            self.cache.forget({model.serial for model in gone})

    async def parse_json(
        self, model: ModelVersion, lease: Lease, start: int, body: memoryview
    ) -> tuple[InferRequest, list[tuple[int, int] | None]] | None:
        """A large JSON body parsed by one of the model's workers (``json_offload``).

        None when the front should parse it itself: a small body, a model that the front
        answers (echo), or one that no worker holds (an ensemble: its steps' workers
        hold them; it was refused 503, "no running instance", found by fuzzing).
        """
        if model.echo or len(body) < json_offload.PARSE_MIN or not model.workers:
            return None
        deadline = self._loop.time() + self.infer_timeout
        # (a job at the worker of its connection's, as the request's inference is: an h2c
        #  connection's large bodies filled the worker's queue past its share, fuzzing)
        max_queue = self.max_queue
        worker, done = await worker_in_share(
            share_of(max_queue), deadline, lambda: model.pick(max_queue)
        )
        return await json_offload.parse(worker, lease, start, body, deadline, done)

    def refused(self, model: ModelVersion, exc: BaseException) -> None:
        """Count a request a protocol adapter refused after resolving its model.

        (A malformed body for a known model.) Its time is not measured: the data plane
        never saw it; it counts with 0 ns.
        """
        self.stats.of(model).request_failed(refusal_reason(exc), 0)


async def _sequence_crossed(
    sequencer: Sequenced,
    inference: Inference,
    placements: list[Placement],
    stats: ModelStats,
    start: int,
    deadline: float,
    answer: CrossedAnswer,
) -> None:
    """A sequence request another front sent, through its sequence batcher to ``answer``."""
    model = inference.model
    model.in_flight += 1
    try:
        result = await sequencer.run_checked(inference, placements, stats, start, deadline)
    except BaseException as exc:
        model.in_flight -= 1
        answer(None, exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return
    model.in_flight -= 1
    answer(result, None)


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
