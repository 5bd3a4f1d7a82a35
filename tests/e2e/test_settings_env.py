"""A server started with ``OIPSERVE_*`` variables set empty serves with their defaults
(``settings._from_environment``): ``OIPSERVE_BUSY_POLL_US=`` stopped the start, exit 2."""

from __future__ import annotations

from pathlib import Path

from tests.support.http import get
from tests.support.server import ServerProcess

#: Set empty: a number of each front, a float, a boolean, a choice and a string.
EMPTY = {
    name: ""
    for name in (
        "OIPSERVE_BUSY_POLL_US",
        "OIPSERVE_WORKER_BUSY_POLL_US",
        "OIPSERVE_INFER_TIMEOUT",
        "OIPSERVE_ALLOW_GRPC",
        "OIPSERVE_LOG_LEVEL",
        "OIPSERVE_HOST",
    )
}


def test_a_server_started_with_empty_variables_serves_with_the_defaults(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, env=EMPTY).wait_ready()
    try:
        assert server.url.startswith("http://127.0.0.1:"), server.ready_line  # --host's default
        assert server.grpc_port, server.ready_line  # --allow-grpc's default: true
        assert get(server, "/v2/health/ready")[0] == 200
    finally:
        assert server.stop() == 0, server.log
