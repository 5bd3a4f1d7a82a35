"""Optional inputs of ensembles, as Triton's QA qa/L0_optional_input expects them.

An ensemble input marked ``optional: true`` that a request leaves out reaches the steps that
read it as absent (Triton's ensemble scheduler): a step whose own input is optional runs
without it, a step may leave an optional input unmapped, and a step whose input is required
is refused in its model's words. Until 2026-11-30 every ensemble input was required here,
and a step leaving an optional input unmapped failed the ensemble's load.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.optional_models import BATCH_DELAY_S, DEFAULT_ROW, write_optional_repository
from tests.support.server import ServerProcess, pending, wait_for

IDENTITY = "identity_2_float32"
ENSEMBLE = "ensemble_identity_2_float32"
DATA = {"INPUT0": np.ones((1, 1), np.float32), "INPUT1": np.zeros((1, 1), np.float32) + 7}
OUTPUT = {"INPUT0": "OUTPUT0", "INPUT1": "OUTPUT1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module: the tests read the models' statistics as differences
    from what they were before the test (Triton's QA restarts its server for every case
    to read them from zero), each waiting until its own requests are counted."""
    proc = ServerProcess(write_optional_repository(tmp_path_factory.mktemp("optional")))
    proc.wait_ready()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log


def _infer(proc: ServerProcess, model: str, given: tuple[str, ...]) -> float:
    """One gRPC request giving the inputs ``given`` and asking for their outputs; each
    output checked against its input; its latency in seconds."""
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    inputs = []
    for name in given:
        tensor = grpcclient.InferInput(name, [1, 1], "FP32")
        tensor.set_data_from_numpy(DATA[name])
        inputs.append(tensor)
    outputs = [grpcclient.InferRequestedOutput(OUTPUT[name]) for name in given]
    began = time.monotonic()
    result = client.infer(model, inputs, outputs=outputs)
    took = time.monotonic() - began
    for name in given:
        np.testing.assert_array_equal(result.as_numpy(OUTPUT[name]), DATA[name])
    client.close()
    return took


Counts = tuple[dict[int, int], int, int]


def _batches(proc: ServerProcess, model: str) -> Counts:
    """A model's executions by batch size, successes and inference count."""
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    (stats,) = client.get_inference_statistics(model, "1").model_stats
    client.close()
    batches = {b.batch_size: b.compute_infer.count for b in stats.batch_stats}
    return batches, stats.inference_stats.success.count, stats.inference_count


def _since(proc: ServerProcess, model: str, before: Counts) -> Counts:
    """What ``_batches`` counts now that it did not at ``before``."""
    batches, success, count = _batches(proc, model)
    grown = {size: n - before[0].get(size, 0) for size, n in batches.items()}
    return {s: n for s, n in grown.items() if n}, success - before[1], count - before[2]


def _together(proc: ServerProcess, model: str, given: tuple[str, ...]) -> None:
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(_infer, proc, model, given) for _ in range(2)]:
            future.result()


@pytest.mark.parametrize("given", [("INPUT0", "INPUT1"), ("INPUT1",)], ids=["all", "same"])
def test_ensemble_passes_a_left_out_optional_input_on_as_absent(
    server: ServerProcess, given: tuple[str, ...]
) -> None:
    """test_ensemble_all_inputs, test_ensemble_optional_same_input: two requests giving the
    same inputs form one batch of the composing model; the ensemble counts two of 1."""
    identity, ensemble = _batches(server, IDENTITY), _batches(server, ENSEMBLE)
    _together(server, ENSEMBLE, given)
    assert wait_for(
        lambda: _since(server, ENSEMBLE, ensemble)[1] == _since(server, IDENTITY, identity)[1] == 2
    )
    assert _since(server, IDENTITY, identity) == ({2: 1}, 2, 2)
    assert _since(server, ENSEMBLE, ensemble) == ({1: 2}, 2, 2)


#: Inputs given by neither request of the test below: two such requests end its wait.
OTHERS = ("INPUT0",)


@pytest.mark.parametrize("second", [("INPUT1",), ("INPUT0", "INPUT1")], ids=["mix", "mix_2"])
def test_ensemble_steps_of_other_inputs_are_not_batched_together(
    server: ServerProcess, second: tuple[str, ...]
) -> None:
    """test_ensemble_optional_mix_inputs(_2): a request giving other inputs than the one
    queued before it sends that one at once (Triton's batcher; it answers in well under
    the batcher's delay), and each runs alone. The second is sent so too, by two requests
    giving ``OTHERS`` (Triton's QA waits out its delay instead), which form one batch."""
    before = _batches(server, IDENTITY)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(_infer, server, ENSEMBLE, ("INPUT0",))
        assert wait_for(lambda: pending(server, IDENTITY) == 1)
        last = pool.submit(_infer, server, ENSEMBLE, second)
        assert first.result() < BATCH_DELAY_S - 1
        assert wait_for(lambda: pending(server, IDENTITY) == 1)  # the second, queued
        pool.submit(_together, server, ENSEMBLE, OTHERS).result()
        assert last.result() < BATCH_DELAY_S - 1
    assert wait_for(lambda: _since(server, IDENTITY, before)[1] == 4)
    assert _since(server, IDENTITY, before) == ({1: 2, 2: 1}, 4, 4)


def _default_row(proc: ServerProcess, value: float) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    given = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    given.set_data_from_numpy(np.full((1, 1), value, np.float32))
    result = client.infer("default_row", [given])
    client.close()
    return {name: result.as_numpy(name) for name in ("OUTPUT0", "OUTPUT1")}


def test_a_batch_without_an_input_whose_default_is_one_row_answers_each(
    server: ServerProcess,
) -> None:
    """Two requests leaving out INPUT1 (a default of one row) form one batch, as Triton's
    batcher forms it of requests giving the same inputs; OUTPUT1 is the default's one row,
    not the batch's two: each request gets it whole, as it would alone (it was a 500, 'the
    model cannot be batched')."""
    before = _batches(server, "default_row")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_default_row, server, 1.0)
        assert wait_for(lambda: pending(server, "default_row") == 1)
        last = pool.submit(_default_row, server, 2.0)
        answers = [first.result(), last.result()]
    for value, answer in zip((1.0, 2.0), answers, strict=True):
        np.testing.assert_array_equal(answer["OUTPUT0"], np.full((1, 1), value, np.float32))
        np.testing.assert_array_equal(answer["OUTPUT1"], np.full((1, 1), DEFAULT_ROW, np.float32))
    assert wait_for(lambda: _since(server, "default_row", before)[1] == 2)
    assert _since(server, "default_row", before) == ({2: 1}, 2, 2)


def _pipeline(proc: ServerProcess, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    http = httpclient.InferenceServerClient(proc.host_port)
    inputs = []
    for name, values in data.items():
        tensor = httpclient.InferInput(name, [1, 1], "FP32")
        tensor.set_data_from_numpy(values)
        inputs.append(tensor)
    result = http.infer("pipeline_identity_2_float32", inputs)
    http.close()
    return {name: result.as_numpy(name) for name in ("OUTPUT0", "OUTPUT1")}


def test_a_step_may_leave_an_optional_input_unmapped(server: ServerProcess) -> None:
    """test_ensemble_optional_pipeline: the second step maps INPUT1 alone; its INPUT0 is
    absent (zeros here, the graph's default: OUTPUT0 is always zero). Two requests sent
    together, each step's two one batch (one alone would wait out the batcher's delay at
    each step)."""
    before = _batches(server, IDENTITY)
    other = {name: data + 2 for name, data in DATA.items()}
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda data: _pipeline(server, data), (DATA, other)))
    for data, answer in zip((DATA, other), answers, strict=True):
        np.testing.assert_array_equal(answer["OUTPUT0"], np.zeros((1, 1), np.float32))
        np.testing.assert_array_equal(answer["OUTPUT1"], data["INPUT0"])
    assert wait_for(lambda: _since(server, IDENTITY, before)[1] == 4)
    assert _since(server, IDENTITY, before) == ({2: 2}, 4, 4)


def test_a_left_out_input_a_step_requires_is_refused_in_its_words(server: ServerProcess) -> None:
    """Z is optional in the ensemble, B of ``plus`` is not: the step is refused as a direct
    request to ``plus`` without B would be (core's ValidateRequestInputs), 400 /
    INVALID_ARGUMENT; with Z the ensemble serves."""
    x = np.array([[1.0, 2.0]], np.float32)
    http = httpclient.InferenceServerClient(server.host_port)
    rpc = grpcclient.InferenceServerClient(server.grpc_url)
    words = (
        "expected 2 inputs but got 1 inputs for model 'plus'. Got input(s) ['A'], but "
        "missing required input(s) ['B']. Please provide all required input(s)."
    )
    for client, module, status in (
        (http, httpclient, "400"),
        (rpc, grpcclient, "StatusCode.INVALID_ARGUMENT"),
    ):
        given = module.InferInput("X", [1, 2], "FP32")
        given.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as info:
            client.infer("optional_to_required", [given])
        assert words in str(info.value.message()), info.value
        assert info.value.status() == status
        z = module.InferInput("Z", [1, 2], "FP32")
        z.set_data_from_numpy(x * 10)
        result = client.infer("optional_to_required", [given, z])
        np.testing.assert_array_equal(result.as_numpy("Y"), x * 11)
    http.close()
    rpc.close()
