"""The command line: ``oipserve``'s commands and every flag of ``serve``, with its help.

Each flag's default and ``OIPSERVE_*`` variable come from the one settings object
(``config.settings``), which adds them to the help and reads the parsed flags; a flag's
value here stays None when not given, so that the environment and then the default apply.
"""

from __future__ import annotations

import argparse

import oipserve

DESCRIPTION = """\
An Open Inference Protocol (KServe v2, Triton-compatible) server for ONNX models.
"""

EPILOG = """\
Every flag of `oipserve serve` can also be set as OIPSERVE_<FLAG> (dashes become
underscores, upper case, e.g. OIPSERVE_HTTP_PORT=9000); one set empty is not set
(its default applies); flags win over the environment. Exit codes: 0 after a clean
shutdown (SIGTERM/SIGINT/SIGHUP), 2 for a bad flag, 3 when start-up fails. Run
`oipserve serve --help` for every flag.
"""

SERVE_EPILOG = """\
Each flag shows its default and the OIPSERVE_* variable that sets it; flags win
over the environment. Once started the server logs `ready http://HOST:PORT ...
grpc=HOST:PORT metrics=HOST:PORT` when /v2/health/ready answers 200, else one
line per model that is not ready and `not ready ... serving http://HOST:PORT
...`; both are logged whatever --log-level says (logger oipserve.status).
"""


def command_line() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``oipserve`` parser, and its ``serve`` command's (every flag with its help; the
    defaults and variables are added by ``config.settings``)."""
    parser = argparse.ArgumentParser(
        prog="oipserve",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"oipserve {oipserve.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # KServe's runtime args begin with Triton's program name: `tritonserver` is `serve`.
    serve = commands.add_parser(
        "serve",
        aliases=["tritonserver"],
        help="serve a model repository over HTTP/REST, gRPC and /metrics",
        description="Serve the ONNX models of a Triton-layout repository "
        "(DIR/<model>/<version>/model.onnx).",
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _repository_and_ports(serve)
    _fronts_and_devices(serve)
    _requests_and_workers(serve)
    _connection_limits(serve)
    _models_and_access(serve)
    _start_and_compat(serve)
    return parser, serve


class _OneRepository(argparse.Action):
    """``--model-repository`` / ``--model-store``: given once. Triton serves several
    repositories; this server serves one, and a second flag replaced the first without a
    word (its models then 404; found by fuzzing): exit 2, saying so."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        given = getattr(namespace, self.dest, None)
        if given is not None:
            parser.error(
                f"{option_string} {values}: a model repository was given already ({given}); "
                "oipserve serves one repository (Triton's several are not supported)"
            )
        setattr(namespace, self.dest, values)


def _repository_and_ports(serve: argparse.ArgumentParser) -> None:
    """Where the models are and where the server listens; metrics and the response cache."""
    serve.add_argument(
        "--model-repository",
        action=_OneRepository,
        metavar="DIR",
        help="the model repository, laid out as DIR/<model>/<version>/model.onnx (required)",
    )
    serve.add_argument(
        "--model-name",
        metavar="NAME",
        help="serve a repository that is one model (DIR/model.onnx, DIR/<version>/model.onnx "
        "or a single model directory) as model NAME; KServe passes {{.Name}}, the "
        "InferenceService's name. A repository of several models is served as usual",
    )
    serve.add_argument("--host", help="address the HTTP, gRPC and metrics ports listen on")
    serve.add_argument("--http-port", metavar="PORT", help="HTTP/REST port; 0 picks a free port")
    serve.add_argument("--grpc-port", metavar="PORT", help="gRPC port; 0 picks a free port")
    serve.add_argument(
        "--metrics-port", metavar="PORT", help="Prometheus /metrics port; 0 picks a free port"
    )
    serve.add_argument(
        "--allow-metrics", metavar="true|false", help="serve /metrics on --metrics-port"
    )
    serve.add_argument(
        "--metrics-config",
        metavar="KEY=VALUE",
        action="append",
        help="Triton's flag (repeatable): histogram_latencies=true, summary_latencies=true, "
        "summary_quantiles=Q:E,..., summary_max_age=SECONDS, counter_latencies=false; the "
        "environment separates items with ';'",
    )
    serve.add_argument(
        "--cache-config",
        metavar="local,size=BYTES",
        action="append",
        help="Triton's flag: the response cache for models with response_cache { enable: true } "
        "(one per HTTP front); the environment separates items with ';'",
    )


def _fronts_and_devices(serve: argparse.ArgumentParser) -> None:
    """gRPC's transport limits, the fronts and the devices' workers."""
    serve.add_argument(
        "--grpc-max-message-bytes", metavar="N", help="largest gRPC message, either way"
    )
    serve.add_argument(
        "--grpc-keepalive-time",
        metavar="MS",
        help="Triton's flag: a gRPC connection silent this long (milliseconds) gets a PING",
    )
    serve.add_argument(
        "--grpc-keepalive-timeout",
        metavar="MS",
        help="Triton's flag: a keepalive PING unanswered this long (milliseconds) closes "
        "the connection",
    )
    serve.add_argument(
        "--grpc-max-connection-idle",
        metavar="MS",
        help="a gRPC connection without a call this long (milliseconds) is sent GOAWAY and "
        "closed; 0 never",
    )
    serve.add_argument(
        "--grpc-max-connections",
        metavar="N",
        help="gRPC connections one front holds at once; past it new ones are refused; 0: "
        "half the descriptor limit (RLIMIT_NOFILE), at most 10000",
    )
    serve.add_argument(
        "--grpc-processes",
        metavar="N|auto",
        help="deprecated, does nothing: gRPC is served by every HTTP front (--http-workers "
        "N scales both out); accepted until the next release, see docs/grpc.md",
    )
    serve.add_argument(
        "--http-workers",
        metavar="N|auto",
        help="serve HTTP from N processes that share the port, each with its own event loop "
        "and connections to the workers (1: this process alone); auto (the default): from "
        "the CPUs this process may use (cgroup quota, affinity): 1 on one, 2 from 2, one "
        "per 4 from 12, at most 4; see docs/scaling.md",
    )
    serve.add_argument(
        "--devices",
        help="where workers run: auto (every GPU, else the CPU), cpu, or a list such as "
        "cpu,cuda:0,cuda:1",
    )
    serve.add_argument(
        "--instances-per-device",
        metavar="N|auto",
        help="worker processes per device, each with a session of every model without "
        "instance_group; auto (the default): 1 per GPU, and on the CPU from the CPUs this "
        "process may use: 1 below 12, 2 from 12; see docs/scaling.md",
    )


def _requests_and_workers(serve: argparse.ArgumentParser) -> None:
    """What a request may take, and how the workers are run, polled and watched."""
    serve.add_argument("--max-request-bytes", metavar="N", help="largest HTTP request body")
    serve.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        help="least severe level logged (the ready/not-ready summary is always logged)",
    )
    serve.add_argument(
        "--hardware-inventory",
        metavar="JSON",
        help="a fake hardware inventory file instead of discovery (tests, dry runs)",
    )
    serve.add_argument(
        "--max-queue-per-worker",
        metavar="N",
        help="requests queued on one worker before new ones get 503",
    )
    serve.add_argument(
        "--shutdown-timeout",
        metavar="SECONDS",
        help="how long SIGTERM waits for in-flight requests",
    )
    serve.add_argument(
        "--infer-timeout",
        metavar="SECONDS",
        help="deadline of an inference (a request's own timeout may be shorter)",
    )
    serve.add_argument(
        "--busy-poll-us",
        metavar="US",
        help="at low load, how long a front polls for a worker's reply instead of "
        "sleeping (answers sooner, spends an idle core); 0 never polls",
    )
    serve.add_argument(
        "--worker-busy-poll-us",
        metavar="US",
        help="how long a worker polls for its next request after a reply, while its "
        "requests come that close together, instead of sleeping; 0 never polls",
    )
    serve.add_argument(
        "--low-load-colocation",
        metavar="true|false",
        help="at low load (one short request at a time), run a CPU worker and its front on "
        "one CPU: ~0.7x the CPU a request at c=1, ~0.9x the rate (default false)",
    )
    serve.add_argument(
        "--worker-heartbeat-interval", metavar="SECONDS", help="time between worker heartbeats"
    )
    serve.add_argument(
        "--worker-heartbeat-timeout",
        metavar="SECONDS",
        help="a worker silent this long is killed and replaced",
    )
    serve.add_argument(
        "--worker-replacement-max-pause",
        metavar="SECONDS",
        help="most time between failed starts of a dead worker's replacement (the pause "
        "starts at 0.5 s and doubles)",
    )


def _connection_limits(serve: argparse.ArgumentParser) -> None:
    """What one HTTP connection may take of the server's time and memory."""
    serve.add_argument(
        "--header-timeout", metavar="SECONDS", help="time an HTTP request head may take to arrive"
    )
    serve.add_argument(
        "--max-header-bytes", metavar="N", help="largest HTTP request head (line and fields)"
    )
    serve.add_argument("--max-header-fields", metavar="N", help="most header fields of a request")
    serve.add_argument(
        "--body-timeout",
        metavar="SECONDS",
        help="time a request body may take to arrive, plus 1 s per --min-transfer-rate bytes",
    )
    serve.add_argument(
        "--send-timeout",
        metavar="SECONDS",
        help="time a response may wait for its client to read it, plus 1 s per "
        "--min-transfer-rate bytes read",
    )
    serve.add_argument(
        "--min-transfer-rate",
        metavar="BYTES_PER_S",
        help="bytes a second that extend --body-timeout and --send-timeout by one second",
    )


def _models_and_access(serve: argparse.ArgumentParser) -> None:
    """Model control, restricted APIs and the management endpoints' limits."""
    serve.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        help="none: load every model at start, refuse repository load/unload; explicit: "
        "only the --load-model ones, load/unload allowed (poll: not implemented)",
    )
    serve.add_argument(
        "--load-model",
        metavar="NAME",
        action="append",
        help="with --model-control-mode explicit: a model to load at start (repeatable or "
        "comma-separated; * = all)",
    )
    restriction = "API[,API...]:KEY=VALUE"
    serve.add_argument(
        "--http-restricted-api",
        metavar=restriction,
        action="append",
        help="put API groups behind a header that must carry VALUE (repeatable)",
    )
    serve.add_argument(
        "--grpc-restricted-protocol",
        metavar=restriction,
        action="append",
        help="put API groups behind gRPC metadata that must carry VALUE (repeatable)",
    )
    serve.add_argument(
        "--max-instances-per-endpoint", metavar="N", help="most instances of a worker endpoint"
    )
    serve.add_argument(
        "--max-threads-per-session",
        metavar="N",
        help="most ONNX Runtime threads an endpoint session may ask for",
    )
    serve.add_argument(
        "--max-endpoint-batch-size",
        metavar="N",
        help="largest batch_size a worker endpoint may be loaded with",
    )
    serve.add_argument(
        "--load-timeout", metavar="SECONDS", help="time one worker-endpoint load may take"
    )
    serve.add_argument(
        "--max-upload-files", metavar="N", help="most file: parameters of one repository load"
    )
    serve.add_argument(
        "--max-priority-levels",
        metavar="N",
        help="most dynamic_batching priority_levels a model configuration may ask for",
    )
    _auto_complete(serve)


def _auto_complete(serve: argparse.ArgumentParser) -> None:
    """Triton's flags for completing a model's configuration from its ONNX graph."""
    serve.add_argument(
        "--disable-auto-complete-config",
        action="store_const",
        const="true",
        help="Triton's flag: take each config.pbtxt as given, never completed from the ONNX "
        "graph (a model without one, or with one that lists no inputs, is not loaded, as in "
        "Triton); by default a missing or partial configuration is completed as Triton does "
        "it, see docs/model-config.md",
    )
    serve.add_argument(
        "--strict-model-config",
        metavar="true|false",
        help="Triton's deprecated spelling: true is --disable-auto-complete-config",
    )
    serve.add_argument(
        "--backend-config",
        metavar="[onnxruntime,]default-max-batch-size=N",
        action="append",
        help="Triton's flag, with the one setting of its ONNX Runtime backend taken here: "
        "the max_batch_size auto-complete gives a model whose graph can batch (Triton's "
        "4); the environment separates items with ';'",
    )


def _start_and_compat(serve: argparse.ArgumentParser) -> None:
    """Client shared memory, start-up and Triton's spellings."""
    serve.add_argument(
        "--allow-client-shm",
        metavar="true|false",
        help="clients may register their own POSIX shared memory (off: registration 403)",
    )
    serve.add_argument(
        "--max-shm-regions",
        metavar="N",
        help="clients' shared-memory regions registered at once; one more is refused (400)",
    )
    serve.add_argument(
        "--ready-file",
        metavar="PATH",
        help="write the ports and readiness as JSON here once started; removed at shutdown",
    )
    serve.add_argument(
        "--exit-on-error",
        metavar="true|false",
        help="Triton's flag: true refuses to start (exit 3) when a model fails to load or "
        "the repository holds none",
    )
    serve.add_argument(
        "--strict",
        dest="exit_on_error",
        action="store_const",
        const="true",
        help="the same as --exit-on-error true",
    )
    # Triton's spellings, so kserve-tritonserver's args work unchanged (docs/deploy.md).
    serve.add_argument(
        "--model-store",
        action=_OneRepository,
        metavar="DIR",
        dest="model_repository",
        help="Triton's name for --model-repository",
    )
    serve.add_argument(
        "--allow-http", metavar="true|false", help="serve the HTTP/REST port (Triton's flag)"
    )
    serve.add_argument(
        "--allow-grpc", metavar="true|false", help="serve the gRPC port (Triton's flag)"
    )
    serve.add_argument(
        "--server-name",
        metavar="NAME",
        help='the server\'s name in its metadata (GET /v2, ServerMetadata); "triton" for '
        "clients that check for Triton",
    )
