"""The response cache (``response_cache { enable: true }``, ``--cache-config local,size=N``)
end to end, with tritonclient over REST and gRPC.

A hit is told from a miss by the statistics extension (``cache_hit`` / ``cache_miss``) and
by what did not move: ``inference_count``, ``execution_count``, the compute counts. Counts
are compared as differences (before/after) on the module's server.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from oipserve.dataplane.response_cache import ENTRY_OVERHEAD, TENSOR_OVERHEAD
from tests.support.metrics import scrape
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess

CACHED = "response_cache { enable: true }\n"


def _repository(root: Path) -> Path:
    """simple, identity_fp32, batched and reshape with the cache on; ``plain`` (simple)
    without."""
    for name in ("simple", "identity_fp32", "batched", "reshape"):
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
        config = root / name / "config.pbtxt"
        config.write_text((config.read_text() if config.exists() else "") + CACHED)
    shutil.copytree(SAMPLE_REPOSITORY / "simple", root / "plain")
    config = root / "plain" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "simple"', 'name: "plain"'))
    return root


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = _repository(tmp_path_factory.mktemp("cache-repo"))
    args = ["--cache-config", "local,size=67108864", "--allow-client-shm", "true"]
    proc = ServerProcess(root, args).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def http(cached_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(cached_server.host_port)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(cached_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(cached_server.grpc_url) as client:
        yield client


def _counts(http: httpclient.InferenceServerClient, model: str) -> dict[str, int]:
    stat = http.get_inference_statistics(model)["model_stats"][0]
    infer = stat["inference_stats"]
    return {
        "hit": infer["cache_hit"]["count"],
        "miss": infer["cache_miss"]["count"],
        "success": infer["success"]["count"],
        "compute": infer["compute_infer"]["count"],
        "inferences": stat["inference_count"],
        "executions": stat["execution_count"],
    }


def _moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in before}


def _simple(module: object, seed: int, binary: bool = True) -> tuple[list, list]:
    """Inputs of ``simple`` / ``plain`` that no other test sends (``seed``), both outputs."""
    data = np.arange(16, dtype=np.int32).reshape(1, 16) + seed
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(
            data, **({"binary_data": binary} if module is httpclient else {})
        )
        inputs.append(tensor)
    if module is httpclient:
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
        ]
    else:
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    return inputs, outputs


def _seed() -> int:
    return uuid.uuid4().int % 1_000_000


def _outputs(result: object) -> tuple[np.ndarray, np.ndarray]:
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")  # type: ignore[attr-defined]


# ---- hits and misses -----------------------------------------------------------------


def test_a_request_that_fails_after_its_lookup_is_no_miss(
    http: httpclient.InferenceServerClient,
) -> None:
    """A miss counts once its answer came, as Triton's (with the answer it stores): a
    request that fails after its lookup (ONNX Runtime refuses its values) is no miss, so
    a model's hits and misses add up to its successes. It counted as one (fuzzing)."""

    def reshape(shape: list[int]) -> list[httpclient.InferInput]:
        data = httpclient.InferInput("DATA", [6], "FP32")
        data.set_data_from_numpy(np.arange(6, dtype=np.float32) + _seed())
        target = httpclient.InferInput("SHAPE", [2], "INT64")
        target.set_data_from_numpy(np.array(shape, dtype=np.int64))
        return [data, target]

    before = _counts(http, "reshape")
    with pytest.raises(InferenceServerException) as info:
        http.infer("reshape", reshape([4, 4]))
    assert info.value.status() == "400"
    inputs = reshape([2, 3])
    for _ in range(2):  # a miss, then its hit
        assert http.infer("reshape", inputs).as_numpy("OUTPUT0").shape == (2, 3)
    moved = _moved(before, _counts(http, "reshape"))
    assert (moved["miss"], moved["hit"], moved["success"]) == (1, 1, 2), moved


@pytest.mark.parametrize("front", ["rest", "grpc"])
def test_miss_then_hit_without_touching_a_worker(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, front: str
) -> None:
    client, module = (http, httpclient) if front == "rest" else (grpc, grpcclient)
    inputs, outputs = _simple(module, _seed())
    before = _counts(http, "simple")
    first = _outputs(client.infer("simple", inputs, outputs=outputs))
    missed = _counts(http, "simple")
    assert _moved(before, missed) == {
        "hit": 0, "miss": 1, "success": 1, "compute": 1, "inferences": 1, "executions": 1,
    }  # fmt: skip
    second = _outputs(client.infer("simple", inputs, outputs=outputs))
    assert _moved(missed, _counts(http, "simple")) == {
        "hit": 1, "miss": 0, "success": 1, "compute": 0, "inferences": 0, "executions": 0,
    }  # fmt: skip
    for a, b in zip(first, second, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()


def test_a_hit_is_encoded_by_each_front(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """Stored by gRPC, answered to REST binary (same key); REST JSON asks the worker for
    JSON text, so it is its own key: a miss, then a hit. Every answer is the same."""
    seed = _seed()
    base = np.arange(16, dtype=np.int32).reshape(1, 16) + seed
    inputs, outputs = _simple(grpcclient, seed)
    expected = _outputs(grpc.infer("simple", inputs, outputs=outputs))
    assert (expected[0] == base + base).all() and (expected[1] == 0).all()
    before = _counts(http, "simple")
    inputs, outputs = _simple(httpclient, seed, binary=True)
    binary = _outputs(http.infer("simple", inputs, outputs=outputs))
    assert _moved(before, _counts(http, "simple"))["hit"] == 1
    before = _counts(http, "simple")
    inputs, outputs = _simple(httpclient, seed, binary=False)
    texts = [_outputs(http.infer("simple", inputs, outputs=outputs)) for _ in range(2)]
    moved = _moved(before, _counts(http, "simple"))
    assert (moved["miss"], moved["hit"], moved["executions"]) == (1, 1, 1)
    for answer in (binary, *texts):
        for a, b in zip(expected, answer, strict=True):
            assert a.dtype == b.dtype and (a == b).all()


def test_different_inputs_outputs_or_parameters_miss(
    http: httpclient.InferenceServerClient,
) -> None:
    seed = _seed()
    inputs, outputs = _simple(httpclient, seed)
    http.infer("simple", inputs, outputs=outputs)
    before = _counts(http, "simple")
    other_inputs, _ = _simple(httpclient, seed + 1)
    http.infer("simple", other_inputs, outputs=outputs)  # other input bytes
    http.infer("simple", inputs, outputs=outputs[:1])  # fewer outputs
    classes = [httpclient.InferRequestedOutput("OUTPUT0", class_count=2)]
    http.infer("simple", inputs, outputs=classes)  # classification asked
    moved = _moved(before, _counts(http, "simple"))
    assert (moved["hit"], moved["miss"], moved["executions"]) == (0, 3, 3)


def _batched_inputs(seed: int) -> list[httpclient.InferInput]:
    inputs = [
        httpclient.InferInput("INPUT0", [1, 4], "FP32"),
        httpclient.InferInput("TEXT", [1, 1], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(np.full((1, 4), seed, dtype=np.float32))
    inputs[1].set_data_from_numpy(np.array([[b"cache"]], dtype=np.object_))
    return inputs


def test_a_batched_model_hits_too(http: httpclient.InferenceServerClient) -> None:
    inputs = _batched_inputs(_seed())
    before = _counts(http, "batched")
    first = http.infer("batched", inputs)
    second = http.infer("batched", inputs)
    moved = _moved(before, _counts(http, "batched"))
    assert (moved["miss"], moved["hit"], moved["executions"], moved["inferences"]) == (1, 1, 1, 1)
    for name in ("OUTPUT0", "TEXT_OUT", "ROWS"):
        assert (first.as_numpy(name) == second.as_numpy(name)).all()


def test_a_large_answer_is_stored_at_its_second_miss(
    http: httpclient.InferenceServerClient,
) -> None:
    """Past ADMIT_AT bytes an answer is stored once it missed twice (docs/cache.md)."""
    data = np.random.default_rng().random((1, 40_000), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 40_000], "FP32")
    tensor.set_data_from_numpy(data)
    before = _counts(http, "identity_fp32")
    answers = [http.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0") for _ in range(3)]
    moved = _moved(before, _counts(http, "identity_fp32"))
    assert (moved["miss"], moved["hit"], moved["executions"]) == (2, 1, 2)
    assert all((answer == data).all() for answer in answers)
    # One byte changed where the key does not sample it: compared whole, so a miss.
    changed = data.copy()
    changed[0, 20_001] += 1.0
    tensor.set_data_from_numpy(changed)
    before = _counts(http, "identity_fp32")
    assert (http.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0") == changed).all()
    assert _moved(before, _counts(http, "identity_fp32"))["hit"] == 0


# ---- never cached ----------------------------------------------------------------------


def test_a_model_without_response_cache_is_never_cached(
    http: httpclient.InferenceServerClient,
) -> None:
    inputs, outputs = _simple(httpclient, _seed())
    before = _counts(http, "plain")
    for _ in range(3):
        http.infer("plain", inputs, outputs=outputs)
    moved = _moved(before, _counts(http, "plain"))
    assert (moved["hit"], moved["miss"], moved["executions"]) == (0, 0, 3)


def test_a_failed_request_is_not_stored(http: httpclient.InferenceServerClient) -> None:
    """Past its deadline (timeout 1 µs, while the batcher waits for more requests) the
    request fails after its lookup (no miss: a miss counts with its answer); the same
    request then misses and runs."""
    inputs = _batched_inputs(_seed())
    before = _counts(http, "batched")
    with pytest.raises(InferenceServerException):
        http.infer("batched", inputs, timeout=1)
    failed = _counts(http, "batched")
    assert _moved(before, failed)["miss"] == 0
    http.infer("batched", inputs)
    moved = _moved(failed, _counts(http, "batched"))
    assert (moved["hit"], moved["miss"], moved["executions"]) == (0, 1, 1)


class _Region:
    def __init__(self, size: int) -> None:
        self.name = f"r{uuid.uuid4().hex[:8]}"
        self.key = f"/oipserve-cache-{uuid.uuid4().hex[:12]}"
        self.handle = shm.create_shared_memory_region(self.name, self.key, size)


@pytest.mark.parametrize("where", ["inputs", "outputs"])
def test_shared_memory_requests_are_never_cached(
    http: httpclient.InferenceServerClient, where: str
) -> None:
    region = _Region(128)
    data = np.arange(16, dtype=np.int32).reshape(1, 16) + _seed()
    shm.set_shared_memory_region(region.handle, [data, data])
    http.register_system_shared_memory(region.name, region.key, 128)
    try:
        before = _counts(http, "simple")
        for _ in range(2):
            inputs, outputs = _simple(httpclient, 0)
            if where == "inputs":
                inputs[0].set_shared_memory(region.name, 64)
                inputs[1].set_shared_memory(region.name, 64, offset=64)
            else:
                outputs[0].set_shared_memory(region.name, 64)
                outputs[1].set_shared_memory(region.name, 64, offset=64)
            http.infer("simple", inputs, outputs=outputs)
        moved = _moved(before, _counts(http, "simple"))
        assert (moved["hit"], moved["miss"], moved["executions"]) == (0, 0, 2)
    finally:
        http.unregister_system_shared_memory(region.name)
        shm.destroy_shared_memory_region(region.handle)


# ---- statistics and metrics --------------------------------------------------------------


def test_statistics_and_metrics_fields(
    cached_server: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    inputs, outputs = _simple(httpclient, _seed())
    for _ in range(2):
        http.infer("simple", inputs, outputs=outputs)
    rest = http.get_inference_statistics("simple")["model_stats"][0]["inference_stats"]
    grpc_stats = grpc.get_inference_statistics("simple").model_stats[0].inference_stats
    page = scrape(cached_server.metrics_url)
    assert rest["cache_hit"]["count"] >= 1 and rest["cache_hit"]["ns"] > 0
    assert rest["cache_miss"]["count"] >= 1 and rest["cache_miss"]["ns"] > 0
    assert grpc_stats.cache_hit.count >= rest["cache_hit"]["count"]
    assert rest["compute_infer"]["count"] == rest["success"]["count"] - rest["cache_hit"]["count"]
    assert rest["queue"]["count"] == rest["success"]["count"]
    for family in ("nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model"):
        assert page.types[family] == "counter"
    assert page.value("nv_cache_num_hits_per_model", "simple") >= rest["cache_hit"]["count"]
    assert page.value("nv_cache_num_misses_per_model", "simple") >= rest["cache_miss"]["count"]
    assert page.value("nv_cache_hit_duration_per_model", "simple") >= 0
    assert page.value("nv_cache_miss_duration_per_model", "simple") > 0
    with pytest.raises(KeyError):  # a model without response_cache has no cache counters
        page.value("nv_cache_num_hits_per_model", "plain")
    assert page.value("nv_inference_count", "simple") < page.value(
        "nv_inference_request_success", "simple"
    )


def test_no_cache_families_without_cache_config(server: ServerProcess) -> None:
    """The session server has no --cache-config: no cache family at all."""
    assert "nv_cache_num_hits_per_model" not in scrape(server.metrics_url).types


# ---- eviction ---------------------------------------------------------------------------

#: identity_fp32 entries of 1000 FP32 elements: key (input whole) + output + overhead.
ENTRY = ENTRY_OVERHEAD + 2 * TENSOR_OVERHEAD + 4000 + 4000


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Room for exactly three identity_fp32 entries."""
    root = tmp_path_factory.mktemp("small-cache")
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "identity_fp32")
    (root / "identity_fp32" / "config.pbtxt").write_text(CACHED)
    proc = ServerProcess(root, ["--cache-config", f"local,size={3 * ENTRY}"]).wait_ready()
    yield proc
    proc.stop()


def test_eviction_at_the_byte_bound_least_recently_used_first(
    small_cache: ServerProcess,
) -> None:
    client = grpcclient.InferenceServerClient(small_cache.grpc_url)
    try:

        def ask(value: float) -> bool:
            """True when the request was a hit."""
            data = np.full((1, 1000), value, dtype=np.float32)
            tensor = grpcclient.InferInput("INPUT0", [1, 1000], "FP32")
            tensor.set_data_from_numpy(data)
            before = client.get_inference_statistics("identity_fp32").model_stats[0]
            answer = client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
            assert (answer == data).all()
            after = client.get_inference_statistics("identity_fp32").model_stats[0]
            return after.inference_stats.cache_hit.count > before.inference_stats.cache_hit.count

        assert [ask(v) for v in (1, 2, 3)] == [False, False, False]
        assert ask(1)  # 1 is now the most recently used: 2, 3, 1
        assert not ask(4)  # full: 2 goes (3, 1, 4)
        assert [ask(3), ask(1), ask(4)] == [True, True, True]
        assert not ask(2)  # evicted; stored again, pushing 3 out (1, 4, 2)
        assert [ask(1), ask(4), ask(2)] == [True, True, True]
        assert not ask(3)
    finally:
        client.close()


def test_each_http_front_has_its_cache_and_statistics_add_up(tmp_path: Path) -> None:
    """--http-workers 2: a request hits the cache of the front that stored it (one
    connection, one front), and the primary reports that front's hits."""
    shutil.copytree(SAMPLE_REPOSITORY / "simple", tmp_path / "simple")
    (tmp_path / "simple" / "config.pbtxt").write_text(
        (SAMPLE_REPOSITORY / "simple" / "config.pbtxt").read_text() + CACHED
    )
    args = ["--cache-config", "local,size=1048576", "--http-workers", "2"]
    proc = ServerProcess(tmp_path, args).wait_ready()
    try:
        with grpcclient.InferenceServerClient(proc.grpc_url) as client:
            inputs, outputs = _simple(grpcclient, _seed())
            answers = [_outputs(client.infer("simple", inputs, outputs=outputs)) for _ in range(3)]
            stats = client.get_inference_statistics("simple").model_stats[0]
        infer = stats.inference_stats
        assert (infer.cache_miss.count, infer.cache_hit.count) == (1, 2)
        assert stats.execution_count == 1 and infer.compute_infer.count == 1
        assert all((a[0] == answers[0][0]).all() for a in answers)
        page = scrape(proc.metrics_url)
        assert page.value("nv_cache_num_hits_per_model", "simple") == 2
    finally:
        assert proc.stop() == 0
