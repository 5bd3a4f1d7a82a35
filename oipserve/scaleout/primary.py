"""The primary front's side of ``--http-workers N``: the N-1 other HTTP fronts.

The primary starts each replica (``python -m oipserve.scaleout.process``) with a
control socket, tells it what it answers itself (``snapshot``: the workers'
addresses, the READY repository versions), and keeps it in step:

- after every change of the registry and every worker replacement, a new snapshot
  (``sync``), acknowledged before the load or unload answers its client;
- before a version's sessions are unloaded, ``retire``: the replicas stop answering
  it and finish the requests they already sent to its workers;
- clients' shared-memory regions registered or unregistered here, mirrored
  (``RegionMirror``);
- statistics: the replicas' rows, collected when statistics or metrics are read.

A replica that dies is replaced (its segments swept, its last statistics rows kept
so that counters never go back); at shutdown every replica drains its own requests.
Watching, replacing and stopping them is ``oipserve.scaleout.supervision``'s.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Callable

import msgspec

from oipserve.config.settings import Settings
from oipserve.dataplane.plane import DataPlane
from oipserve.errors import InternalError, WorkerProtocolError, from_kind
from oipserve.models.manager import ModelManager
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.worker_pool import WorkerPool
from oipserve.request.client_regions import ClientRegions
from oipserve.runtime.workerproc import ChildProcess, exit_status
from oipserve.scaleout.batch_desk import BatchDesk
from oipserve.scaleout.control import (
    CollectStats,
    Drain,
    FromReplica,
    Listening,
    Refused,
    RegionAdded,
    RegionsBusy,
    RegionsIdle,
    RegionSpec,
    RegionsRemoved,
    Retire,
    Snapshot,
    Start,
    StatsRows,
    ToReplica,
    VersionCopy,
    WorkerCopy,
    from_replica_decoder,
)
from oipserve.scaleout.framed import FramedProtocol
from oipserve.scaleout.supervision import Supervisor
from oipserve.telemetry.stats_row import StatsRow
from oipserve.wire.shm import sweep

log = logging.getLogger("oipserve.replicas")

#: Seconds a new replica may take to import, connect to the workers and listen.
START_TIMEOUT = 60.0
#: Seconds a replica may take to acknowledge a snapshot or a region (no request waits on
#: it; one that does not answer is broken and is replaced).
ANSWER_TIMEOUT = 30.0


def snapshot(seq: int, registry: ModelRegistry, pool: WorkerPool) -> Snapshot:
    """What replicas answer themselves: READY repository versions (batched ones checked
    there, batched here: ``batch_desk``), on the workers that accept other fronts.
    Everything else (worker endpoints, echo) they hand to the primary."""
    workers = [
        WorkerCopy(w.worker_id, w.device, w.segment_prefix, w.front_address)
        for w in pool.workers
        if w.alive and w.front_address and not w.dedicated
    ]
    reachable = {w.worker_id for w in workers}
    versions = []
    for versions_of_model in registry.models.values():
        for model in versions_of_model.values():
            if not _answered_by_replicas(model):
                continue
            sessions = {
                w.worker_id: w.models[model.key]
                for w in model.workers
                if w.worker_id in reachable and model.key in w.models
            }
            # NOTE: an ensemble runs on no worker: every front runs its steps (on the
            #   composing models' sessions, which are in the snapshot too).
            if sessions or (model.config is not None and model.config.ensemble is not None):
                versions.append(_copy(model, sessions))
    return Snapshot(seq, workers, versions)


def _answered_by_replicas(model: ModelVersion) -> bool:
    # NOTE: worker endpoints' models change outside the model manager: the primary's only.
    return model.state == "READY" and model.repository and not model.echo


def _copy(model: ModelVersion, sessions: dict) -> VersionCopy:
    return VersionCopy(
        model.name,
        model.version,
        model.serial,
        model.key,
        model.path,
        model.config,
        model.inputs,
        model.outputs,
        model.echo,
        sessions,
    )


class Replica:
    """One running replica: its process and the primary's end of its control socket."""

    def __init__(self, index: int, process: ChildProcess, segment_prefix: str) -> None:
        self.index = index
        self.process = process
        self.segment_prefix = segment_prefix
        self.control: FramedProtocol[FromReplica] | None = None
        #: The primary's end of its batch socket (``batch_desk``).
        self.batches: BatchDesk | None = None
        self.pending: dict[int, asyncio.Future[FromReplica]] = {}
        #: Its statistics rows as last collected (kept by the primary when it dies).
        self.last_rows: list[StatsRow] = []
        #: Told to drain (shutdown): it carries out nothing sent after that.
        self.draining = False
        #: Its control socket closed (it died): it answers nothing more.
        self.gone: ConnectionError | None = None

    def on_message(self, message: FromReplica) -> None:
        future = self.pending.pop(message.seq, None)
        if future is not None and not future.done():
            future.set_result(message)

    def on_closed(self) -> None:
        self.gone = ConnectionError(f"replica {self.index} (pid {self.process.pid}) is gone")
        for future in self.pending.values():
            if not future.done():
                future.set_exception(self.gone)
        self.pending.clear()

    def ask(self, message: ToReplica) -> asyncio.Future[FromReplica]:
        future: asyncio.Future[FromReplica] = asyncio.get_running_loop().create_future()
        if self.gone is not None:
            # NOTE: its socket closes when it dies, before the supervisor sees the exit
            #   and takes it out of ``running``: an ask meanwhile would wait its whole
            #   patience (30 s), then "replace" a process already gone.
            future.set_exception(self.gone)
            return future
        if self.control is None:
            raise InternalError(f"replica {self.index} was asked before its control link was up")
        self.pending[message.seq] = future
        self.control.send(message)
        return future


class Replicas:
    """The other HTTP fronts: started, kept in step, replaced, drained."""

    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        pool: WorkerPool,
        plane: DataPlane,
        forward_to: str,
        grpc: tuple[int, str] | None = None,
    ) -> None:
        """``grpc``: the gRPC port the other fronts serve too, and the address of the
        primary's private gRPC socket; None: they serve no gRPC. ``plane``'s batchers take
        the requests of batching versions the replicas check (``batch_desk``)."""
        self._settings = settings
        self._plane = plane
        self._encoded_settings = msgspec.json.encode(settings)
        self._registry = registry
        self._pool = pool
        self._forward_to = forward_to
        self._grpc = grpc or (0, "")
        self._count = settings.http_workers - 1
        self._port = 0
        self._seq = itertools.count(1)
        self._started = itertools.count(1)
        self._children: Supervisor[Replica] = Supervisor(
            log, "an HTTP front", _describe, self._start_one, self._cleanup
        )
        #: Statistics rows of replicas that died: kept, so that counters never go back.
        self._rows_of_the_dead: list[StatsRow] = []
        #: Clients' regions registered here (``follow_the_primary``), for a front started.
        self.regions: Callable[[], list[tuple[str, str, int, int]]] = list

    @property
    def running(self) -> list[Replica]:
        """The replicas serving now, and any that is being started (it gets every
        control message from its ``Start`` on)."""
        return self._children.running

    async def start(self, port: int) -> None:
        """Start every replica on ``port``; RuntimeError when one cannot start."""
        self._port = port
        try:
            for index in range(1, self._count + 1):
                await self._children.add(index)
        except BaseException:
            self._children.abandon()
            raise

    async def _start_one(self, index: int) -> Replica:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        batches_ours, batches_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = ChildProcess(
                "oipserve.scaleout.process",
                ["--control-fd", str(theirs.fileno()), "--batch-fd", str(batches_theirs.fileno())],
                (theirs.fileno(), batches_theirs.fileno()),
            )
        except BaseException:
            ours.close()
            batches_ours.close()
            raise
        finally:
            theirs.close()
            batches_theirs.close()
        # NOTE: a prefix of its own for every process started, never reused: a worker or a
        #   sweep must never take a replacement's segments for its predecessor's.
        segment_prefix = f"{self._pool.prefix}r{next(self._started)}-"
        replica = Replica(index, process, segment_prefix)
        control = FramedProtocol(from_replica_decoder(), replica.on_message, replica.on_closed)
        await loop.connect_accepted_socket(lambda: control, ours)
        replica.control = control
        desk = replica.batches = BatchDesk(self._plane, self._registry)
        await desk.open(batches_ours)
        # NOTE: in ``running`` from its Start on, so that a ``sync`` meanwhile reaches it
        #   too (it handles its control messages in order).
        self.running.append(replica)
        start = Start(
            next(self._seq),
            index,
            self._port,
            self._forward_to,
            *self._grpc,
            segment_prefix,
            self._pool.prefix,
            self._encoded_settings,
            snapshot(next(self._seq), self._registry, self._pool),
            [RegionSpec(*region) for region in self.regions()],
        )
        try:
            reply = await asyncio.wait_for(replica.ask(start), START_TIMEOUT)
            if isinstance(reply, Refused):
                raise RuntimeError(f"HTTP front {index} cannot serve: {reply.message}")
            if not isinstance(reply, Listening):
                raise WorkerProtocolError(
                    f"HTTP front {index} answered {type(reply).__name__} to Start"
                )
        except BaseException as exc:
            self._children.leave(replica)
            desk.close()
            process.kill()
            process.join(5)
            sweep(segment_prefix)
            if isinstance(exc, ConnectionError | TimeoutError):
                raise RuntimeError(
                    f"HTTP front {index} did not start{exit_status(process.returncode)}"
                ) from None
            raise
        log.info("HTTP front %d (pid %d) serves port %d", index, reply.pid, self._port)
        return replica

    # ---- keeping them in step -------------------------------------------------------

    async def sync(self) -> None:
        """Every replica gets the registry as it is now; returns once all applied it."""
        if not self.running:
            return
        await self._keep_in_step(
            lambda seq: snapshot(seq, self._registry, self._pool), ANSWER_TIMEOUT
        )

    async def retire(self, model: ModelVersion, why: str) -> None:
        """Every replica stops answering ``model`` and finishes what it sent to it."""
        # NOTE: what it sent may run until its deadline: the answer may take that long.
        patience = self._settings.infer_timeout + ANSWER_TIMEOUT
        await self._keep_in_step(lambda seq: Retire(seq, model.serial, why), patience)

    async def collect(self) -> list[StatsRow]:
        """The statistics rows of every replica (and of those that died)."""
        rows = list(self._rows_of_the_dead)
        for replica, reply in await self.ask_all(CollectStats):
            if isinstance(reply, StatsRows):
                replica.last_rows = reply.rows
                rows.extend(reply.rows)
        return rows

    async def ask_all(
        self, make: Callable[[int], ToReplica], patience: float | None = ANSWER_TIMEOUT
    ) -> list[tuple[Replica, FromReplica]]:
        """Send every replica a request made by ``make(seq)``; their answers. A replica
        that died is left out; one silent for ``patience`` seconds is killed (and
        replaced; None: no limit); a refusal is an answer (``Refused``), for the caller
        to judge."""
        # NOTE: not a draining replica: it has stopped following, and a load or unload
        #   that runs into a shutdown would wait ``patience`` for it, then kill it.
        asked = [
            (replica, replica.ask(make(next(self._seq))))
            for replica in self.running
            if not replica.draining
        ]
        answers: list[tuple[Replica, FromReplica]] = []
        for replica, answer in asked:
            try:
                reply = await asyncio.wait_for(answer, patience)
            except ConnectionError:
                continue  # it died: its replacement starts from a fresh snapshot
            except TimeoutError:
                log.error(
                    "HTTP front %d (pid %d) did not answer in %.0fs; replacing it",
                    replica.index,
                    replica.process.pid,
                    patience,
                )
                replica.process.kill()
                continue
            answers.append((replica, reply))
        return answers

    async def _keep_in_step(self, make: Callable[[int], ToReplica], patience: float) -> None:
        """``ask_all`` for what every replica must carry out: one that cannot is out of
        step with the primary, so it is replaced (it starts from a fresh snapshot)."""
        for replica, reply in await self.ask_all(make, patience):
            if isinstance(reply, Refused):
                log.error(
                    "HTTP front %d (pid %d) could not follow the primary (%s); replacing it",
                    replica.index,
                    replica.process.pid,
                    reply.message,
                )
                replica.process.kill()

    # ---- deaths and shutdown --------------------------------------------------------

    def _cleanup(self, gone: Replica) -> None:
        """A replica exited: its link closed, its segments swept, its last rows kept."""
        if gone.control is not None and gone.control.transport is not None:
            gone.control.transport.close()
        if gone.batches is not None:
            gone.batches.close()
        sweep(gone.segment_prefix)
        if self._children.stopping:
            return
        serving = {
            m.serial for versions in self._registry.models.values() for m in versions.values()
        }
        self._rows_of_the_dead = [
            row for row in [*self._rows_of_the_dead, *gone.last_rows] if row.serial in serving
        ]

    async def stop(self, timeout: float) -> None:
        """Every replica stops accepting and answers what it received, then exits."""

        def drain(replica: Replica) -> None:
            if replica.control is None:
                raise InternalError(f"replica {replica.index} is running without a control link")
            replica.draining = True
            replica.control.send(Drain(next(self._seq), timeout))

        await self._children.stop(timeout, drain)


def _describe(replica: Replica) -> str:
    return f"HTTP front {replica.index} (pid {replica.process.pid})"


class RegionsOfReplicas:
    """Clients' shared-memory regions, mirrored to every replica (``RegionMirror``)."""

    def __init__(self, replicas: Replicas) -> None:
        self._replicas = replicas

    async def added(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Every replica registers it too; the first refusal is raised as its error."""
        added = await self._replicas.ask_all(
            lambda seq: RegionAdded(seq, name, key, offset, byte_size)
        )
        for _, reply in added:
            if isinstance(reply, Refused):
                raise from_kind(reply.kind, reply.message)

    async def removed(self, name: str | None) -> set[str]:
        """Every replica unregisters it too (at once); the names requests there still use."""
        busy: set[str] = set()
        for _, reply in await self._replicas.ask_all(lambda seq: RegionsRemoved(seq, name)):
            if isinstance(reply, RegionsBusy):
                busy.update(reply.names)
        return busy

    async def idle(self, names: list[str]) -> None:
        """Once no replica uses any of ``names``: as long as their requests run (no
        patience limit: a replica that dies answers by closing its socket)."""
        await self._replicas.ask_all(lambda seq: RegionsIdle(seq, names), None)


def forward_address(prefix: str) -> str:
    """Where the primary takes what the other fronts forward: an abstract Unix socket
    (nothing to remove from the file system, gone with the process)."""
    return f"\0{prefix}http"


def grpc_forward_address(prefix: str) -> str:
    """Where the primary takes the gRPC calls the other fronts forward."""
    return f"\0{prefix}grpc"


def follow_the_primary(
    replicas: Replicas,
    manager: ModelManager,
    pool: WorkerPool,
    regions: ClientRegions,
    dataplane: DataPlane,
) -> None:
    """Keep the replicas in step with this process: loads and unloads, worker
    replacements, clients' regions; and count their requests in the statistics."""
    manager.changed = replicas.sync
    manager.retiring = replicas.retire
    pool.on_replaced(lambda _worker: replicas.sync())
    regions.mirror = RegionsOfReplicas(replicas)
    replicas.regions = regions.registered
    dataplane.stats.collect = replicas.collect
