"""A batching model's scalar outputs answered as Triton answers them, REST (binary and
JSON) and gRPC (docs/model-config.md, "Scalars"): a value a row (``row_scalar``: the
graph's [-1] under ``dims: [1]``, ``reshape: { shape: [] }``) is ``[batch, 1]`` (core
reshapes the backend's ``[batch]`` to the dims); one value for the whole run
(``batch_scalar``: a graph output without dims under ``dims: [1]``) is ``[1]`` for a batch
of 1 (its backend's ``scalar_outputs_``, its first dim the batch size) and refused past
it, in the words of its output responder. Until 2026-11-30 the latter was answered as
the model gave it, ``[]``, whatever the batch."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.scalar_models import write_scalar_models
from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def scalars(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("scalars")
    write_scalar_models(root)
    proc = ServerProcess(root, ["--http-workers", "1"]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _x(module: object, rows: int) -> list[object]:
    given = module.InferInput("X", [rows, 2], "FP32")  # type: ignore[attr-defined]
    given.set_data_from_numpy(np.arange(rows * 2, dtype=np.float32).reshape(rows, 2))
    return [given]


def _answers(proc: ServerProcess, model: str, rows: int) -> list[tuple[list[int], np.ndarray]]:
    """Y's shape and values over REST binary, REST JSON and gRPC."""
    answers = []
    with httpclient.InferenceServerClient(proc.host_port) as client:
        for binary in (True, False):
            wanted = [httpclient.InferRequestedOutput("Y", binary_data=binary)]
            result = client.infer(model, _x(httpclient, rows), outputs=wanted)
            answers.append((result.get_output("Y")["shape"], result.as_numpy("Y")))
    with grpcclient.InferenceServerClient(proc.grpc_url) as client:
        result = client.infer(model, _x(grpcclient, rows))
        output = result.get_output("Y")
        assert output is not None
        answers.append((list(output.shape), result.as_numpy("Y")))
    return answers


@pytest.mark.parametrize("rows", [1, 3])
def test_a_scalar_a_row_is_batch_by_1(scalars: ServerProcess, rows: int) -> None:
    sums = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2).sum(axis=1)
    for shape, values in _answers(scalars, "row_scalar", rows):
        assert shape == [rows, 1]
        np.testing.assert_array_equal(values, sums.reshape(rows, 1))


def test_a_scalar_for_the_whole_batch_is_1_for_a_batch_of_1(scalars: ServerProcess) -> None:
    for shape, values in _answers(scalars, "batch_scalar", 1):
        assert shape == [1]
        np.testing.assert_array_equal(values, np.array([1.0], np.float32))


def test_a_scalar_for_the_whole_batch_is_refused_past_1(scalars: ServerProcess) -> None:
    words = (
        "failed to split the output tensor 'Y' in responses: expected batch size of at "
        "least 2 in model output, got 1"
    )
    with httpclient.InferenceServerClient(scalars.host_port) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("batch_scalar", _x(httpclient, 2))
        assert info.value.status() == "501", info.value
        assert str(info.value.message()).startswith(words), info.value
    with grpcclient.InferenceServerClient(scalars.grpc_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("batch_scalar", _x(grpcclient, 2))
        assert info.value.status() == str(grpc.StatusCode.UNIMPLEMENTED), info.value
        assert str(info.value.message()).startswith(words), info.value
