"""Start-up and shutdown of the whole server, in a fixed order.

Start: bind the HTTP socket (fail fast if the port is taken), remove shared
memory left by dead servers, read the hardware inventory, start the workers,
load the repository's models, start serving, log ``ready``.

Shutdown (SIGTERM or SIGINT): stop accepting connections (HTTP and gRPC), let
in-flight requests and calls finish (``--shutdown-timeout``), stop the workers
(they free their own shared memory), unlink the front's segments, sweep
anything left under our prefix, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from hardware import make_inventory_source, parse_devices
from oipserve.dataplane import DataPlane
from oipserve.grpc_front import GrpcServer, start_grpc
from oipserve.http_protocol import CorkedHttpToolsProtocol
from oipserve.management import Management, startup_models
from oipserve.models import ModelManager, ModelRegistry
from oipserve.pool import WorkerPool
from oipserve.repository import RepositoryError, check_repository
from oipserve.rest import create_app
from oipserve.rest_admin import add_admin_routes
from oipserve.settings import Settings
from oipserve.wire.shm import sweep, sweep_stale

log = logging.getLogger("oipserve")


class StartupError(Exception):
    """Start-up cannot go on; the message says why, for the user."""


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock


class _UvicornServer(uvicorn.Server):
    """uvicorn's server, with signals left to us so that shutdown order stays ours."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _threads_per_worker(device: str, logical_cores: int, instances: int) -> int:
    if device == "cpu":
        return max(1, logical_cores // instances)
    return 1


def _settle_garbage_collector() -> None:
    """Keep the cyclic GC off the hot path.

    PERF: under load the collector took 13% of the front's time, mostly full
    collections walking the objects that imports and model loading left behind
    (numpy, ONNX metadata, protobuf descriptors). Freezing them moves them out
    of every later collection, and a larger first threshold makes collections
    rarer; request objects are short-lived and mostly freed by reference
    counting anyway.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


async def serve(settings: Settings) -> int:
    root = Path(settings.model_repository)
    sock = bind_socket(settings.host, settings.http_port)
    try:
        if settings.grpc_port and settings.grpc_port == settings.http_port:
            raise ValueError(f"--http-port and --grpc-port are both {settings.http_port}")
        check_repository(root)
        inventory_source = make_inventory_source(settings.hardware_inventory)
        inventory = inventory_source.read()
        devices = parse_devices(inventory, settings.devices)
        names = startup_models(settings.model_control_mode, settings.load_model, root)
    except (ValueError, RepositoryError, OSError) as exc:  # a mistake in flags or files
        sock.close()
        raise StartupError(str(exc)) from None
    for name in sweep_stale():
        log.info("removed stale shared memory %s", name)

    pool = WorkerPool(os.getpid(), settings.log_level)
    registry = ModelRegistry()
    manager = ModelManager(root, pool, registry, settings.hardware_inventory is not None)
    dataplane = DataPlane(registry, pool, settings.max_queue_per_worker)
    management = Management(
        root,
        inventory_source,
        pool,
        registry,
        manager,
        [dataplane.worker_gone],
        settings.shutdown_timeout,
    )
    server: _UvicornServer | None = None
    grpc_server: GrpcServer | None = None
    grpc_stopping: asyncio.Task[None] | None = None
    loop = asyncio.get_running_loop()

    def stop_grpc() -> asyncio.Task[None] | None:
        """Stop taking gRPC calls now; in-flight ones get ``--shutdown-timeout`` to finish."""
        nonlocal grpc_stopping
        if grpc_stopping is None and grpc_server is not None:
            grpc_stopping = loop.create_task(grpc_server.stop(settings.shutdown_timeout))
        return grpc_stopping

    def on_signal(signum: int) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        dataplane.shutting_down = True
        stop_grpc()
        if server is not None:
            server.should_exit = True
        else:
            startup.cancel()

    startup = asyncio.current_task()
    assert startup is not None
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        try:
            for device in devices:
                threads = _threads_per_worker(
                    device, inventory.cpu.logical_cores, settings.instances_per_device
                )
                for _ in range(settings.instances_per_device):
                    worker = await pool.add_worker(device, threads)
                    worker.add_death_listener(dataplane.worker_gone)
            registry.required.update(names)
            await asyncio.gather(*(manager.load(name) for name in names))
            grpc_server, grpc_port = await start_grpc(settings, dataplane, management)
        except asyncio.CancelledError:
            log.info("start-up interrupted")
            return 0
        except RuntimeError as exc:
            raise StartupError(str(exc)) from None

        app = create_app(settings, dataplane)
        add_admin_routes(app, management)
        config = uvicorn.Config(
            app,
            http=CorkedHttpToolsProtocol,
            loop="none",
            lifespan="off",
            access_log=False,
            # PERF: no X-Forwarded-* rewriting per request; nothing here uses the client address.
            proxy_headers=False,
            log_config=None,
            log_level=settings.log_level,
            timeout_graceful_shutdown=int(settings.shutdown_timeout) or None,
            h11_max_incomplete_event_size=None,
        )
        server = _UvicornServer(config)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host

        async def announce() -> None:
            while not server.started and not server.should_exit:
                await asyncio.sleep(0.01)
            if server.started:
                log.info(
                    "ready http://%s:%d (%d models, devices: %s) grpc=%s:%d",
                    shown,
                    port,
                    len(names),
                    ", ".join(devices),
                    shown,
                    grpc_port,
                )

        announcer = loop.create_task(announce())
        _settle_garbage_collector()
        await server.serve(sockets=[sock])
        announcer.cancel()
        return 0
    finally:
        dataplane.shutting_down = True
        # gRPC calls in flight finish (or time out) before the workers go away.
        stopping = stop_grpc()
        if stopping is not None:
            await stopping
        await pool.stop(settings.shutdown_timeout)
        dataplane.inputs.close()
        dataplane.outputs.close()
        sweep(pool.prefix)
        sock.close()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        log.info("stopped")
