"""A server whose ``/dev/shm`` is small (a tmpfs of 64 MiB in a mount namespace of its own:
``small_dev_shm``; skipped where the machine does not allow one): requests whose inputs and
outputs fit it are served one after another, however large; one that cannot fit is a 503,
and the next that fits is served.

A worker's output segment and a front's input segment larger than their pool keeps idle
(an eighth of ``/dev/shm``) are unlinked once they come back, but their pages are freed only
once no process maps them. The other side kept its mapping until the owner's next word:
with a small ``/dev/shm`` every request after a large one got a 503 (found by fuzzing).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, small_dev_shm

#: ``/dev/shm`` of the server, MiB.
DEV_SHM_MIB = 64
#: FP32 elements of a request that fits: 28 MiB in (a 32 MiB segment), 28 MiB out.
FITS = 7 * 1024 * 1024
#: One that cannot: 40 MiB each way.
TOO_LARGE = 10 * 1024 * 1024
#: A gRPC client's message limits, past the 40 MiB of ``TOO_LARGE``.
LIMITS = [("grpc.max_send_message_length", 1 << 28), ("grpc.max_receive_message_length", 1 << 28)]

WRAP = small_dev_shm(DEV_SHM_MIB)
pytestmark = pytest.mark.skipif(
    WRAP is None, reason="no mount namespace of our own here (root and unshare needed)"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("small_dev_shm")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "identity_fp32")
    proc = ServerProcess(root, wrap=WRAP or ()).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _infer(server: ServerProcess, protocol: str, elements: int) -> np.ndarray:
    data = np.arange(elements, dtype=np.float32).reshape(1, -1)
    if protocol == "rest":
        with httpclient.InferenceServerClient(server.host_port, network_timeout=120) as rest:
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data, binary_data=True)
            output = rest.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
    else:
        with grpcclient.InferenceServerClient(server.grpc_url, channel_args=LIMITS) as grpc:
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            output = grpc.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
    assert output is not None
    np.testing.assert_array_equal(output, data)
    return output


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_large_requests_one_after_another_are_all_served(
    server: ServerProcess, protocol: str
) -> None:
    """Six requests of 28 MiB each way, one after another, in 64 MiB: each fits once the
    one before it is freed, and is served. Only the first was: every later one got a 503."""
    for _ in range(6):
        _infer(server, protocol, FITS)


def test_a_request_that_cannot_fit_is_a_503_and_the_next_is_served(server: ServerProcess) -> None:
    """40 MiB each way cannot fit in 64 MiB: a 503 (the worker found no room for the
    outputs), and what it took is freed: the next request that fits is served."""
    with pytest.raises(InferenceServerException) as refused:
        _infer(server, "rest", TOO_LARGE)
    assert refused.value.status() == "503", refused.value
    assert "no shared memory for the outputs" in str(refused.value), refused.value
    _infer(server, "rest", FITS)
