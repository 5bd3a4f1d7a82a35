"""Start-up and shutdown of the whole server, in a fixed order: ``Server`` (the runner).

The runner owns what lives as long as the process (the worker pool, the model registry and
manager, the data plane); each listening port is a site of its own (``oipserve.app.sites``):
HTTP, metrics, gRPC, and with ``--http-workers`` the other HTTP fronts. What is taken and
checked before anything starts (the ports, the flags and files, the node) is
``oipserve.app.prepare``'s. ``Server``'s docstring gives the start-up and shutdown order
step by step; ``serve`` is what the command line runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import falcon.asgi

from hardware.cpus import instances_for
from oipserve.app.prepare import Sites, StartupPlan, prepare
from oipserve.app.sites import OtherFronts, StartupError, UvicornSite
from oipserve.app.startup_report import (
    StartupReport,
    not_ready_models,
    remove_ready_file,
    status_log,
)
from oipserve.config.backend_config import default_max_batch_size
from oipserve.config.settings import Settings, auto_complete_enabled, deprecation_warnings
from oipserve.dataplane.plane import DataPlane
from oipserve.front.http.h2c import refuse_h2c
from oipserve.front.http.server import http_server
from oipserve.front.http.server import metrics_server as metrics_server_for
from oipserve.front.rest import create_app
from oipserve.front.rest.admin import add_admin_routes
from oipserve.front.rest.lane import infer_lane
from oipserve.management import LoadLimits, Management
from oipserve.models.autofill import DEFAULT_MAX_BATCH_SIZE, AutoComplete
from oipserve.models.config.parse import ConfigLimits
from oipserve.models.manager import ModelManager
from oipserve.models.registry import ModelRegistry
from oipserve.models.repository import Repository
from oipserve.pool.handle import WorkerHandle
from oipserve.pool.worker_pool import WorkerPool
from oipserve.request.client_regions import ClientRegions, cuda_refusal
from oipserve.runtime.collector import settle_garbage_collector
from oipserve.runtime.listeners import unix_listener
from oipserve.runtime.memory_trim import MemoryTrimmer, return_large_blocks_to_os
from oipserve.runtime.workerproc import WorkerOptions
from oipserve.scaleout.primary import (
    Replicas,
    follow_the_primary,
    forward_address,
    grpc_forward_address,
)
from oipserve.telemetry.metrics import MetricsApp, Scraper
from oipserve.wire.shm import sweep

__all__ = ["Server", "StartupError", "serve"]

log = logging.getLogger("oipserve")

#: Backlog of the primary's private socket that the other fronts forward requests to.
FORWARD_BACKLOG = 1024


async def serve(settings: Settings) -> int:
    """The server's life: start, serve until SIGTERM, SIGINT or SIGHUP, drain, stop. Returns the
    exit code (0); a start that cannot go on raises StartupError (exit code 3)."""
    return_large_blocks_to_os()
    for warning in deprecation_warnings(settings):
        log.warning("%s", warning)
    sites, plan = prepare(settings)
    return await Server(settings, sites, plan).run()


def _threads_per_worker(device: str, usable_cores: int, instances: int, most: int) -> int:
    """ONNX Runtime intra-op threads of each worker started with the server.

    On the CPU the cores this process may use (a pod's CPU limit, its affinity mask:
    ``CpuInfo.usable_cores``) are shared out among the instances, at most ``most`` each
    (``--max-threads-per-session``: an inventory claiming 100,000 cores gave a worker
    100,000 threads, and the start never ended; found by fuzzing). Sizing from the node's
    count in a pod limited to 4 CPUs on a 64-core node would give 64 threads throttled
    to 4 CPUs' time.
    """
    if device == "cpu":
        return min(most, max(1, usable_cores // instances))
    return 1


#: The signals that stop the server cleanly (drain, free shared memory, exit 0). SIGHUP too:
#: its default killed the front at once, leaving its segments and requests behind (a
#: closed terminal sends it; found by fuzzing). Triton handles only the first two.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _after_stop(signum: int) -> None:
    log.info("received %s after the stop: exiting", signal.Signals(signum).name)


# ---- the runner --------------------------------------------------------------------------


class Server:
    """One oipserve front: the runner of its sites, from start-up to exit.

    Start-up (``prepare.prepare``, then ``run``), each step done before the next begins:

    1. ``prepare``: bind the HTTP and metrics ports and hold the gRPC port (a port taken
       fails here, before anything loads); check the repository, ``--ready-file``'s
       directory, the hardware inventory and ``--devices``; remove shared memory left by
       dead servers. Any failure: every port given back, StartupError (exit 3).
    2. ``start``: the workers of each device, their heartbeats, the models to load at start
       (``--exit-on-error``: one that fails stops the start, exit 3); then gRPC on its port
       (the held socket closed just before), then ``--http-workers``' other fronts.
    3. ``serve``: the HTTP and metrics ports start serving (those the flags leave on);
       once they do, the ready line (or the not-ready lines) is logged and
       ``--ready-file`` written (``oipserve.app.startup_report``); then wait for a signal.

    Shutdown (SIGTERM, SIGINT or SIGHUP: ``_on_signal``, then ``drain`` and ``stop``):

    1. At the signal: readiness turns false; the gRPC port refuses new calls and the
       other fronts stop accepting (both drains run in the background from now on); the
       HTTP and metrics ports stop accepting (uvicorn: the listen backlog is answered
       first, then the listener and idle keep-alive connections close).
    2. ``serve`` returns once the HTTP requests in flight are answered
       (``--shutdown-timeout``), then the metrics port's; ``drain`` waits for the gRPC
       calls in flight and for the other fronts to exit. All before any worker stops.
    3. ``stop``: each worker finishes what it received, unlinks its own segments and exits
       (killed if late); uploaded model files are removed; the front unlinks its own
       segments and sweeps ``/dev/shm`` for its prefix; the ports are closed and
       ``--ready-file`` removed.
    4. Exit code 0.

    A signal during start-up cancels it ("start-up interrupted"); the same ``drain`` and
    ``stop`` run and the exit code is 0. A start that fails runs them too, then exits 3.
    """

    def __init__(self, settings: Settings, sites: Sites, plan: StartupPlan) -> None:
        self.settings = settings
        self.sites = sites
        self.plan = plan
        self.other_fronts: OtherFronts | None = None
        self.pool = WorkerPool(
            os.getpid(),
            WorkerOptions(
                settings.log_level, settings.worker_busy_poll_us, settings.low_load_colocation
            ),
            settings.http_workers,
            settings.worker_replacement_max_pause,
        )
        self.registry = ModelRegistry()
        self.regions = ClientRegions(
            settings.allow_client_shm,
            self.pool.prefix,
            cuda_refusal(plan.inventory),
            limit=settings.max_shm_regions,
        )
        self.dataplane = DataPlane.of(settings, self.registry, self.pool, self.regions)
        self.manager, self.management = self._model_control()
        #: The REST app (with --allow-http): the HTTP port's, and the gRPC listener's for
        #: the HTTP/2 streams that are not gRPC (REST over h2c, issue #39).
        self.rest_app: falcon.asgi.App | None = None
        if settings.allow_http:
            self.rest_app = create_app(settings, self.dataplane)
            add_admin_routes(self.rest_app, self.management)
        self._cpu_lock = asyncio.Lock()
        self._serving = False
        self._stop_requested = asyncio.Event()
        self._startup: asyncio.Task[object] | None = None

    def _model_control(self) -> tuple[ModelManager, Management]:
        """The model manager (loads on workers) and the management APIs over it."""
        root = Path(self.settings.model_repository)
        manager = ModelManager(
            Repository(root, self.settings.model_name),
            self.pool,
            self.registry,
            self.plan.inventory.simulate_gpu_sessions,
            self._cpu_workers_on_demand,
            ConfigLimits(max_priority_levels=self.settings.max_priority_levels),
            AutoComplete(
                auto_complete_enabled(self.settings),
                default_max_batch_size(self.settings.backend_config, DEFAULT_MAX_BATCH_SIZE),
            ),
        )
        management = Management(
            root,
            self.plan.inventory_source,
            self.pool,
            self.registry,
            manager,
            [self.dataplane.worker_gone],
            self.settings.shutdown_timeout,
            LoadLimits.from_settings(self.settings),
        )
        return manager, management

    async def run(self) -> int:
        """Start-up steps 2-3, then the shutdown; the exit code."""
        self._catch_signals()
        try:
            try:
                await self.start()
            except asyncio.CancelledError:
                log.info("start-up interrupted")
                return 0
            except RuntimeError as exc:
                raise StartupError(str(exc)) from None
            await self.serve()
            return 0
        finally:
            await self.drain()
            await self.stop()

    # ---- start-up --------------------------------------------------------------------

    async def start(self) -> None:
        """Start-up step 2: workers, models, then gRPC and the other HTTP fronts."""
        for device in self.plan.devices:
            await self._start_workers(device, self._instances(device))
        self.pool.start_heartbeats(
            self.settings.worker_heartbeat_interval, self.settings.worker_heartbeat_timeout
        )
        await self._load_models()
        # --http-workers N (with an HTTP port): other fronts serve beside this one.
        http = self.sites.http
        scaled_out = http is not None and self.settings.http_workers > 1
        if self.sites.grpc is not None:
            private = grpc_forward_address(self.pool.prefix) if scaled_out else None
            await self.sites.grpc.start(self.dataplane, self.management, private, self.rest_app)
        if http is not None and scaled_out:
            await self._start_other_fronts(http)

    def _instances(self, device: str) -> int:
        """Worker processes for ``device``: ``--instances-per-device``, or what ``auto`` (the
        default, issue #40) gives for it, logged."""
        count = self.settings.instances_per_device
        if count is None:
            usable = self.plan.inventory.cpu.usable_cores
            count = instances_for(device, usable)
            log.info(
                "--instances-per-device auto: %d on %s (%d usable CPUs)", count, device, usable
            )
        return count

    async def _start_workers(self, device: str, count: int) -> list[WorkerHandle]:
        usable = self.plan.inventory.cpu.usable_cores
        most = self.settings.max_threads_per_session
        threads = _threads_per_worker(device, usable, count, most)
        started = []
        for _ in range(count):
            worker = await self.pool.add_worker(device, threads)
            worker.add_death_listener(self.dataplane.worker_gone)
            started.append(worker)
        return started

    async def _cpu_workers_on_demand(self) -> list[WorkerHandle]:
        """KIND_CPU instances run on the CPU whatever --devices says, as in Triton."""
        async with self._cpu_lock:
            running = [w for w in self.pool.workers if w.device == "cpu" and not w.dedicated]
            if running:
                return running
            count = self._instances("cpu")
            log.info(
                "starting %d CPU worker(s) for KIND_CPU instance groups (--devices %s runs none)",
                count,
                self.settings.devices,
            )
            return await self._start_workers("cpu", count)

    async def _load_models(self) -> None:
        """Load the models of the start; with --exit-on-error one that fails stops it."""
        names = self.plan.models
        self.registry.required.update(names)
        await asyncio.gather(*(self.manager.load(name) for name in names))
        failed = not_ready_models(self.registry)
        if self.settings.exit_on_error and failed:
            raise StartupError(
                f"{len(failed)} of {len(names)} models failed to load ("
                + "; ".join(f"{n}: {r}" for n, r in failed.items())
                + "); refusing to start (--exit-on-error true / --strict)"
            )

    async def _start_other_fronts(self, http: UvicornSite) -> None:
        """``--http-workers N``: start the N-1 other fronts on the HTTP port (and the gRPC
        port); what they do not answer themselves they forward to this one."""
        address = forward_address(self.pool.prefix)
        http.also_listen(unix_listener(address, FORWARD_BACKLOG))
        grpc = self.sites.grpc
        shared_grpc = None
        if grpc is not None and grpc.port is not None:
            shared_grpc = (grpc.port, grpc_forward_address(self.pool.prefix))
        replicas = Replicas(
            self.settings, self.registry, self.pool, self.dataplane, address, shared_grpc
        )
        follow_the_primary(replicas, self.manager, self.pool, self.regions, self.dataplane)
        self.other_fronts = OtherFronts(replicas, self.settings.shutdown_timeout)
        await self.other_fronts.start(http.port)

    # ---- serving -----------------------------------------------------------------------

    async def serve(self) -> None:
        """Start-up step 3: serve HTTP and metrics until a signal (shutdown steps 1-2)."""
        self._start_http_sites()
        self._serving = True
        announcer = asyncio.get_running_loop().create_task(self._announce())
        settle_garbage_collector()
        # Refused gRPC messages leave their inflated slices in malloc's arenas.
        trimmer = MemoryTrimmer()
        trimmer.start()
        try:
            if self.sites.http is not None:
                await self.sites.http.stopped()
            else:
                await self._stop_requested.wait()
        finally:
            await trimmer.stop()
            # The metrics port closes with the HTTP port (shutdown step 1).
            if self.sites.metrics is not None:
                self.sites.metrics.drain()
                await self.sites.metrics.stopped()
            announcer.cancel()

    def _start_http_sites(self) -> None:
        if self.sites.http is not None and self.rest_app is not None:
            # gRPC on the HTTP port too (h2c): the gRPC port's listener takes those.
            grpc = self.sites.grpc
            h2c = grpc.h2c if grpc is not None else refuse_h2c
            lane = infer_lane(self.settings, self.dataplane)
            self.sites.http.start(http_server(self.settings, self.rest_app, h2c, lane))
        if self.sites.metrics is not None:
            scraper = Scraper(self.dataplane.stats, self.plan.inventory_source)
            self.sites.metrics.start(metrics_server_for(self.settings, MetricsApp(scraper)))

    async def _announce(self) -> None:
        """Once the HTTP and metrics ports serve: the ready line and ``--ready-file``."""
        sites = [s for s in (self.sites.http, self.sites.metrics) if s is not None]
        while not all(s.started for s in sites) and not self._stop_requested.is_set():
            await asyncio.sleep(0.01)
        if not all(s.started for s in sites) or self._stop_requested.is_set():
            return
        report = self._report()
        if self.settings.ready_file is not None:
            try:
                report.write(self.settings.ready_file)
            except OSError as exc:
                status_log.error("cannot write --ready-file %s: %s", self.settings.ready_file, exc)
        report.log()

    def _report(self) -> StartupReport:
        http, metrics, grpc = self.sites.http, self.sites.metrics, self.sites.grpc
        devices = sorted({w.device for w in self.pool.workers if not w.dedicated})
        return StartupReport(
            http.host if http is not None else self.settings.host,
            http.port if http is not None else None,
            grpc.port if grpc is not None else None,
            metrics.port if metrics is not None else None,
            len(self.plan.models),
            devices or list(self.plan.devices),
            not_ready_models(self.registry),
        )

    # ---- shutdown ----------------------------------------------------------------------

    def _catch_signals(self) -> None:
        self._startup = asyncio.current_task()
        if self._startup is None:
            raise RuntimeError("Server.run() outside an asyncio task: a signal could not stop it")
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        """Shutdown step 1 (or, during start-up, cancel it)."""
        log.info("received %s, shutting down", signal.Signals(signum).name)
        self.dataplane.shutting_down = True
        if self.sites.grpc is not None:
            self.sites.grpc.drain()
        if self.other_fronts is not None:
            self.other_fronts.drain()
        self._stop_requested.set()
        if not self._serving:
            # Once: a second signal cancelled the shutdown of a start-up interrupted so
            # (its traceback, exit 1, /dev/shm not swept; found by fuzzing).
            startup, self._startup = self._startup, None
            if startup is not None:
                startup.cancel()
            return
        for site in (self.sites.http, self.sites.metrics):
            if site is not None:
                site.drain()

    async def drain(self) -> None:
        """Shutdown step 2, past the HTTP port: gRPC calls in flight finish (or time out),
        and so do the other fronts' requests, before the workers go away."""
        self.dataplane.shutting_down = True
        if self.sites.grpc is not None:
            await self.sites.grpc.stopped()
        if self.other_fronts is not None:
            await self.other_fronts.stopped()

    async def stop(self) -> None:
        """Shutdown step 3: the workers, then every file and segment this server made."""
        await self.pool.stop(self.settings.shutdown_timeout)
        self.manager.close()  # uploaded model files
        self.dataplane.inputs.close()
        self.dataplane.outputs.close()
        self.regions.close()
        sweep(self.pool.prefix)
        self.sites.close()
        remove_ready_file(self.settings.ready_file)
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            # Not the default action: a signal between here and the exit killed a server
            # that had stopped cleanly (exit -15; fuzzing). ``cli.main`` ignores them once
            # the loop is closed.
            loop.add_signal_handler(signum, _after_stop, signum)
        log.info("stopped")
