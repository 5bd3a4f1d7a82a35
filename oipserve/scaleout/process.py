"""Another HTTP front (``--http-workers N``): one of N-1 processes beside the primary.

The primary starts it with one end of a control socket (``oipserve.scaleout.control``).
``Start`` brings the settings, the port, where to forward, and the first snapshot:
the workers it connects to (``WorkerLink``, a socket of its own to each) and the
model versions it answers itself. It then binds the HTTP port with ``SO_REUSEPORT``,
so the kernel spreads new connections across all the fronts, and says ``Listening``.

Per request (``Router``): inference of a version it was given runs here, through the
same REST app and data plane as in the primary, straight to a worker; a batched
model's request, once checked here, crosses to the primary's batcher on a socket of
its own (``batch_link``), so that batches form over every front's clients; liveness is
answered here;
everything else (metadata, readiness, statistics, repository and worker-endpoint
APIs, shared-memory registration) is forwarded to the primary over a private Unix
socket (``Forwarder``), so there is one owner of each piece of state.

It stops on ``Drain`` or SIGTERM (answering what it received, like the primary), and
at once when the control socket closes (the primary is gone). It imports no ONNX
Runtime (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import uvloop

from oipserve.config.settings import Settings, configure_logging
from oipserve.dataplane.plane import DataPlane
from oipserve.errors import ServerError
from oipserve.front.grpc.keepalive import ConnectionLimits
from oipserve.front.grpc.listener import H2Server
from oipserve.front.grpc.rpcs import GrpcServer
from oipserve.front.grpc.service import InferenceService
from oipserve.front.grpc.tables import in_front_table
from oipserve.front.http.h2c import refuse_h2c
from oipserve.front.http.server import http_server
from oipserve.front.rest import create_app
from oipserve.front.rest.lane import infer_lane, infer_route
from oipserve.models.ensemble import EnsembleVersion
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.link import WorkerLink, away
from oipserve.request.client_regions import ClientRegions
from oipserve.runtime.collector import settle_garbage_collector
from oipserve.runtime.listeners import tcp_listener
from oipserve.runtime.memory_trim import return_large_blocks_to_os
from oipserve.scaleout.batch_link import PrimaryBatches
from oipserve.scaleout.control import (
    CollectStats,
    Done,
    Drain,
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
    to_replica_decoder,
)
from oipserve.scaleout.forward import Forwarder
from oipserve.scaleout.framed import FramedProtocol
from oipserve.scaleout.grpc_forward import GrpcForwarder
from oipserve.wire.shm import sweep

log = logging.getLogger("oipserve.replicas")

#: How long the process waits for ``Start`` before giving up on the primary.
START_WAIT = 60.0
#: How often a retiring version's requests in flight are looked at.
RETIRE_POLL = 0.005
#: The timeout of the Drain that a SIGTERM to this front alone makes: keep the
#: configured ``--shutdown-timeout``.
OWN_TIMEOUT = -1.0

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class Router:
    """Which front answers a request: this one, or the primary (forwarded).

    Here: ``POST`` inference of a model whose versions this front was given, liveness,
    and any request whose declared body is over the size limit (the local app answers
    413 before reading it). Everything else goes to the primary, unchanged.
    """

    def __init__(self, local: Callable, forward: Callable, max_request_bytes: int) -> None:
        self._local = local
        self._forward = forward
        self._limit = max_request_bytes
        #: Model name -> the versions answered here.
        self.versions: dict[str, frozenset[str]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._answered_here(scope) or self._too_large(scope):
            await self._local(scope, receive, send)
        else:
            await self._forward(scope, receive, send)

    def _answered_here(self, scope: Scope) -> bool:
        path: str = scope["path"].rstrip("/")
        if scope["method"] != "POST":
            return path == "/v2/health/live"
        route = infer_route(path)
        return route is not None and self.answers(*route)

    def answers(self, model: str, version: str | None) -> bool:
        """Whether this front answers inference of ``model`` (``version``, or its default)
        itself: the primary gave it the model's versions."""
        if version is None:
            return model in self.versions
        return version in self.versions.get(model, ())

    def _too_large(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"content-length":
                return value.isdigit() and int(value) > self._limit
        return False


class Links:
    """What the data plane needs of a worker pool here: a segment prefix and the links."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.workers: list[WorkerLink] = []


class Replica:
    """The state of this front: links to the workers, the versions it answers, and the
    requests of the control socket, carried out one at a time in order."""

    def __init__(
        self, settings: Settings, start: Start, control: FramedProtocol[ToReplica]
    ) -> None:
        self.settings = settings
        self.control = control
        self.registry = ModelRegistry()
        self.pool = Links(start.segment_prefix)
        regions = ClientRegions(
            settings.allow_client_shm, start.server_prefix, limit=settings.max_shm_regions
        )
        self.dataplane = DataPlane.of(settings, self.registry, self.pool, regions)
        self.forwarder = Forwarder(start.forward_to)
        self.grpc_forwarder: GrpcForwarder | None = None
        self.router = Router(
            create_app(settings, self.dataplane), self.forwarder, settings.max_request_bytes
        )
        self.index = start.index
        self.links: dict[int, WorkerLink] = {}
        self._addresses: dict[int, str] = {}
        #: The versions answered here, by serial (kept across snapshots with their counters).
        self.versions: dict[int, ModelVersion] = {}
        #: Answers to ``RegionsIdle`` not given yet (kept referenced until they are).
        self._idle_waits: set[asyncio.Task[None]] = set()
        #: Versions the primary no longer lists, until their Retire: a reload lists the
        #: new versions first, and the old ones finish what they hold here meanwhile.
        self.leaving: dict[int, ModelVersion] = {}

    # ---- snapshots --------------------------------------------------------------------

    async def apply(self, snapshot: Snapshot) -> None:
        await self._connect(snapshot)
        models: dict[str, dict[str, ModelVersion]] = {}
        keys = set()
        for copy in snapshot.versions:
            if copy.config is not None and copy.config.ensemble is not None:
                ensemble = self.versions.get(copy.serial) or _ensemble(copy, self.registry)
                models.setdefault(copy.name, {})[copy.version] = ensemble
                continue
            held = {i: load for i, load in copy.sessions.items() if i in self.links}
            if not held:
                continue  # NOTE: no link to any of its workers: the primary answers it
            for worker_id, load in held.items():
                self.links[worker_id].models[copy.key] = load
            keys.add(copy.key)
            model = self.versions.get(copy.serial) or _version(copy)
            model.workers = [self.links[i] for i in held]
            models.setdefault(copy.name, {})[copy.version] = model
        listed = {m.serial for versions in models.values() for m in versions.values()}
        for serial, model in self.versions.items():
            if serial not in listed:
                self._leave(model)
        # NOTE: a leaving version's sessions stay in the workers until its Retire is done
        #   (the primary unloads them only then): its queued requests may still run.
        keys.update(m.key for m in self.leaving.values())
        for link in self.links.values():
            link.models = {k: v for k, v in link.models.items() if k in keys}
        self._serve(models)

    def _leave(self, model: ModelVersion) -> None:
        """A version the snapshot no longer lists: kept for its Retire, if a worker here
        still holds it; otherwise its queued requests are answered 503 now.

        Until 2026-11-27 it was dropped at once: a reload's snapshot came before the old
        version's Retire, which then found nothing, and the requests queued in the old
        version's batcher waited for an instance until their deadline (120 s).
        """
        if any(link.alive and model.key in link.models for link in model.workers):
            self.leaving[model.serial] = model
            return
        model.stop_serving("taken out of service")

    async def _connect(self, snapshot: Snapshot) -> None:
        """A link to every worker listed: kept while it lives at the same address."""
        wanted = {w.worker_id: w for w in snapshot.workers}
        for worker_id, link in list(self.links.items()):
            copy = wanted.get(worker_id)
            if copy is None or not link.alive or self._addresses[worker_id] != copy.address:
                del self.links[worker_id]
                if link.transport is not None:
                    link.transport.close()
        for copy in snapshot.workers:
            if copy.worker_id in self.links:
                continue
            link = WorkerLink(copy.worker_id, copy.device, copy.segment_prefix)
            try:
                await link.connect(copy.address)
            except (OSError, TimeoutError) as exc:
                log.warning("cannot connect to worker %d: %s", copy.worker_id, exc)
                continue
            link.away = away(copy.worker_id, self.index, self.settings.http_workers)
            link.add_death_listener(self.dataplane.worker_gone)
            self.links[copy.worker_id] = link
            self._addresses[copy.worker_id] = copy.address
        self.pool.workers = list(self.links.values())

    def _serve(self, models: dict[str, dict[str, ModelVersion]]) -> None:
        """Answer exactly ``models`` from now on (the router forwards the rest)."""
        self.registry.models = models
        self.registry.changes += 1
        self.versions = {m.serial: m for versions in models.values() for m in versions.values()}
        self.router.versions = {name: frozenset(versions) for name, versions in models.items()}

    async def retire(self, message: Retire) -> None:
        """Forward the version's requests from now on, answer those queued in its batcher
        503, and return once those sent to its workers are answered."""
        model = self.versions.get(message.serial) or self.leaving.get(message.serial)
        if model is None:
            return
        kept = {
            name: {v: m for v, m in versions.items() if m is not model}
            for name, versions in self.registry.models.items()
        }
        self._serve({name: versions for name, versions in kept.items() if versions})
        model.stop_serving(message.why)
        deadline = asyncio.get_running_loop().time() + self.settings.infer_timeout
        while model.in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(RETIRE_POLL)
        if self.leaving.pop(message.serial, None) is not None:
            for link in model.workers:
                link.models.pop(model.key, None)  # the primary unloads it next

    # ---- the control socket -----------------------------------------------------------

    async def follow(self, messages: asyncio.Queue[ToReplica | None]) -> Drain | None:
        """Carry out the primary's requests in order; the Drain that ends them, or None
        when the primary is gone."""
        while True:
            message = await messages.get()
            if message is None:
                return None
            if isinstance(message, Drain):
                return message
            if isinstance(message, RegionsIdle):
                self._answer_when_idle(message)  # may be long: the next message goes on
                continue
            reply: Done | RegionsBusy | Refused
            try:
                reply = await self._carry_out(message)
            except ServerError as exc:
                reply = Refused(message.seq, str(exc), exc.kind)
            except Exception as exc:
                log.exception("HTTP front: %s failed", type(message).__name__)
                reply = Refused(message.seq, f"{type(exc).__name__}: {exc}")
            self.control.send(reply)

    def _answer_when_idle(self, message: RegionsIdle) -> None:
        """``Done`` once no request here uses the unregistered regions ``message.names``."""

        async def answer() -> None:
            await self.dataplane.regions.idle(message.names)
            self.control.send(Done(message.seq))

        task = asyncio.ensure_future(answer())
        self._idle_waits.add(task)
        task.add_done_callback(self._idle_waits.discard)

    async def register_regions(self, regions: list[RegionSpec]) -> None:
        """The clients' regions registered before this front started; one that cannot be
        registered here (its object gone) is left out with a warning, as the primary's
        own requests would then fail on it too."""
        for region in regions:
            try:
                await self.dataplane.regions.register(
                    region.name, region.key, region.offset, region.byte_size
                )
            except ServerError as exc:
                log.warning("shared memory region '%s' is not usable here: %s", region.name, exc)

    async def _carry_out(self, message: ToReplica) -> Done | RegionsBusy:
        if isinstance(message, Snapshot):
            await self.apply(message)
        elif isinstance(message, Retire):
            await self.retire(message)
        elif isinstance(message, RegionAdded):
            await self.dataplane.regions.register(
                message.name, message.key, message.offset, message.byte_size
            )
        elif isinstance(message, RegionsRemoved):
            busy = await self.dataplane.regions.unregister(message.name)
            return RegionsBusy(message.seq, busy)
        return Done(message.seq)

    def grpc_server(self, forward_to: str) -> tuple[H2Server, GrpcServer]:
        """This front's gRPC (not yet listening): inference of the models it was given and
        liveness here, the rest (other models' inference too) forwarded to the primary at
        ``forward_to``. Its listener serves the gRPC port
        (shared with the primary) and adopts this front's HTTP/2 connections on the HTTP
        port (h2c), so each front serves its own."""
        self.grpc_forwarder = GrpcForwarder(forward_to)
        service = InferenceService(self.dataplane)
        table = in_front_table(
            self.settings, service, self.dataplane, self.grpc_forwarder, self.router.answers
        )
        own = H2Server(table, self.settings.header_timeout, ConnectionLimits.of(self.settings))
        own.serve_rest(self.router, self.settings)  # REST over HTTP/2, as the primary's (#39)
        return own, GrpcServer(own)

    def close(self) -> None:
        """After serving: the links, the segments and the regions of this front."""
        self.forwarder.close()
        for link in self.links.values():
            if link.transport is not None:
                link.transport.close()
        self.dataplane.inputs.close()
        self.dataplane.outputs.close()
        self.dataplane.regions.close()
        sweep(self.pool.prefix)


def _ensemble(copy: VersionCopy, registry: ModelRegistry) -> ModelVersion:
    """An ensemble's version as the primary checked it: this front runs its steps on the
    composing versions of its own registry (those of the same snapshot)."""
    config = copy.config
    if config is None or config.ensemble is None:
        raise ValueError(f"{copy.name} is not an ensemble")
    model = EnsembleVersion(copy.name, copy.version, copy.path, config, config.ensemble, registry)
    return _as_copied(model, copy)


def _version(copy: VersionCopy) -> ModelVersion:
    return _as_copied(ModelVersion(copy.name, copy.version, copy.path, copy.config), copy)


def _as_copied(model: ModelVersion, copy: VersionCopy) -> ModelVersion:
    model.key = copy.key
    model.serial = copy.serial
    model.echo = copy.echo
    model.set_metadata(copy.inputs, copy.outputs)
    model.state = "READY"
    return model


class Inbox:
    """The primary's requests as they arrive: statistics answered at once (a retire may wait
    for a long inference; a read of statistics must not wait behind it), the rest queued
    for ``Replica.follow``, in order. None in the queue: the primary is gone."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[ToReplica | None] = asyncio.Queue()
        self.replica: Replica | None = None

    def received(self, message: ToReplica) -> None:
        if isinstance(message, CollectStats) and self.replica is not None:
            rows = self.replica.dataplane.stats.rows()
            self.replica.control.send(StatsRows(message.seq, rows))
        else:
            self.queue.put_nowait(message)

    def closed(self) -> None:
        self.queue.put_nowait(None)


async def serve(control_fd: int, batch_fd: int) -> int:
    loop = asyncio.get_running_loop()
    inbox = Inbox()
    control = FramedProtocol(to_replica_decoder(), inbox.received, inbox.closed)
    await loop.connect_accepted_socket(lambda: control, socket.socket(fileno=control_fd))
    try:
        start = await asyncio.wait_for(inbox.queue.get(), START_WAIT)
    except TimeoutError:
        return 1
    if not isinstance(start, Start):
        return 1
    settings = msgspec.json.decode(start.settings, type=Settings)
    configure_logging(settings)
    return_large_blocks_to_os()
    replica = inbox.replica = Replica(settings, start, control)
    batches = PrimaryBatches()
    await batches.open(socket.socket(fileno=batch_fd))
    # batches and sequences form in the primary, over every front's connections
    replica.dataplane.batch_elsewhere(batches.cross)
    try:
        return await _serve(replica, start, inbox.queue)
    finally:
        replica.close()


async def _serve(replica: Replica, start: Start, messages: asyncio.Queue[ToReplica | None]) -> int:
    loop = asyncio.get_running_loop()
    settings = replica.settings
    try:
        await replica.apply(start.snapshot)
        await replica.register_regions(start.regions)
        sock = tcp_listener(settings.host, start.port, reuse_port=True)
    except OSError as exc:
        replica.control.send(Refused(start.seq, f"cannot listen on port {start.port}: {exc}"))
        return 3
    h2: H2Server | None = None
    grpc: GrpcServer | None = None
    if start.grpc_port:
        h2, grpc = replica.grpc_server(start.grpc_forward_to)
    lane = infer_lane(settings, replica.dataplane, replica.router.answers)
    server = http_server(settings, replica.router, refuse_h2c if h2 is None else h2.adopt, lane)
    serving = loop.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    if serving.done():
        replica.control.send(Refused(start.seq, "the HTTP server did not start"))
        return 3
    if h2 is not None:
        try:
            await h2.serve(settings.host, start.grpc_port, reuse_port=True)
        except RuntimeError as exc:
            replica.control.send(Refused(start.seq, str(exc)))
            server.should_exit = True
            await serving
            return 3
    replica.control.send(Listening(start.seq, os.getpid()))
    loop.add_signal_handler(signal.SIGTERM, lambda: messages.put_nowait(Drain(0, OWN_TIMEOUT)))
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # the primary decides
    loop.add_signal_handler(signal.SIGHUP, lambda: None)  # (a terminal's, to the group)
    settle_garbage_collector()
    drain = await replica.follow(messages)
    code = 0 if drain is not None else 1
    if drain is None:
        log.error("the primary front is gone; stopping")
        server.force_exit = True
    elif drain.timeout != OWN_TIMEOUT:  # the primary's drain: its timeout
        server.config.timeout_graceful_shutdown = int(drain.timeout) or None
    server.should_exit = True
    if grpc is None:
        await serving
        return code
    if drain is None:
        grace = 0.0
    else:
        grace = settings.shutdown_timeout if drain.timeout == OWN_TIMEOUT else drain.timeout
    await asyncio.gather(serving, grpc.stop(grace))
    if replica.grpc_forwarder is not None:
        await replica.grpc_forwarder.close()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oipserve.scaleout.process")
    parser.add_argument("--control-fd", type=int, required=True, help="socket to the primary")
    parser.add_argument(
        "--batch-fd", type=int, required=True, help="socket to the primary's batchers"
    )
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(args.control_fd, args.batch_fd))


if __name__ == "__main__":
    sys.exit(main())
