"""Start-up and shutdown of the whole server, in a fixed order.

Start: bind the HTTP and metrics sockets and hold the gRPC port (fail fast, before
anything loads, if a port is taken), remove shared memory left by dead servers, read
the hardware inventory, start the workers, load the repository's models, start
serving, log ``ready`` or what is not (``oipserve.app.startup_report``).

Shutdown (SIGTERM or SIGINT): stop accepting connections (HTTP, gRPC and
metrics), let in-flight requests and calls finish (``--shutdown-timeout``), stop the workers
(they free their own shared memory), unlink the front's segments, sweep
anything left under our prefix, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from pathlib import Path

from hardware import make_inventory_source, parse_devices
from oipserve.app.grpc_start import start_grpc
from oipserve.app.startup_report import (
    StartupReport,
    not_ready_models,
    remove_ready_file,
    status_log,
)
from oipserve.config.settings import Settings, deprecation_warnings
from oipserve.dataplane.plane import DataPlane
from oipserve.front.grpc.rpcs import GrpcServer
from oipserve.front.http.server import UvicornServer, http_server
from oipserve.front.http.server import metrics_server as metrics_server_for
from oipserve.front.rest import create_app
from oipserve.front.rest.admin import add_admin_routes
from oipserve.management import LoadLimits, Management, startup_models
from oipserve.models.config.parse import ConfigLimits
from oipserve.models.manager import ModelManager
from oipserve.models.registry import ModelRegistry
from oipserve.models.repository import RepositoryError, check_repository, layout_warnings
from oipserve.pool.handle import WorkerHandle
from oipserve.pool.worker_pool import WorkerPool
from oipserve.request.client_regions import ClientRegions, cuda_refusal
from oipserve.runtime.collector import settle_garbage_collector
from oipserve.runtime.listeners import tcp_listener, unix_listener
from oipserve.runtime.memory_trim import MemoryTrimmer, return_large_blocks_to_os
from oipserve.runtime.workerproc import WorkerOptions
from oipserve.scaleout.primary import (
    Replicas,
    follow_the_primary,
    forward_address,
    grpc_forward_address,
)
from oipserve.telemetry.metrics import MetricsApp, Scraper
from oipserve.wire.shm import sweep, sweep_stale

log = logging.getLogger("oipserve")


class StartupError(Exception):
    """Start-up cannot go on; the message says why, for the user."""


def bind_socket(host: str, port: int, flag: str, reuse_port: bool = False) -> socket.socket:
    try:
        return tcp_listener(host, port, reuse_port)
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {host}:{port} ({flag} {port}): {exc.strerror}"
        ) from None


def _threads_per_worker(device: str, usable_cores: int, instances: int) -> int:
    """ONNX Runtime intra-op threads of each worker started with the server.

    On the CPU the cores this process may use (a pod's CPU limit, its affinity mask:
    ``CpuInfo.usable_cores``) are shared out among the instances. Sizing from the node's
    count in a pod limited to 4 CPUs on a 64-core node would give 64 threads throttled
    to 4 CPUs' time.
    """
    if device == "cpu":
        return max(1, usable_cores // instances)
    return 1


def _check_ports(settings: Settings) -> None:
    """Two services given the same fixed port: a mistake to name before binding."""
    ports: dict[str, int] = {}
    if settings.allow_http:
        ports["--http-port"] = settings.http_port
    if settings.allow_grpc:
        ports["--grpc-port"] = settings.grpc_port
    if not ports:
        raise ValueError("--allow-http and --allow-grpc are both false: nothing would serve")
    if settings.allow_metrics:
        ports["--metrics-port"] = settings.metrics_port
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port and port in seen:
            raise ValueError(f"{seen[port]} and {flag} are both {port}")
        seen[port] = flag


def _check_ready_file(path: str | None) -> None:
    if path is not None and not Path(path).parent.is_dir():
        raise StartupError(f"--ready-file {path}: its directory does not exist")


def _check_layout(root: Path, exit_on_error: bool) -> None:
    """Warn, loudly and whatever --log-level says, about a repository that serves nothing."""
    warnings = layout_warnings(root)
    for warning in warnings:
        status_log.warning("%s", warning)
    if warnings and exit_on_error:
        raise StartupError(f"{warnings[0]}; refusing to start (--exit-on-error true / --strict)")


async def serve(settings: Settings) -> int:
    return_large_blocks_to_os()
    for warning in deprecation_warnings(settings):
        log.warning("%s", warning)
    root = Path(settings.model_repository)
    try:
        _check_ports(settings)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    # Every port is taken (or found taken) before anything loads.
    held: list[socket.socket] = []
    try:
        # --allow-http false: no HTTP port at all (health over gRPC only).
        sock: socket.socket | None = None
        if settings.allow_http:
            sock = bind_socket(
                settings.host, settings.http_port, "--http-port", settings.http_workers > 1
            )
            held.append(sock)
        metrics_sock: socket.socket | None = None
        if settings.allow_metrics:
            metrics_sock = bind_socket(settings.host, settings.metrics_port, "--metrics-port")
            held.append(metrics_sock)
        # NOTE: grpc binds its own socket; this one holds the port while models load
        #   and is closed just before gRPC starts.
        grpc_probe: socket.socket | None = None
        if settings.allow_grpc and settings.grpc_port:
            grpc_probe = bind_socket(settings.host, settings.grpc_port, "--grpc-port")
            held.append(grpc_probe)
        check_repository(root)
        _check_ready_file(settings.ready_file)
        inventory_source = make_inventory_source(settings.hardware_inventory)
        inventory = inventory_source.read()
        devices = parse_devices(inventory, settings.devices)
        names = startup_models(settings.model_control_mode, settings.load_model, root)
        _check_layout(root, settings.exit_on_error)
    except (ValueError, RepositoryError, OSError, StartupError) as exc:  # flags or files
        for held_sock in held:
            held_sock.close()
        raise StartupError(str(exc)) from None
    for name in sweep_stale():
        log.info("removed stale shared memory %s", name)

    options = WorkerOptions(settings.log_level, settings.worker_busy_poll_us)
    pool = WorkerPool(
        os.getpid(), options, settings.http_workers, settings.worker_replacement_max_pause
    )
    registry = ModelRegistry()
    regions = ClientRegions(
        settings.allow_client_shm,
        pool.prefix,
        cuda_refusal(inventory),
        limit=settings.max_shm_regions,
    )
    dataplane = DataPlane(
        registry,
        pool,
        settings.max_queue_per_worker,
        settings.infer_timeout,
        regions,
        settings.server_name,
        settings.busy_poll_us / 1e6,
    )
    cpu_lock = asyncio.Lock()

    async def start_workers(device: str) -> list[WorkerHandle]:
        threads = _threads_per_worker(
            device, inventory.cpu.usable_cores, settings.instances_per_device
        )
        started = []
        for _ in range(settings.instances_per_device):
            worker = await pool.add_worker(device, threads)
            worker.add_death_listener(dataplane.worker_gone)
            started.append(worker)
        return started

    async def cpu_workers_on_demand() -> list[WorkerHandle]:
        """KIND_CPU instances run on the CPU whatever --devices says, as in Triton."""
        async with cpu_lock:
            running = [w for w in pool.workers if w.device == "cpu" and not w.dedicated]
            if running:
                return running
            log.info(
                "starting %d CPU worker(s) for KIND_CPU instance groups (--devices %s runs none)",
                settings.instances_per_device,
                settings.devices,
            )
            return await start_workers("cpu")

    manager = ModelManager(
        root,
        pool,
        registry,
        inventory.simulate_gpu_sessions,
        cpu_workers_on_demand,
        ConfigLimits(max_priority_levels=settings.max_priority_levels),
    )
    management = Management(
        root,
        inventory_source,
        pool,
        registry,
        manager,
        [dataplane.worker_gone],
        settings.shutdown_timeout,
        LoadLimits.from_settings(settings),
    )
    server: UvicornServer | None = None
    metrics_server: UvicornServer | None = None
    grpc_server: GrpcServer | None = None
    grpc_stopping: asyncio.Task[None] | None = None
    replicas: Replicas | None = None
    replicas_stopping: asyncio.Task[None] | None = None
    serving = False
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stop_grpc() -> asyncio.Task[None] | None:
        """Stop taking gRPC calls now; in-flight ones get ``--shutdown-timeout`` to finish."""
        nonlocal grpc_stopping
        if grpc_stopping is None and grpc_server is not None:
            grpc_stopping = loop.create_task(grpc_server.stop(settings.shutdown_timeout))
        return grpc_stopping

    def stop_replicas() -> asyncio.Task[None] | None:
        """The other HTTP fronts stop accepting and answer what they received."""
        nonlocal replicas_stopping
        if replicas_stopping is None and replicas is not None:
            replicas_stopping = loop.create_task(replicas.stop(settings.shutdown_timeout))
        return replicas_stopping

    def on_signal(signum: int) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        dataplane.shutting_down = True
        stop_grpc()
        stop_replicas()
        stop_requested.set()
        if serving:
            if server is not None:
                server.should_exit = True
            if metrics_server is not None:
                metrics_server.should_exit = True
        else:
            startup.cancel()

    forward: socket.socket | None = None
    startup = asyncio.current_task()
    if startup is None:
        raise RuntimeError("serve() runs outside an asyncio task: a signal could not cancel it")
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        try:
            for device in devices:
                await start_workers(device)
            pool.start_heartbeats(
                settings.worker_heartbeat_interval, settings.worker_heartbeat_timeout
            )
            registry.required.update(names)
            await asyncio.gather(*(manager.load(name) for name in names))
            failed = not_ready_models(registry)
            if settings.exit_on_error and failed:
                raise StartupError(
                    f"{len(failed)} of {len(names)} models failed to load ("
                    + "; ".join(f"{n}: {r}" for n, r in failed.items())
                    + "); refusing to start (--exit-on-error true / --strict)"
                )
            if grpc_probe is not None:
                grpc_probe.close()
            grpc_port: int | None = None
            replicas_grpc: tuple[int, str] | None = None
            if settings.allow_grpc:
                private = None
                if sock is not None and settings.http_workers > 1:
                    grpc_address = grpc_forward_address(pool.prefix)
                    private = unix_listener(grpc_address, 1024)
                    held.append(private)
                grpc_server, grpc_port = await start_grpc(settings, dataplane, management, private)
                if private is not None:
                    replicas_grpc = (grpc_port, grpc_address)
            if sock is not None and settings.http_workers > 1:
                address = forward_address(pool.prefix)
                forward = unix_listener(address, 1024)
                held.append(forward)
                replicas = Replicas(settings, registry, pool, address, replicas_grpc)
                follow_the_primary(replicas, manager, pool, regions, dataplane)
                await replicas.start(sock.getsockname()[1])
        except asyncio.CancelledError:
            log.info("start-up interrupted")
            return 0
        except RuntimeError as exc:
            raise StartupError(str(exc)) from None

        servers: list[UvicornServer] = []
        if sock is not None:
            app = create_app(settings, dataplane)
            add_admin_routes(app, management)
            server = http_server(settings, app)
            servers.append(server)
        if metrics_sock is not None:
            metrics_server = metrics_server_for(
                settings, MetricsApp(Scraper(dataplane.stats, inventory_source))
            )
            servers.append(metrics_server)
        serving = True
        host = sock.getsockname()[0] if sock is not None else settings.host

        async def announce() -> None:
            while not all(s.started for s in servers) and not stop_requested.is_set():
                await asyncio.sleep(0.01)
            if all(s.started for s in servers) and not stop_requested.is_set():
                report = StartupReport(
                    host,
                    sock.getsockname()[1] if sock is not None else None,
                    grpc_port,
                    metrics_sock.getsockname()[1] if metrics_sock is not None else None,
                    len(names),
                    sorted({w.device for w in pool.workers if not w.dedicated}) or devices,
                    not_ready_models(registry),
                )
                if settings.ready_file is not None:
                    try:
                        report.write(settings.ready_file)
                    except OSError as exc:
                        status_log.error(
                            "cannot write --ready-file %s: %s", settings.ready_file, exc
                        )
                report.log()

        announcer = loop.create_task(announce())
        metrics_task: asyncio.Task[None] | None = None
        if metrics_server is not None and metrics_sock is not None:
            metrics_task = loop.create_task(metrics_server.serve(sockets=[metrics_sock]))
        settle_garbage_collector()
        # Refused gRPC messages leave their inflated slices in malloc's arenas.
        trimmer = MemoryTrimmer()
        trimmer.start()
        try:
            if server is not None and sock is not None:
                await server.serve(sockets=[sock] if forward is None else [sock, forward])
            else:
                await stop_requested.wait()
        finally:
            await trimmer.stop()
            # The metrics port closes with the HTTP port (shutdown step 1).
            if metrics_server is not None and metrics_task is not None:
                metrics_server.should_exit = True
                await metrics_task
        announcer.cancel()
        return 0
    finally:
        dataplane.shutting_down = True
        # gRPC calls in flight finish (or time out) before the workers go away, and so do
        # the other HTTP fronts' requests.
        stopping = stop_grpc()
        if stopping is not None:
            await stopping
        stopping = stop_replicas()
        if stopping is not None:
            await stopping
        await pool.stop(settings.shutdown_timeout)
        manager.close()  # uploaded model files
        dataplane.inputs.close()
        dataplane.outputs.close()
        regions.close()
        sweep(pool.prefix)
        for held_sock in held:
            held_sock.close()
        remove_ready_file(settings.ready_file)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        log.info("stopped")
