"""Ensembles with several HTTP fronts (``--http-workers 2``, the default on 2 CPUs): every
front runs an ensemble's steps, so a gRPC call (answered by the front its connection
landed on, never forwarded) finds the ensemble whichever front took it.

Before 2026-11-28 the other fronts' snapshots held only versions with sessions on workers,
and an ensemble runs on none: a gRPC ModelInfer for it on another front was 400 "Request
for unknown model". REST was forwarded to the primary and served.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.ensemble_models import write_repository
from tests.support.server import ServerProcess

X = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
#: New connections made: the kernel spreads them over the two fronts (SO_REUSEPORT), so
#: that all land on one front has a chance of 2 ** -15.
CONNECTIONS = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_repository(tmp_path_factory.mktemp("fronts"))
    args = ["--model-control-mode", "explicit", "--load-model", "chain", "--http-workers", "2"]
    proc = ServerProcess(root, args).wait_ready()
    yield proc
    assert proc.stop() == 0


def test_every_front_runs_the_ensemble(server: ServerProcess) -> None:
    assert len(server.http_front_pids()) == 1, server.log  # and the primary
    expected = (X + 1) * 2
    for _ in range(CONNECTIONS):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            given = grpcclient.InferInput("X", list(X.shape), "FP32")
            given.set_data_from_numpy(X)
            np.testing.assert_array_equal(client.infer("chain", [given]).as_numpy("Y"), expected)
        finally:
            client.close()
    http = httpclient.InferenceServerClient(server.host_port)
    try:
        stats = http.get_inference_statistics("chain")["model_stats"][0]["inference_stats"]
        assert stats["success"]["count"] == CONNECTIONS  # every front's count, summed
    finally:
        http.close()
