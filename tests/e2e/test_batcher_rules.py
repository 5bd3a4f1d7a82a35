"""Triton's batch-forming rules, as its qa/L0_batcher/batcher_test.py checks them.

The sample model ``batched`` (max_batch_size 16) is served with Triton's QA batcher
settings, ``preferred_batch_size: [2, 6]`` and a long ``max_queue_delay``: a request of
a size that is not preferred waits for the whole delay unless a rule fires it sooner.
Its output ROWS says how many rows the execution it ran in had, and the statistics
extension's ``batch_stats`` counts executions by batch size, as Triton's test reads them.
Requests are sent once the one before is seen queued (the pending request count), so
nothing here depends on how fast the box is; the delay only has to outlast a request's
trip, and it is seconds.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.server import SAMPLE_REPOSITORY, ServerProcess, pending, steadily, wait_for

MODEL = "rules"
#: Long enough that a request held for it is told apart from one that fired at once (a
#: request's trip, the pending count polled in between, takes well under a second even
#: on a loaded 2-core box).
DELAY_S = 3.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batcher_rules")
    source = SAMPLE_REPOSITORY / "batched"
    config = (source / "config.pbtxt").read_text()
    head = config[: config.index("dynamic_batching")].replace('name: "batched"', f'name: "{MODEL}"')
    shutil.copytree(source / "1", root / MODEL / "1")
    delay_us = int(DELAY_S * 1e6)
    (root / MODEL / "config.pbtxt").write_text(
        f"{head}dynamic_batching {{ preferred_batch_size: [ 2, 6 ] "
        f"max_queue_delay_microseconds: {delay_us} }}\n"
    )
    proc = ServerProcess(root).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _inputs(module: object, rows: int, seed: int) -> tuple[list, np.ndarray, list[bytes]]:
    values = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + seed * 100
    texts = [f"req-{seed}-row-{r}".encode() for r in range(rows)]
    x = module.InferInput("INPUT0", [rows, 4], "FP32")  # type: ignore[attr-defined]
    x.set_data_from_numpy(values)
    t = module.InferInput("TEXT", [rows, 1], "BYTES")  # type: ignore[attr-defined]
    t.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
    return [x, t], values, texts


def _outputs(module: object, names: list[str] | None) -> list | None:
    if names is None:  # none named: every output
        return None
    return [module.InferRequestedOutput(name) for name in names]  # type: ignore[attr-defined]


def _batch_sizes(server: ServerProcess) -> dict[int, int]:
    """Executions of the model by batch size (``batch_stats``), as Triton's test reads them."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    (stats,) = client.get_inference_statistics(MODEL, "1").model_stats
    return {b.batch_size: b.compute_infer.count for b in stats.batch_stats}


def _executions_since(server: ServerProcess, before: dict[int, int]) -> dict[int, int]:
    now = _batch_sizes(server)
    return {size: n - before.get(size, 0) for size, n in now.items() if n != before.get(size, 0)}


def _send(
    pool: ThreadPoolExecutor,
    server: ServerProcess,
    module: object,
    rows: int,
    seed: int,
    outputs: list[str] | None = None,
) -> Future:
    """One request in the background, on a client of its own; the future gives
    (result, seconds it took, values, texts)."""

    def call() -> tuple[object, float, np.ndarray, list[bytes]]:
        inputs, values, texts = _inputs(module, rows, seed)
        if module is httpclient:
            client: object = httpclient.InferenceServerClient(server.host_port, network_timeout=60)
        else:
            client = grpcclient.InferenceServerClient(server.grpc_url)
        started = time.monotonic()
        result = client.infer(MODEL, inputs, outputs=_outputs(module, outputs))  # type: ignore[attr-defined]
        took = time.monotonic() - started
        client.close()  # type: ignore[attr-defined]
        return result, took, values, texts

    return pool.submit(call)


def _output_names(result: object) -> list[str]:
    """The outputs an answer holds, in its order (REST: a dict; gRPC: the message)."""
    response = result.get_response()  # type: ignore[attr-defined]
    if isinstance(response, dict):
        return [output["name"] for output in response["outputs"]]
    return [output.name for output in response.outputs]


def _queued(server: ServerProcess, count: int) -> bool:
    return wait_for(steadily(lambda: pending(server, MODEL) == count), 10)


def test_a_request_that_would_pass_the_largest_preferred_size_waits_for_its_own_batch(
    server: ServerProcess,
) -> None:
    """Triton's test_multi_batch_sum_gt_max_preferred: a batch of 3 is queued (3 is no
    preferred size), then a request of 4 arrives: 3 + 4 passes the largest preferred
    size, 6, so the 3 fire at once, and the 4, alone no preferred size, wait for their
    delay. Not one batch of 7 (max_batch_size 16 would hold it)."""
    before = _batch_sizes(server)
    with ThreadPoolExecutor(2) as pool:
        three = _send(pool, server, grpcclient, 3, seed=1)
        assert _queued(server, 1), "the batch of 3 was not held for its delay"
        four = _send(pool, server, httpclient, 4, seed=2)
        result, took, values, _ = three.result(DELAY_S * 3)
        assert result.as_numpy("ROWS").ravel().tolist() == [3, 3, 3]
        assert took < DELAY_S, f"the batch of 3 waited {took:.1f} s: it was not fired at once"
        assert pending(server, MODEL) == 1, "the 4 did not stay queued once the 3 fired"
        result, took, values, _ = four.result(DELAY_S * 3)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values + 1)
    assert result.as_numpy("ROWS").ravel().tolist() == [4] * 4
    assert took >= DELAY_S * 0.9, f"the 4 fired after {took:.2f} s, before their delay"
    assert wait_for(lambda: _executions_since(server, before) == {3: 1, 4: 1}, 10), (
        _executions_since(server, before)
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (["OUTPUT0", "ROWS"], ["TEXT_OUT", "ROWS"]),  # test_multi_different_outputs
        (["OUTPUT0", "ROWS"], ["ROWS", "OUTPUT0"]),  # test_multi_different_output_order
        (None, ["ROWS"]),  # every output, and one of them
    ],
)
def test_requests_asking_for_different_outputs_share_a_batch(
    server: ServerProcess, first: list[str] | None, second: list[str]
) -> None:
    """Triton's test_multi_different_outputs: two requests of one row that ask for
    different outputs make the preferred size 2 together and run as one batch at once;
    each answer holds the outputs its request asked for, in its order, and its own rows."""
    before = _batch_sizes(server)
    with ThreadPoolExecutor(2) as pool:
        one = _send(pool, server, httpclient, 1, seed=3, outputs=first)
        assert _queued(server, 1), "the first request was not held for its delay"
        two = _send(pool, server, grpcclient, 1, seed=4, outputs=second)
        answers = [one.result(DELAY_S * 3), two.result(DELAY_S * 3)]
    for (result, took, values, texts), asked in zip(answers, [first, second], strict=True):
        assert took < DELAY_S, f"a request waited {took:.1f} s: the two did not batch at once"
        names = _output_names(result)
        assert names == (asked or ["OUTPUT0", "TEXT_OUT", "ROWS"])
        assert result.as_numpy("ROWS").ravel().tolist() == [2]
        if "OUTPUT0" in names:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values + 1)
        if "TEXT_OUT" in names:
            assert result.as_numpy("TEXT_OUT").ravel().tolist() == texts
    assert wait_for(lambda: _executions_since(server, before) == {2: 1}, 10), _executions_since(
        server, before
    )
