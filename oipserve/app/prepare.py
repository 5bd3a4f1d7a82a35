"""Start-up step 1, before anything starts: every port taken, the flags and files checked,
the node read (``prepare``), so that a mistake fails the start before any worker starts or
model loads. ``Server`` (``oipserve.app.server``) runs on what it returns: the ``Sites`` and
the ``StartupPlan``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from hardware import Inventory, InventorySource, make_inventory_source, parse_devices
from oipserve.app.sites import GrpcSite, StartupError, UvicornSite
from oipserve.app.startup_report import remove_stale_ready_file, status_log
from oipserve.config.settings import Settings
from oipserve.management import startup_models
from oipserve.models.repository import Repository, RepositoryError
from oipserve.wire.shm import sweep_stale

__all__ = ["Sites", "StartupPlan", "prepare"]

log = logging.getLogger("oipserve")


@dataclass
class Sites:
    """The ports of this front; None where a flag turns the service off."""

    http: UvicornSite | None
    metrics: UvicornSite | None
    grpc: GrpcSite | None

    @classmethod
    def of(cls, settings: Settings) -> Sites:
        """The sites the flags ask for, not bound yet."""
        host = settings.host
        # --allow-http false: no HTTP port at all (health over gRPC only).
        http = metrics = None
        if settings.allow_http:
            reuse_port = settings.http_workers > 1  # shared with the other fronts
            http = UvicornSite(host, settings.http_port, "--http-port", reuse_port)
        if settings.allow_metrics:
            metrics = UvicornSite(host, settings.metrics_port, "--metrics-port")
        return cls(http, metrics, GrpcSite(settings) if settings.allow_grpc else None)

    def all(self) -> list[UvicornSite | GrpcSite]:
        return [site for site in (self.http, self.metrics, self.grpc) if site is not None]

    def close(self) -> None:
        for site in self.all():
            site.close()


@dataclass(frozen=True)
class StartupPlan:
    """What start-up read before starting anything: the node and the models to load."""

    inventory_source: InventorySource
    inventory: Inventory
    devices: tuple[str, ...]
    models: list[str]


def prepare(settings: Settings) -> tuple[Sites, StartupPlan]:
    """Take every port, then check the flags and files and read the node: all before any
    worker starts or model loads, so that a mistake fails the start at once (StartupError,
    with every port given back). Then remove shared memory left by dead servers."""
    remove_stale_ready_file(settings.ready_file)
    try:
        _check_ports(settings)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    sites = Sites.of(settings)
    try:
        for site in sites.all():
            site.bind()
        plan = _read_plan(settings)
    except (ValueError, RepositoryError, OSError, StartupError) as exc:  # flags or files
        sites.close()
        raise StartupError(str(exc)) from None
    for name in sweep_stale():
        log.info("removed stale shared memory %s", name)
    return sites, plan


def _read_plan(settings: Settings) -> StartupPlan:
    repository = Repository(Path(settings.model_repository), settings.model_name)
    repository.check()
    _check_ready_file(settings.ready_file)
    inventory_source = make_inventory_source(settings.hardware_inventory)
    inventory = inventory_source.read()
    devices = parse_devices(inventory, settings.devices)
    models = startup_models(settings.model_control_mode, settings.load_model, repository)
    _check_layout(repository, settings.exit_on_error)
    return StartupPlan(inventory_source, inventory, devices, models)


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


def _check_layout(repository: Repository, exit_on_error: bool) -> None:
    """Warn, loudly and whatever --log-level says, about a repository that serves nothing
    (and say how --model-name applies to it)."""
    for note in repository.layout_notes():
        status_log.warning("%s", note)
    warnings = repository.layout_warnings()
    for warning in warnings:
        status_log.warning("%s", warning)
    if warnings and exit_on_error:
        raise StartupError(f"{warnings[0]}; refusing to start (--exit-on-error true / --strict)")
