from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, shm_entries


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-m perf`` runs in one process whatever ``-n`` says (pyproject.toml's addopts
    give 2): a test timing CPU next to another would time both."""
    selected = config.option.markexpr or ""
    if "perf" in selected.replace("not perf", "") and hasattr(config.option, "numprocesses"):
        config.option.numprocesses = 0


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A parameter that holds this process's pid (a segment name of its own) gets an id
    without it: pytest-xdist's workers, each its own process, must collect the same ids."""
    pid = str(os.getpid())
    if isinstance(val, str) and pid in val:
        return val.replace(pid, "PID")
    return None


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """The sample repository served once for the whole session (read-only tests)."""
    proc = ServerProcess().wait_ready()
    yield proc
    code = proc.stop()
    assert code == 0, proc.log


@pytest.fixture(scope="module")
def shm_server() -> Iterator[ServerProcess]:
    """A server of the sample repository with ``--allow-client-shm true`` (one per module);
    at its stop nothing of it may be left in /dev/shm."""
    proc = ServerProcess(args=["--allow-client-shm", "true"]).wait_ready()
    yield proc
    code = proc.stop()
    assert code == 0, proc.log
    assert shm_entries(proc.process.pid) == []


@pytest.fixture(scope="session")
def url(server: ServerProcess) -> str:
    return server.url


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    """A tritonclient HTTP client of ``server`` (a module's own ``server`` fixture wins)."""
    client = httpclient.InferenceServerClient(server.host_port)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    """A tritonclient gRPC client of ``server`` (a module's own ``server`` fixture wins)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture
def shm_object() -> Iterator[str]:
    """A client's object of 4096 bytes; yields its key."""
    name = f"oipserve-unit-{uuid.uuid4().hex[:10]}"
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as handle:
        handle.truncate(4096)
    yield "/" + name
    if os.path.exists(path):
        os.unlink(path)
