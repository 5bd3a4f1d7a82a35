from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server import ServerProcess


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """The sample repository served once for the whole session (read-only tests)."""
    proc = ServerProcess().wait_ready()
    yield proc
    code = proc.stop()
    assert code == 0, proc.log


@pytest.fixture(scope="session")
def url(server: ServerProcess) -> str:
    return server.url
