"""Ragged batching as Triton does it: ``allow_ragged_batch``, ``batch_input``, ``batch_output``.

The model (tests/support/ragged_models.py) takes its input flat and finds each request's
part with the batch inputs the server makes. ``ragged`` batches (preferred size 4, a long
queue delay: four requests of different lengths run as one execution of 4); ``ragged_alone``
is the same model without ``dynamic_batching``, one request per execution. Every answer
from a batch must be bit-for-bit the request's answer alone, the scattered output shaped
like the request's input.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.ragged_models import (
    MALFORMED,
    write_ragged_repository,
    write_unlisted_output_model,
)
from tests.support.server import ServerProcess

#: Far longer than four requests take to arrive: the batch fires at its preferred size.
DELAY_US = 20_000_000
OUTPUTS = ("CENTERED", "SUMS", "MAXLEN", "ITEMLEN", "ITEMLEN_FLAT")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ragged")
    write_ragged_repository(root, DELAY_US)
    proc = ServerProcess(root).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _requests(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.permutation([3, 7, 1, 12])
    return [rng.integers(-50, 50, (1, n)).astype(np.float32) for n in lengths]


def _infer(module: object, client: object, model: str, values: np.ndarray) -> dict[str, np.ndarray]:
    tensor = module.InferInput("INPUT", list(values.shape), "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(values)
    result = client.infer(model, [tensor])  # type: ignore[attr-defined]
    return {name: result.as_numpy(name) for name in OUTPUTS}


def _executions(server: ServerProcess, model: str) -> dict[int, int]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    (stats,) = client.get_inference_statistics(model, "1").model_stats
    return {b.batch_size: b.compute_infer.count for b in stats.batch_stats}


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "rest"])
def test_ragged_batch_answers_each_request_as_alone(server: ServerProcess, module: object) -> None:
    url = server.grpc_url if module is grpcclient else server.host_port
    requests = _requests(7 if module is grpcclient else 8)
    before = _executions(server, "ragged")
    with ThreadPoolExecutor(4) as pool:
        clients = [module.InferenceServerClient(url) for _ in requests]  # type: ignore[attr-defined]
        batched = list(pool.map(lambda c, v: _infer(module, c, "ragged", v), clients, requests))
    after = _executions(server, "ragged")
    assert after.get(4, 0) - before.get(4, 0) == 1, (before, after)  # one execution of 4
    assert sum(after.values()) - sum(before.values()) == 1
    longest = max(v.size for v in requests)
    alone_client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    for values, got in zip(requests, batched, strict=True):
        alone = _infer(module, alone_client, "ragged_alone", values)
        assert got["CENTERED"].shape == values.shape  # scattered with INPUT's shape
        for name in ("CENTERED", "SUMS", "ITEMLEN", "ITEMLEN_FLAT"):
            assert got[name].tobytes() == alone[name].tobytes(), name
        assert got["SUMS"].tolist() == [[values.sum()]]
        assert got["ITEMLEN"].tolist() == [[values.size]] == got["ITEMLEN_FLAT"].tolist()
        # BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: the batch's longest request, not this one's
        assert got["MAXLEN"].tolist() == [[longest]]
        assert alone["MAXLEN"].tolist() == [[values.size]]


def test_batch_inputs_are_made_by_the_server(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.host_port)
    metadata = client.get_model_metadata("ragged")
    assert [t["name"] for t in metadata["inputs"]] == ["INPUT"]
    assert metadata["inputs"][0]["shape"] == [-1, -1]
    values = np.ones((1, 3), np.float32)
    x = httpclient.InferInput("INPUT", [1, 3], "FP32")
    x.set_data_from_numpy(values)
    offsets = httpclient.InferInput("OFFSETS", [2], "INT32")
    offsets.set_data_from_numpy(np.array([0, 3], np.int32))
    with pytest.raises(InferenceServerException, match="OFFSETS") as caught:
        client.infer("ragged_alone", [x, offsets])
    assert caught.value.status() == "400"


def test_malformed_batch_io_is_refused_at_load(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.host_port)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    for name, (_, reason) in MALFORMED.items():
        assert index[name]["state"] == "UNAVAILABLE", name
        assert reason in index[name]["reason"], (name, index[name]["reason"])
    assert index["ragged"]["state"] == "READY"


#: A graph with an output config.pbtxt leaves out (``UNLISTED``, the batch input's copy:
#: one row per execution, not per request), ragged and batched, and not batched.
_UNLISTED_CONFIGS = {
    "ragged_unlisted": """max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "IDX"
  data_type: TYPE_INT32 source_input: "X" } ]
batch_output [ { target_name: "Y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "X" } ]
dynamic_batching { max_queue_delay_microseconds: 20000000 preferred_batch_size: [ 2 ] }
""",
    "plain_unlisted": """max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "IDX" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
""",
}


def test_an_output_the_config_leaves_out_is_not_computed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """As Triton: a request naming no outputs gets the config's, and the graph's others are
    not run. They were: cut by rows, the ragged model's extra output failed every batch with
    a 500 (found by fuzzing), and a model that is not batched returned it."""
    root = tmp_path_factory.mktemp("unlisted")
    for name, config in _UNLISTED_CONFIGS.items():
        write_unlisted_output_model(root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    proc = ServerProcess(root).wait_ready()
    try:
        client = httpclient.InferenceServerClient(proc.host_port)
        values = [np.arange(n, dtype=np.float32).reshape(1, n) for n in (3, 5)]

        def infer(x: np.ndarray) -> dict:
            # (a client of its own in each thread: tritonclient's HTTP one is gevent's)
            with httpclient.InferenceServerClient(proc.host_port) as own:
                given = httpclient.InferInput("X", list(x.shape), "FP32")
                given.set_data_from_numpy(x)
                return own.infer("ragged_unlisted", [given]).get_response()

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(infer, values))
        for x, answer in zip(values, answers, strict=True):
            assert [(o["name"], o["shape"]) for o in answer["outputs"]] == [("Y", list(x.shape))]
        given = [
            httpclient.InferInput("X", [3], "FP32"),
            httpclient.InferInput("IDX", [2], "INT32"),
        ]
        given[0].set_data_from_numpy(np.ones(3, np.float32))
        given[1].set_data_from_numpy(np.zeros(2, np.int32))
        answer = client.infer("plain_unlisted", given).get_response()
        assert [o["name"] for o in answer["outputs"]] == ["Y"]
        client.close()
    finally:
        assert proc.stop() == 0, proc.log
