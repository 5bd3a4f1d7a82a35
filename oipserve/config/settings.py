"""One frozen settings object, built once from defaults < environment < flags.

Every flag of ``oipserve serve`` can also come from ``OIPSERVE_<FLAG>`` (dashes
become underscores, upper case); a variable set empty is not set (``_from_environment``).
The object is passed down explicitly; nothing reads the environment after start-up.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec

from hardware.cpus import fronts_for, usable_cpus
from oipserve.config.access import Restriction, RestrictionError, parse_restrictions
from oipserve.config.backend_config import BackendConfigError, default_max_batch_size
from oipserve.config.cache_config import CacheConfigError, cache_bytes
from oipserve.config.flags import command_line
from oipserve.config.metrics_config import MetricsConfigError, parse_metrics_config

LogLevel = Literal["critical", "error", "warning", "info", "debug"]

ENV_PREFIX = "OIPSERVE_"


#: Logged once at start when ``--grpc-processes`` (``OIPSERVE_GRPC_PROCESSES``) is given a
#: number other than 0: the gRPC processes were removed (docs/grpc.md, "History"), the flag
#: is still accepted for one release so that command lines and manifests keep starting.
GRPC_PROCESSES_DEPRECATED = (
    "--grpc-processes is deprecated and does nothing: gRPC is served by every HTTP front; "
    "use --http-workers N to scale out"
)


#: Triton's warnings for ``--strict-model-config`` (server's command_line_parser.cc): it is
#: deprecated, and ``--disable-auto-complete-config`` wins over ``false``.
STRICT_MODEL_CONFIG_DEPRECATED = (
    "Warning: '--strict-model-config' has been deprecated! Please use "
    "'--disable-auto-complete-config' instead."
)
STRICT_MODEL_CONFIG_OVERRIDDEN = (
    "Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
    "'--disable-auto-complete-config'!"
)


#: Most seconds a duration setting takes (~31 years: "never", in effect). "inf" and "nan"
#: parse as floats but are no duration: the loop's timers fail on them, and a front that
#: armed one at start died.
MAX_SECONDS = 1e9


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model_repository: str
    #: A repository that is one model (a bare model.onnx, a model's own directory, or a
    #: single model directory) is served under this name; KServe's runtime passes the
    #: InferenceService's name (``oipserve.models.repository.Repository``, docs/deploy.md).
    #: A name a model directory could have (``_check_model_name``).
    model_name: Annotated[str, msgspec.Meta(min_length=1, max_length=255)] | None = None
    #: Not empty: "" bound every interface (an unset template variable, say; found by
    #: fuzzing), where the default is the loopback one. ``0.0.0.0`` says so.
    host: Annotated[str, msgspec.Meta(min_length=1)] = "127.0.0.1"
    http_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    grpc_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8001
    #: Prometheus ``GET /metrics`` (Triton's port); 0 picks a free port.
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8002
    #: Triton's flag: false serves no metrics port at all.
    allow_metrics: bool = True
    #: Triton's flag, repeatable ``key=value`` items: latency histograms and summaries
    #: (``oipserve.config.metrics_config``, docs/metrics.md); checked at start.
    metrics_config: tuple[str, ...] = ()
    #: Triton's flag, repeatable: ``local,size=BYTES`` gives the response cache its size
    #: (``oipserve.config.cache_config``, docs/cache.md); none: no cache.
    cache_config: tuple[str, ...] = ()
    #: Largest gRPC message either way; 512 MiB fits a 256 MiB tensor with room to spare
    #: (gRPC's own 4 MiB default is the classic complaint). gRPC caps it below 2 GiB.
    grpc_max_message_bytes: Annotated[int, msgspec.Meta(ge=1024, le=2**31 - 1)] = 512 * 1024 * 1024
    #: Triton's flags, in milliseconds as Triton takes them: a gRPC connection the client
    #: has sent nothing on for ``grpc_keepalive_time`` gets a PING, and is closed when nothing
    #: comes back within ``grpc_keepalive_timeout`` (``front.grpc.keepalive``).
    grpc_keepalive_time: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 7_200_000
    grpc_keepalive_timeout: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 20_000
    #: Milliseconds a gRPC connection may go without a call before it is sent GOAWAY
    #: (NO_ERROR; clients reconnect when they next call) and closed; 0 never (grpc's default).
    grpc_max_connection_idle: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] = 300_000
    #: gRPC connections one front holds at once; past it a new one is closed at once (its
    #: client's call fails UNAVAILABLE). 0: half the process's descriptor limit, at most 10,000.
    grpc_max_connections: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    #: Deprecated, does nothing (``GRPC_PROCESSES_DEPRECATED``); "auto" is read as 0. Still
    #: accepted, with its old bounds, for one release: remove it in the next one.
    grpc_processes: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0
    #: Processes that serve the HTTP port together (``SO_REUSEPORT``): this one and N-1
    #: more, each with its own event loop and its own connection to every worker; they
    #: answer inference of repository models themselves and hand this process
    #: everything else (docs/scaling.md). ``auto``, the command line's default (flag or env
    #: may name a number), is resolved at load from the usable CPUs
    #: (``hardware.cpus.fronts_for``); 1 here is for settings built in code.
    http_workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    devices: str = "auto"
    #: Worker processes per device. None is ``auto``, the command line's default (flag or
    #: env may name a number), resolved per device when the workers start
    #: (``hardware.cpus.instances_for``: 1 per GPU, 1 on the CPU below 12 usable CPUs and 2
    #: from 12; docs/scaling.md, "Worker instances by default"); 1 here is for settings
    #: built in code.
    instances_per_device: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = 1
    #: Triton's default is 64 MB; ours is 256 MiB so a 64 MiB FP32 tensor fits in JSON too.
    max_request_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 256 * 1024 * 1024
    log_level: LogLevel = "info"
    #: Path of a JSON file describing a fake hardware inventory (tests, dry runs).
    hardware_inventory: str | None = None
    #: Requests one worker may have queued before new ones get 503.
    max_queue_per_worker: Annotated[int, msgspec.Meta(ge=1)] = 256
    #: Seconds a graceful shutdown waits for in-flight requests.
    shutdown_timeout: Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)] = 30.0
    #: Deadline of every inference, in seconds, unless a request's ``timeout`` parameter (or
    #: its gRPC deadline) is shorter; past it the client gets 503 / DEADLINE_EXCEEDED.
    infer_timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] = 120.0
    #: Microseconds a front's loop polls for a worker's reply instead of sleeping, while it
    #: has at most two requests in flight and they typically take no longer; 150 us (at
    #: most this) for the client's next request (``oipserve.runtime.busy_poll``). 0 never polls.
    busy_poll_us: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 400
    #: Microseconds a worker polls for its next request after a reply instead of sleeping,
    #: while at least a quarter of its recent requests came that soon and the last one's
    #: front had others in flight (``workers.busy_poll``). 0 never polls.
    worker_busy_poll_us: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 250
    #: At low load (one short request at a time from one front) a CPU worker and that
    #: front's loop run on one CPU (``workers.colocation``): less CPU a request, some
    #: latency given back. Off by default.
    low_load_colocation: bool = False
    #: Seconds between heartbeats to each worker; one that has not answered for
    #: ``worker_heartbeat_timeout`` seconds is declared hung, killed and replaced.
    worker_heartbeat_interval: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] = 1.0
    worker_heartbeat_timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] = 5.0
    #: Ceiling of the pause between failed starts of one worker slot's replacement: 0.5 s
    #: before the second attempt, doubling up to this (``oipserve.pool.worker_pool``).
    worker_replacement_max_pause: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    #: Seconds an HTTP request head may take to arrive (from connection or its first
    #: byte) before the connection is closed: slow-header clients cannot hold sockets.
    header_timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] = 10.0
    #: Bytes an HTTP request head (request line and header fields) may take, and header
    #: fields it may have; past either: 431 and the connection closed (every HTTP port,
    #: the metrics port too).
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024, le=16 * 1024 * 1024)] = 64 * 1024
    max_header_fields: Annotated[int, msgspec.Meta(ge=8, le=100_000)] = 256
    #: Seconds a request body may take beyond what ``min_transfer_rate`` buys it; past
    #: it the connection is closed and the memory reserved for the body returned. A gRPC
    #: request message is bounded alike (its call ends: ``front.grpc.call``).
    body_timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] = 30.0
    #: Seconds a response may wait for a client that reads none of it, beyond what
    #: ``min_transfer_rate`` buys it; past it the connection is dropped and the memory
    #: the response held (a worker's output segment) returned. A gRPC reply is bounded
    #: alike (its stream is reset: ``front.grpc.call``).
    send_timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] = 30.0
    #: Bytes per second of a body or response that extend its timeout by one second
    #: (Apache's mod_reqtimeout MinRate): a slow link still finishes, a trickle does not.
    min_transfer_rate: Annotated[int, msgspec.Meta(ge=1)] = 64 * 1024
    #: Triton's flag: "none" loads every repository model at start and refuses repository
    #: load/unload requests (503, Triton's words: a lock); "explicit" loads only --load-model
    #: ones and allows them. Triton's "poll" is refused at start (``_check_model_control``).
    model_control_mode: Literal["none", "explicit"] = "none"
    #: Models loaded at start in explicit mode ("*" = all); repeatable or comma-separated.
    load_model: tuple[str, ...] = ()
    #: Triton's flags: API groups behind a header (HTTP) or a metadata key (gRPC);
    #: repeatable, each API in one restriction at most (oipserve/config/access.py).
    http_restricted_api: tuple[Restriction, ...] = ()
    grpc_restricted_protocol: tuple[Restriction, ...] = ()
    #: Most instances one worker endpoint may have (each a worker session, on the CPU
    #: also never more than the logical cores); see docs/limits.md.
    max_instances_per_endpoint: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 16
    #: Most ONNX Runtime threads one endpoint session may ask for (and never more than
    #: the node's logical cores).
    max_threads_per_session: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    #: Largest ``batch_size`` a worker endpoint may be loaded with.
    max_endpoint_batch_size: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 65536
    #: Seconds one worker-endpoint load (worker start and session creation) may take
    #: before it is undone and answered 503.
    load_timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] = 180.0
    #: Most ``file:`` parameters one repository load may carry (a model directory with its
    #: external-data files); one more is a 400 before any of them is looked at.
    max_upload_files: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1000
    #: Most ``dynamic_batching.priority_levels`` a model configuration may ask for; past
    #: it the model is not loaded (400 on a load, not ready at start). Triton has no bound.
    max_priority_levels: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1000
    #: Triton's flag: a model's config.pbtxt is taken as given, never completed from its
    #: ONNX graph (``oipserve.models.autofill``); a model without one is not loaded, as in
    #: Triton.
    disable_auto_complete_config: bool = False
    #: Triton's deprecated spelling of the same: true disables auto-complete (and says so
    #: at start, as Triton does); None: not given.
    strict_model_config: bool | None = None
    #: Triton's flag, repeatable: ``onnxruntime,default-max-batch-size=N`` (or without the
    #: backend), the max_batch_size auto-complete gives a graph that can batch
    #: (``oipserve.config.backend_config``); checked at start.
    backend_config: tuple[str, ...] = ()
    #: Triton's flag: clients may register their own POSIX shared memory and name it in
    #: requests (system shared-memory extension). Off: registration answers 403.
    allow_client_shm: bool = False
    #: Clients' shared-memory regions registered at once on this server (Triton has no
    #: bound); one more is a 400. Each costs a table entry in every HTTP front and a line
    #: in every status reply, no descriptor (docs/shared-memory.md).
    max_shm_regions: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1024
    #: Where to write the ports and readiness as JSON once started (removed at shutdown).
    ready_file: str | None = None
    #: Triton's flag (and ``--strict``): refuse to start when a model loaded at start fails
    #: or the repository holds no model. Triton's default is true; ours keeps serving.
    exit_on_error: bool = False
    #: Triton's flags (kserve-tritonserver passes both): false serves no HTTP port (health
    #: then only over gRPC) or no gRPC port; at least one of the two must stay on.
    allow_http: bool = True
    allow_grpc: bool = True
    #: The ``name`` of the server metadata (``GET /v2``, gRPC ServerMetadata). Clients
    #: written for Triton sometimes check it: Triton's own example clients require "triton".
    server_name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "oipserve"


def configure_logging(settings: Settings) -> None:
    """The log format and level of every oipserve process (the front, the other HTTP fronts)."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


class SettingsError(ValueError):
    """A flag or environment value is invalid; the message names it."""


def _parser() -> argparse.ArgumentParser:
    parser, serve = command_line()
    _document_defaults(serve)
    return parser


def _document_defaults(parser: argparse.ArgumentParser) -> None:
    """Append each flag's Settings default and its OIPSERVE_* variable to its help."""
    fields = {f.name: f for f in msgspec.structs.fields(Settings)}
    # (grpc_processes: read as 0 by load_settings; strict_model_config: None, not given)
    shown = {"grpc_processes": "auto", "strict_model_config": "false"}
    for action in parser._actions:
        field = fields.get(action.dest)
        if field is None:
            continue
        variable = ENV_PREFIX + field.name.upper()
        if action.const is not None:  # --strict: a shorthand, its variable is the long flag's
            action.help = f"{action.help} (env {variable}=true)"
            continue
        if field.required:
            action.help = f"{action.help} (env {variable})"
            continue
        default = shown.get(field.name) or _shown(field.default)
        action.help = f"{action.help} (default: {default}; env {variable})"


def _shown(value: object) -> str:
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 20} MiB"
    return str(value).replace("%", "%%")


def load_settings(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, Settings]:
    """Parse ``argv`` (without the program name) and ``environ`` into (command, Settings)."""
    args = _parser().parse_args(list(argv))
    # Strings (environment) and what argparse made of the flags: msgspec.convert checks them.
    values: dict[str, Any] = _from_environment(environ)
    for field in msgspec.structs.fields(Settings):
        flag_value = getattr(args, field.name, None)
        if flag_value is not None:
            values[field.name] = flag_value
    names = values.get("load_model")
    if names is not None:
        items = [names] if isinstance(names, str) else names
        values["load_model"] = [n.strip() for i in items for n in i.split(",") if n.strip()]
    for name, grpc in (("http_restricted_api", False), ("grpc_restricted_protocol", True)):
        if name in values:
            values[name] = _restrictions(name, values[name], grpc)
    if "metrics_config" in values:
        values["metrics_config"] = _items_checked(
            "metrics_config", values["metrics_config"], parse_metrics_config, MetricsConfigError
        )
    if "cache_config" in values:
        values["cache_config"] = _items_checked(
            "cache_config", values["cache_config"], cache_bytes, CacheConfigError
        )
    if "backend_config" in values:
        values["backend_config"] = _items_checked(
            "backend_config", values["backend_config"], _backend_items, BackendConfigError
        )
    if not str(values.get("model_repository", "")).strip():  # ('' read as the working dir)
        raise SettingsError("--model-repository is required (or set OIPSERVE_MODEL_REPOSITORY)")
    _check_model_control(values.get("model_control_mode"))
    if values.get("grpc_processes") == "auto":
        del values["grpc_processes"]  # Settings' default, 0
    auto_fronts = values.get("http_workers", "auto") == "auto"  # the default (issue #40)
    if auto_fronts:
        values["http_workers"] = fronts_for(usable_cpus())
    _instances_auto(values)
    try:
        settings = msgspec.convert(values, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(_describe(str(exc))) from None
    if auto_fronts and not settings.allow_http:
        settings = msgspec.structs.replace(settings, http_workers=1)  # no port to share
    _check_load_model(settings)
    _check_model_name(settings.model_name)
    _check_ready_file(settings.ready_file)
    if settings.http_workers > 1 and not settings.allow_http:
        raise SettingsError("--http-workers needs HTTP; it cannot go with --allow-http false")
    return args.command, settings


def _from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings the ``OIPSERVE_*`` variables give, by field name.

    A variable set empty (``OIPSERVE_BUSY_POLL_US=``, Docker's ``-e NAME=``, an env file's
    ``NAME=``, a manifest's ``value: ""``) is not set: its setting keeps its default,
    whatever its type, as Click (uvicorn's command line) reads its variables. Before, each
    read it its own way: a number or a boolean stopped the start ("invalid value for
    --busy-poll-us ..."), a list was empty, a string was refused or taken as ''.
    """
    values: dict[str, str] = {}
    for field in msgspec.structs.fields(Settings):
        value = environ.get(ENV_PREFIX + field.name.upper())
        if value:
            values[field.name] = value
    return values


def _check_ready_file(path: str | None) -> None:
    """The ready file is written by replacing what is at its path and removed at shutdown:
    something there that is not a regular file (a directory, ``/dev/null``) is refused."""
    if path is None:
        return
    if os.path.lexists(path) and not os.path.isfile(path):
        raise SettingsError(
            f"--ready-file {path!r} exists and is not a regular file: the server replaces it "
            "when ready and removes it at shutdown"
        )


def _instances_auto(values: dict[str, Any]) -> None:
    """``--instances-per-device auto`` (the default, issue #40) is None: each device's
    count is chosen when its workers start (``hardware.cpus.instances_for``)."""
    given = values.get("instances_per_device", "auto")
    if given == "auto":
        values["instances_per_device"] = None
    elif not str(given).strip().isdigit():  # ("null" would read as None: auto, unasked)
        raise SettingsError(
            f"invalid value for --instances-per-device (or {ENV_PREFIX}INSTANCES_PER_DEVICE):"
            f" {given!r} is neither a number nor auto"
        )


def _backend_items(items: list[str]) -> None:
    default_max_batch_size(items, 0)


def auto_complete_enabled(settings: Settings) -> bool:
    """Whether model configurations are completed from their graphs: not when
    ``--disable-auto-complete-config`` or ``--strict-model-config=true`` says so."""
    return not (settings.disable_auto_complete_config or settings.strict_model_config)


def deprecation_warnings(settings: Settings) -> list[str]:
    """What start-up warns about (one WARNING each): flags still accepted that do nothing,
    and Triton's deprecated spelling, in Triton's words."""
    warnings = [GRPC_PROCESSES_DEPRECATED] if settings.grpc_processes else []
    if settings.strict_model_config is not None:
        warnings.append(STRICT_MODEL_CONFIG_DEPRECATED)
        if settings.disable_auto_complete_config and not settings.strict_model_config:
            warnings.append(STRICT_MODEL_CONFIG_OVERRIDDEN)
    return warnings


def _check_model_control(mode: object) -> None:
    """Triton's "poll" named, with a reason, rather than a bare "invalid choice"."""
    if mode == "poll":
        raise SettingsError(
            "--model-control-mode poll (Triton's repository polling, --repository-poll-secs) "
            "is not implemented: use explicit, and load and unload models through the "
            "repository API, or none to serve the repository's models as found at start"
        )


def _check_load_model(settings: Settings) -> None:
    """--load-model means something only in explicit mode: never ignore it silently.

    Triton ignores it in mode none (and loads every model); we refuse, so a command line
    that meant "only these" does not quietly load everything.
    """
    if settings.load_model and settings.model_control_mode != "explicit":
        raise SettingsError(
            "--load-model (or OIPSERVE_LOAD_MODEL) only applies with --model-control-mode "
            "explicit; mode none loads every model of the repository. Add "
            "--model-control-mode explicit, or drop --load-model"
        )
    if "*" in settings.load_model and len(settings.load_model) > 1:
        raise SettingsError("--load-model '*' (all models) must be the only --load-model")


def _check_model_name(name: str | None) -> None:
    """--model-name is the name of a model: one the repository API could load (no path)."""
    if name is not None and (name in (".", "..") or any(c in name for c in "/\\\0")):
        raise SettingsError(
            f"--model-name (or OIPSERVE_MODEL_NAME) {name!r} is not a model name: it must not "
            "contain '/', '\\' or NUL, nor be '.' or '..'"
        )


def _restrictions(name: str, given: str | list[str], grpc: bool) -> list[Restriction]:
    """Restriction flags parsed; from the environment, several are separated by ``;``.

    A flag holds one restriction (its value may contain ``,`` ``:`` and ``=``,
    so the environment cannot use the comma list of ``OIPSERVE_LOAD_MODEL``).
    """
    specs = [s.strip() for s in given.split(";") if s.strip()] if isinstance(given, str) else given
    try:
        return list(parse_restrictions(specs, grpc=grpc))
    except RestrictionError as exc:
        flag = "--" + name.replace("_", "-")
        raise SettingsError(f"invalid {flag} (or {ENV_PREFIX}{name.upper()}): {exc}") from None


def _items_checked(
    name: str,
    given: str | list[str],
    check: Callable[[list[str]], object],
    error: type[Exception],
) -> list[str]:
    """A repeatable flag's items (from the environment: separated by ``;``), checked now by
    ``check`` so that a bad one stops start-up with the reason (exit 2):
    ``--metrics-config`` (``metrics_config``), ``--cache-config`` (``cache_config``)."""
    items = [i.strip() for i in given.split(";") if i.strip()] if isinstance(given, str) else given
    try:
        check(items)
    except error as exc:
        flag = f"--{name.replace('_', '-')} (or {ENV_PREFIX}{name.upper()})"
        raise SettingsError(f"invalid {flag}: {exc}") from None
    return items


def _describe(message: str) -> str:
    """Turn msgspec's ``... - at `$.http_port``` into a flag name a user recognises."""
    if " - at `$." in message:
        text, _, path = message.partition(" - at `$.")
        name = path.rstrip("`")
        flag = "--" + name.replace("_", "-")
        return f"invalid value for {flag} (or {ENV_PREFIX}{name.upper()}): {text}"
    return message
