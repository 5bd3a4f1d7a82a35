"""Where a model version's sessions go, and each one made on its worker.

Which repository workers hold a version (all of them, or its ``instance_group``'s), the
execution providers and session options a session is given on a worker's device, a GPU
session that ONNX Runtime put on the CPU refused, CPU workers started for a ``KIND_CPU``
group when the server runs none, and a replacement worker given the sessions its slot
held. ``ModelManager`` (``models.manager``) decides which versions are loaded, reloaded
and unloaded; this module places their sessions for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from hardware import InventoryError, cuda_provider_options
from oipserve.errors import InvalidInput, ServerError
from oipserve.models.config.session_options import session_options
from oipserve.models.instance_groups import place_groups
from oipserve.models.metadata import MetadataConflict
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.handle import WorkerHandle, own_handle
from oipserve.pool.link import WorkerDied, WorkerLink
from oipserve.pool.worker_pool import WorkerPool
from oipserve.wire.messages import Loaded

__all__ = ["Placement", "gpu_fallback_refusal", "unload_quietly", "where"]

# NOTE: the logger the load lines always came from (operators grep for it).
log = logging.getLogger("oipserve.models")

#: Seconds a load waits for the worker replacements under way before it places its
#: sessions (one start, and one pause between failed starts, ``worker_pool.MAX_PAUSE``).
REPLACEMENT_WAIT = 15.0
#: Times a version's sessions are placed when workers die during a placement (each
#: replaced, as their models are).
PLACEMENT_TRIES = 2

#: The provider a session planned on a GPU must really get (``gpu_fallback_refusal``).
_CUDA = "CUDAExecutionProvider"


class Placement:
    """Places the sessions of model versions on the workers, for ``ModelManager``."""

    def __init__(
        self,
        pool: WorkerPool,
        registry: ModelRegistry,
        simulate_devices: bool = False,
        start_cpu_workers: Callable[[], Awaitable[list[WorkerHandle]]] | None = None,
    ) -> None:
        self.pool = pool
        self.registry = registry
        #: Starts CPU workers when a KIND_CPU instance group needs them and ``--devices``
        #: started none (Triton runs KIND_CPU instances on the CPU whatever GPUs exist).
        self.start_cpu_workers = start_cpu_workers
        #: Ids of the workers started that way: they hold KIND_CPU instances only.
        self.cpu_on_demand: set[int] = set()
        #: Fake inventory (``gpu_sessions: "simulated"``): GPUs do not exist, so sessions run
        #: on the CPU provider while the planned CUDA providers are only recorded
        #: (``ModelVersion.placements``).
        self.simulate_devices = simulate_devices

    def providers_for(
        self, worker: WorkerHandle, model: ModelVersion
    ) -> list[tuple[str, dict[str, str]]]:
        """Providers planned for ``model`` on ``worker``'s device; InvalidInput on bad options."""
        if not worker.device.startswith("cuda:"):
            return [("CPUExecutionProvider", {})]
        index = int(worker.device.partition(":")[2])
        try:
            options = cuda_provider_options(index, {**model.parameters, **model.cuda_settings})
        except InventoryError as exc:
            raise InvalidInput(f"model '{model.name}': {exc}") from None
        return [("CUDAExecutionProvider", options), ("CPUExecutionProvider", {})]

    def repository_workers(self) -> list[WorkerHandle]:
        """Workers that hold repository models: those started with the server."""
        return [w for w in self.pool.workers if w.alive and not w.dedicated]

    def workers_for(self, model: ModelVersion) -> list[WorkerHandle]:
        """The repository workers that get a session of ``model``; MetadataConflict if none fit.

        Without ``instance_group`` every repository worker holds the model. With it, as
        in Triton: ``KIND_CPU`` places ``count`` instances on the CPU, ``KIND_GPU`` on each
        GPU of ``gpus`` (all GPUs when empty), ``KIND_AUTO``/``KIND_MODEL`` on the GPUs if
        the server runs any, else on the CPU (``models.instance_groups``; the model keeps
        the groups so resolved for its config response). An instance is a session in one worker
        process, so ``count`` is capped at the worker processes of that device
        (``--instances-per-device``): two sessions in one single-threaded worker would
        not run at the same time.
        """
        workers = self.repository_workers()
        groups = model.config.instance_groups if model.config else ()
        if not groups:
            return [w for w in workers if w.worker_id not in self.cpu_on_demand]
        chosen, model.instance_groups = place_groups(groups, workers, model.name)
        return chosen

    async def place(self, model: ModelVersion, worker: WorkerHandle, threads: int | None) -> Loaded:
        """Create one session of ``model`` on ``worker`` and record what it was given.

        A session sent to a GPU that ONNX Runtime put on the CPU is unloaded at once and
        the placement fails (InvalidInput, like the worker's own load refusals).
        """
        planned = self.providers_for(worker, model)
        sent = [("CPUExecutionProvider", {})] if self.simulate_devices else planned
        level = model.config.graph_level if model.config is not None else 0
        options = session_options(model.name, model.parameters, level)
        loaded = await worker.load(model.key, model.path, sent, threads, options)
        refusal = gpu_fallback_refusal(
            model.name, model.version, worker.device, [name for name, _ in sent], loaded.providers
        )
        if refusal is not None:
            await unload_quietly(worker, model.key)
            raise InvalidInput(refusal)
        model.session_threads[worker.worker_id] = threads
        model.placements[worker.worker_id] = {
            "worker": worker.worker_id,
            "device": worker.device,
            "providers": [[name, options] for name, options in planned],
            "simulated": self.simulate_devices and planned != sent,
            "session_providers": loaded.providers,
            "graph_optimization_level": loaded.graph_optimization_level,
        }
        model.providers[worker.worker_id] = loaded.providers
        return loaded

    async def cpu_workers_on_demand(self, model: ModelVersion) -> None:
        """Start CPU workers for a KIND_CPU group when the server runs none (once)."""
        groups = model.config.instance_groups if model.config else ()
        wanted = any(g.kind == "KIND_CPU" for g in groups)
        if not wanted or self.start_cpu_workers is None:
            return
        if any(w.device == "cpu" for w in self.repository_workers()):
            return
        started = await self.start_cpu_workers()
        self.cpu_on_demand.update(w.worker_id for w in started)

    async def place_everywhere(self, model: ModelVersion) -> list[Loaded]:
        """A session of ``model`` on each worker that is to hold it (``workers_for``).

        A worker being replaced gets the registry's models back, not this version's: the
        placement waits for the replacements under way, or the version would leave the
        slot without a session for good. A worker that dies during the placement is
        replaced so too: the placement is made again, once, on the workers then running
        (the sessions made meanwhile unloaded first). Such a load failed for good: a 400
        blaming the model, and a model unavailable with its worker back (found by fuzzing).
        """
        for attempt in range(PLACEMENT_TRIES):
            await self.pool.replaced(REPLACEMENT_WAIT)
            workers = self.workers_for(model)
            model.workers = list(workers)
            retry = attempt + 1 < PLACEMENT_TRIES
            if not workers:
                if retry and self.pool.replacing:  # each died since the wait: one more
                    continue
                raise MetadataConflict("no worker process runs to hold it")
            log.info(
                "model '%s' version %s: loading %s on %s",
                model.name,
                model.version,
                model.path,
                where(workers),
            )
            # Every placement ends before a failure is handled, so none is left loading.
            results = await asyncio.gather(
                *(self.place(model, w, None) for w in workers), return_exceptions=True
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            if not failures:
                return [r for r in results if isinstance(r, Loaded)]
            if not retry or not all(isinstance(f, WorkerDied) for f in failures):
                raise failures[0]
            log.warning(
                "model '%s' version %s: a worker stopped while loading it; loading it again",
                model.name,
                model.version,
            )
            for worker in workers:
                if worker.alive and model.key in worker.models:
                    with contextlib.suppress(WorkerDied):
                        await own_handle(worker).unload(model.key)
        raise AssertionError("unreachable")

    async def reloaded(self, worker: WorkerHandle) -> None:
        """Give a replacement worker the sessions the registry says its slot holds.

        The record is the registry's: every version in service that lists this worker,
        made again as it was first made (``place``, with the threads it had). What the dead
        process held is gone with it. A version taken out of service while its session was
        being made again is unloaded from the new process at once. A failure raises: the
        pool counts it as a failed start and tries again.
        """
        for model in self._held_by(worker):
            if not _serves_on(model, worker):
                continue  # unloaded or replaced meanwhile
            await self.place(model, worker, model.session_threads.get(worker.worker_id))
            if not _serves_on(model, worker):
                await unload_quietly(worker, model.key)
        log.info("worker %d holds %d model versions again", worker.worker_id, len(worker.models))

    def _held_by(self, worker: WorkerHandle) -> list[ModelVersion]:
        """The versions in the registry (repository models and endpoints) with a session on
        ``worker``'s slot."""
        return [
            model
            for versions in self.registry.models.values()
            for model in versions.values()
            if _serves_on(model, worker)
        ]


def gpu_fallback_refusal(
    name: str, version: str, device: str, sent: list[str], session_providers: list[str]
) -> str | None:
    """Why a session sent to the GPU cannot serve there, or None when it got its GPU.

    ONNX Runtime silently falls back to the next provider when the CUDA one cannot start
    (a CPU-only onnxruntime, CUDA or cuDNN libraries that do not load, a driver too old
    for them). As in Triton, a GPU instance without its GPU is a failed load, not a CPU
    instance many times slower than the operator expects.
    """
    if not sent or sent[0] != _CUDA or _CUDA in session_providers:
        return None
    got = ", ".join(session_providers) or "no execution provider"
    return (
        f"model '{name}' version {version} on {device}: ONNX Runtime could not use the GPU "
        f"(the session got {got} only); install onnxruntime-gpu with CUDA and cuDNN libraries "
        "that match the driver (docs/deploy.md), or serve the model on the CPU "
        "(--devices cpu, or instance_group KIND_CPU)"
    )


async def unload_quietly(worker: WorkerHandle, key: str) -> None:
    """Unload ``key`` from ``worker``; a worker that died meanwhile has nothing left to unload."""
    try:
        await worker.unload(key)
    except ServerError:
        pass


def _serves_on(model: ModelVersion, worker: WorkerHandle) -> bool:
    """``model`` is in service and one of its sessions belongs on ``worker``'s slot."""
    return model.state == "READY" and not model.echo and worker in model.workers


def where(workers: Sequence[WorkerLink]) -> str:
    """Where a version's sessions are, for the log: ``worker 0 (cpu), worker 1 (cuda:0)``."""
    return ", ".join(f"worker {w.worker_id} ({w.device})" for w in workers) or "no worker"
