"""Models being served: their versions, metadata, state and instances.

The registry answers "which version serves this request, and is it ready". Loading
versions onto workers is ``oipserve.models.manager``'s job, placing their sessions
``oipserve.models.placement``'s.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Literal

from mypy_extensions import mypyc_attr

from oipserve.errors import InvalidInput, NotFound, Unavailable
from oipserve.models.config.parse import InstanceGroup, ModelConfig
from oipserve.models.metadata import TensorSpec, merge_metadata
from oipserve.pool.link import WorkerLink
from oipserve.wire.images import ImageError, ImageSpec

if TYPE_CHECKING:
    from oipserve.scheduling.scheduler import DynamicBatcher

__all__ = [
    "ModelRegistry",
    "ModelVersion",
    "TensorSpec",
    "merge_metadata",
]

log = logging.getLogger("oipserve.models")

State = Literal["LOADING", "READY", "UNAVAILABLE", "UNLOADING"]
PLATFORM: Final = "onnxruntime_onnx"


#: Serial numbers of ModelVersion objects: one per load, never reused in this process.
_SERIALS: Final = itertools.count(1)

#: Reasons of versions taken out of service on purpose (``ModelManager._unload_version``).
GONE: Final = ("unloaded", "replaced by a reload")


def unknown_model(name: str) -> NotFound:
    """A name never loaded since start, in Triton's words: its clients (and Triton's example
    clients) match "Request for unknown model"."""
    return NotFound(f"Request for unknown model: '{name}' is not found")


def check_version(version: str) -> str:
    """A requested version, as the registry names it: InvalidInput in Triton's words (its
    clients match them) for one that is not a number, not a NotFound for a version named
    "latest". Leading zeros are dropped: Triton reads "01" as version 1 (it answered 404
    here; found by fuzzing), as the repository reads a directory ``01``."""
    if not (version.isascii() and version.isdigit()):
        raise InvalidInput(
            f"failed to get model version from specified version string '{version}', "
            "version should be an integral value > 0"
        )
    return version.lstrip("0") or "0"


# NOTE: compiled (mypyc), and extended by ``models.ensemble.EnsembleVersion``, which is not.
@mypyc_attr(allow_interpreted_subclasses=True)
class ModelVersion:
    """One version of one model, and the workers that hold a session for it."""

    def __init__(self, name: str, version: str, path: str, config: ModelConfig | None) -> None:
        self.name = name
        self.version = version
        #: The version's number, which orders versions (0 for a name that is none: an AMD
        #: endpoint's ``version`` parameter for a bare .onnx may be any string).
        self.number = int(version) if version.isascii() and version.isdigit() else 0
        self.key = f"{name}/{version}"
        #: This load of the version, for the other HTTP fronts (``oipserve.scaleout``): their
        #: copies and statistics rows name it, and a reload's new objects get new serials.
        self.serial = next(_SERIALS)
        self.path = path
        self.config = config
        self.max_batch_size = config.max_batch_size if config else 0
        self.parameters: dict[str, str] = dict(config.parameters) if config else {}
        self.state: State = "LOADING"
        self.reason = ""
        #: Seconds its load took, once READY (``nv_model_load_duration_secs``).
        self.load_seconds = 0.0
        self.inputs: tuple[TensorSpec, ...] = ()
        self.outputs: tuple[TensorSpec, ...] = ()
        self.input_map: dict[str, TensorSpec] = {}
        self.output_map: dict[str, TensorSpec] = {}
        #: The outputs' names in order, made once (a request's JSON outputs when it names
        #: none): shared by every such request, so never changed in place.
        self.output_names: list[str] = []
        self.workers: list[WorkerLink] = []
        #: The outputs a request that names none runs: [] (all the graph's) unless the
        #: graph has outputs config.pbtxt leaves out; then the ones it lists, as Triton
        #: (an unlisted output was computed, and cut by rows: a 500; found by fuzzing).
        self.run_outputs: list[str] = []
        #: The config's instance groups as placed on this server's devices (kind and GPUs
        #: resolved, ``Placement.workers_for``); () without instance_group.
        self.instance_groups: tuple[InstanceGroup, ...] = ()
        self.providers: dict[int, list[str]] = {}
        self.platform = PLATFORM
        #: Echo endpoints are answered by the front (inputs copied to outputs), no session.
        self.echo = False
        #: Loaded from the repository by ``ModelManager`` (not a worker endpoint's model): the
        #: other HTTP fronts may answer it (``oipserve.scaleout``).
        self.repository = False
        #: Extra CUDA settings (from worker-load parameters) on top of config parameters.
        self.cuda_settings: dict[str, str] = {}
        #: Its dynamic batcher (config.pbtxt ``dynamic_batching``), made on first use.
        self.batcher: DynamicBatcher | None = None
        #: Its sequence batcher's ``close`` (``sequence_batching``), set on first use: told
        #: at ``stop_serving``, as the dynamic batcher is, to answer its waiting requests.
        self.sequencer_close: Callable[[Unavailable], None] | None = None
        #: Requests in the data plane now (``DataPlane.infer``), queued or running.
        self.in_flight = 0
        #: What each input takes as encoded images, or why it takes none, worked out on
        #: the first request that sends it images (``request.images``).
        self.image_specs: dict[str, ImageSpec | ImageError] = {}
        #: Worker id -> where the session went and what it was given, for GET /v2/hardware.
        self.placements: dict[int, dict[str, object]] = {}
        #: Worker id -> the intra-op threads its session was made with (None: the worker's
        #: own): with ``workers``, the record a replacement of that worker is loaded from.
        self.session_threads: dict[int, int | None] = {}

    def set_metadata(self, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.input_map = {t.name: t for t in inputs}
        self.output_map = {t.name: t for t in outputs}
        self.output_names = [t.name for t in outputs]

    def check_serving(self) -> None:
        """NotFound once the version was unloaded; 503 while no worker runs it."""
        self.check_not_unloaded()
        if not self.instances():
            raise self._no_instance()

    def check_not_unloaded(self) -> None:
        """A retryable 503 once this version was unloaded or replaced by a reload."""
        # NOTE: a request that found this version before it was unloaded (or replaced by
        #   a reload) is in flight: it gets a retryable 503, never "unknown" (404).
        if self.state in ("UNLOADING", "UNAVAILABLE") and self.reason in GONE:
            raise self.gone_while("in flight")

    def stop_serving(self, why: str) -> None:
        """Out of service (unloaded, replaced, retired): a request that still finds it gets
        a retryable 503 (``gone_while``), those queued in its batcher get it now, and
        batches already running finish."""
        self.state = "UNLOADING"
        self.reason = why
        if self.batcher is not None:
            self.batcher.close(self.gone_while("queued"))
        if self.sequencer_close is not None:
            self.sequencer_close(self.gone_while("queued"))

    def gone_while(self, what: str) -> Unavailable:
        """The 503 of a request that found this version before it was taken out of service."""
        return Unavailable(
            f"model '{self.name}' version {self.version} was {self.reason} while this "
            f"request was {what}; retry",
            retry_after=1,
        )

    def _no_instance(self) -> Unavailable:
        return Unavailable(
            f"model '{self.name}' version {self.version} has no running instance "
            "(its worker is restarting)",
            retry_after=1,
        )

    def pick(self, max_queue: int) -> WorkerLink:
        """The worker with the fewest requests in flight, or 503."""
        self.check_not_unloaded()
        best: WorkerLink | None = None
        best_load = 0
        for worker in self.workers:
            if worker.alive and self.key in worker.models:
                load = worker.in_flight + worker.away
                if best is None or load < best_load:
                    best, best_load = worker, load
        if best is None:
            raise self._no_instance()
        if best.in_flight >= max_queue:
            raise Unavailable(
                f"model '{self.name}' is overloaded: {best.in_flight} requests queued on "
                "each of its instances",
                retry_after=1,
            )
        return best

    def instances(self) -> list[WorkerLink]:
        """The workers that can run this version now, this front's own first (``away``:
        the dynamic batcher takes the first one free)."""
        running = [w for w in self.workers if w.alive and self.key in w.models]
        running.sort(key=_away)
        return running

    @property
    def ready(self) -> bool:
        if self.echo:
            return self.state == "READY"
        return self.state == "READY" and any(w.alive and self.key in w.models for w in self.workers)


def _away(worker: WorkerLink) -> int:
    return worker.away


class ModelRegistry:
    """Name -> version -> ModelVersion, plus the set that readiness depends on."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, ModelVersion]] = {}
        self.failed: dict[str, str] = {}
        self.required: set[str] = set()
        #: Names unloaded on request, for a clearer 404.
        self.unloaded: set[str] = set()
        #: Versions unloaded on their own (``.../versions/{v}/unload``) while others of
        #: the model serve on, and those of an uploaded model unloaded whole (no
        #: directory to list them from): the repository index lists them as unloaded.
        self.unloaded_versions: dict[str, set[str]] = {}
        #: Names with a repository load under way: known, not ready yet (503, not 404).
        self.loading: set[str] = set()
        #: Counts the times versions were put in ``models`` (a load, a reload, a
        #: snapshot of the primary's): an ensemble checks its steps again after one
        #: (``EnsembleVersion``), as a step's reload may change its tensors.
        self.changes = 0

    def resolve(self, name: str, version: str | None) -> ModelVersion:
        versions = self.models.get(name)
        if versions is None:
            reason = self.failed.get(name)
            if reason is not None:
                raise Unavailable(f"model '{name}' is unavailable: {reason}")
            if name in self.loading:
                raise Unavailable(f"model '{name}' is being loaded; retry", retry_after=1)
            if name in self.unloaded:
                raise NotFound(f"model '{name}' is not loaded (it was unloaded)")
            raise unknown_model(name)
        if version is not None:
            version = check_version(version)
            model = versions.get(version)
            if model is None:
                raise NotFound(
                    f"Request for unknown model: '{name}' version {version} is not found "
                    f"(versions: {', '.join(versions)})"
                )
        else:
            latest = _latest_ready(versions)
            if latest is None:
                any_version = next(iter(versions.values()))
                raise Unavailable(
                    f"model '{name}' has no ready version"
                    + (f": {any_version.reason}" if any_version.reason else "")
                )
            model = latest
        if not model.ready:
            raise Unavailable(
                f"model '{name}' version {model.version} is not ready"
                + (f": {model.reason}" if model.reason else ""),
                retry_after=1,
            )
        return model

    def model_ready(self, name: str, version: str | None) -> bool:
        """Readiness of a known model (or version); unknown ones are NotFound.

        Known: loaded, being loaded, failed to load, or unloaded on request.
        """
        versions = self.models.get(name)
        if versions is None:
            if name in self.failed or name in self.unloaded or name in self.loading:
                return False  # known, not ready (Triton's contract too)
            raise unknown_model(name)
        if version is None:
            return any(v.ready for v in versions.values())
        version = check_version(version)
        model = versions.get(version)
        if model is None:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return model.ready

    def all_ready(self) -> bool:
        for name in self.required:
            versions = self.models.get(name)
            if not versions or not all(v.ready for v in versions.values()):
                return False
        return True


def _latest_ready(versions: dict[str, ModelVersion]) -> ModelVersion | None:
    """The highest-numbered READY version, None if none is.

    PERF: every request that names no version comes here; one pass and the number each
    version parsed once (``ModelVersion.number``), not a list, a key function and an
    ``int()`` of each version's string a request."""
    latest: ModelVersion | None = None
    for candidate in versions.values():
        if candidate.state == "READY" and (latest is None or candidate.number > latest.number):
            latest = candidate
    return latest
