"""The response cache's key, byte bound and LRU order (``oipserve.dataplane.response_cache``),
its flag (``oipserve.config.cache_config``) and its statistics fields, without a server."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from oipserve.config.cache_config import CacheConfigError, cache_bytes
from oipserve.config.settings import SettingsError, load_settings
from oipserve.dataplane.response_cache import (
    ADMIT_AT,
    ENTRY_OVERHEAD,
    TENSOR_OVERHEAD,
    WHOLE,
    Probe,
    ResponseCache,
    answer,
)
from oipserve.models.registry import ModelVersion
from oipserve.request.inference import Inference, InferResult, InputTensor, OutputTensor
from oipserve.runtime.off_loop import nothing_to_release
from oipserve.telemetry.stats import ModelStats
from oipserve.telemetry.stats_report import model_stat


def _model(serial: int = 1) -> ModelVersion:
    model = ModelVersion("m", "1", "", None)
    model.serial = serial
    return model


def _request(
    data: bytes | np.ndarray,
    model: ModelVersion | None = None,
    outputs: list[str] | None = None,
    name: str = "X",
    shape: list[int] | None = None,
    text_outputs: list[str] | None = None,
    classification: dict[str, int] | None = None,
) -> tuple[Inference, list]:
    """An inference of one input and its placements, as ``intake.check`` gives them."""
    raw = data if isinstance(data, np.ndarray) else bytearray(data)
    size = raw.nbytes if isinstance(raw, np.ndarray) else len(raw)
    tensor = InputTensor(name, "UINT8", shape or [size], raw=memoryview(bytearray(b"")))
    inference = Inference(
        model or _model(),
        [tensor],
        outputs if outputs is not None else ["Y"],
        [],
        text_outputs=text_outputs,
        classification=classification,
    )
    placement = (
        tensor,
        tensor.shape,
        size,
        raw if isinstance(raw, np.ndarray) else memoryview(raw),
    )
    return inference, [placement]


def _result(inference: Inference, payload: bytes) -> InferResult:
    out = OutputTensor("Y", "UINT8", [len(payload)], memoryview(bytearray(payload)))
    return InferResult(inference.model, [out], nothing_to_release)


def _tracked(held: object) -> int:
    """How many objects the collector tracks in ``held`` and the tuples it holds."""
    inner = sum(_tracked(item) for item in held) if isinstance(held, tuple) else 0
    return int(gc.is_tracked(held)) + inner


def _run(cache: ResponseCache, data: bytes, stats: ModelStats, **kwargs: object) -> bool:
    """One request through the cache, as a strategy runs it; True for a hit."""
    inference, placements = _request(data, **kwargs)  # type: ignore[arg-type]
    probe = cache.lookup(inference, placements, stats)
    assert isinstance(probe, Probe)
    if probe.entry is not None:
        return True
    cache.store(probe, _result(inference, data[::-1]), stats)
    return False


def test_a_hit_gives_back_the_stored_outputs_in_fresh_tensors() -> None:
    cache, stats = ResponseCache(1 << 20), ModelStats("m", "1")
    assert not _run(cache, b"abc", stats)
    inference, placements = _request(b"abc")
    probe = cache.lookup(inference, placements, stats)
    assert probe is not None and probe.entry is not None
    first, second = answer(probe.entry, inference), answer(probe.entry, inference)
    assert bytes(first.outputs[0].data) == b"cba" and first.outputs[0].shape == [3]
    assert first.outputs[0] is not second.outputs[0]
    assert (stats.cache_hit_count, stats.cache_miss_count) == (1, 1)


def test_a_hit_gives_back_each_output_its_own_bytes_shape_and_kind() -> None:
    """Several outputs stored end to end in one allocation come back apart."""
    cache, stats = ResponseCache(1 << 20), ModelStats("m", "1")
    inference, placements = _request(b"abc", outputs=["Y", "Z", "E"])
    probe = cache.lookup(inference, placements, stats)
    assert probe is not None and probe.entry is None
    outputs = [
        OutputTensor("Y", "UINT8", [3], memoryview(bytearray(b"cba"))),
        OutputTensor("Z", "INT8", [2, 1, 2], memoryview(bytearray(b"wxyz")), text=True),
        OutputTensor("E", "FP32", [0], memoryview(bytearray())),
    ]
    cache.store(probe, InferResult(inference.model, outputs, nothing_to_release), stats)
    inference, placements = _request(b"abc", outputs=["Y", "Z", "E"])
    probe = cache.lookup(inference, placements, stats)
    assert probe is not None and probe.entry is not None
    got = answer(probe.entry, inference).outputs
    assert [(t.name, t.datatype, t.shape, bytes(t.data), t.text) for t in got] == [
        ("Y", "UINT8", [3], b"cba", False),
        ("Z", "INT8", [2, 1, 2], b"wxyz", True),
        ("E", "FP32", [0], b"", False),
    ]


def test_a_stored_answer_leaves_the_collector_two_objects() -> None:
    """PERF: a miss while the cache filled cost 7 µs, 3 of them in the collector walking
    the 9 tuples an entry and its key kept (one per output, per shape...); now the key and
    the entry are one flat tuple each (benchmarks/results/2026-11-28-response-cache.md)."""
    cache, stats = ResponseCache(1 << 20), ModelStats("m", "1")
    enabled = gc.isenabled()
    gc.disable()  # NOTE: a collection would stop tracking the tuples it finds flat
    try:
        inference, placements = _request(b"abc", outputs=["Y", "Z"], shape=[1, 3])
        probe = cache.lookup(inference, placements, stats)
        assert probe is not None and probe.entry is None
        outputs = [
            OutputTensor(name, "UINT8", [1, 3], memoryview(bytearray(b"xyz"))) for name in "YZ"
        ]
        cache.store(probe, InferResult(inference.model, outputs, nothing_to_release), stats)
        inference, placements = _request(b"abc", outputs=["Y", "Z"], shape=[1, 3])
        hit = cache.lookup(inference, placements, stats)
        assert hit is not None and hit.entry is not None
        tracked = _tracked(hit.key) + _tracked(hit.entry)
    finally:
        if enabled:
            gc.enable()
    assert tracked == 2


def test_the_flat_key_keeps_its_lists_apart() -> None:
    """The key lists each part after its length: outputs ["Y", "Z"] asked as binary and
    ["Y"] with "Z" asked as JSON text run the same words together, and must not match."""
    cache, stats = ResponseCache(1 << 20), ModelStats("m", "1")
    assert not _run(cache, b"abc", stats, outputs=["Y", "Z"])
    assert not _run(cache, b"abc", stats, outputs=["Y"], text_outputs=["Z"])
    assert not _run(cache, b"abc", stats, outputs=["Y"], classification={"Z": 1})
    assert not _run(cache, b"abc", stats, shape=[1, 3], name="X")
    assert _run(cache, b"abc", stats, outputs=["Y", "Z"])


@pytest.mark.parametrize(
    "change",
    [
        {"data": b"abd"},  # other bytes
        {"name": "Z"},  # other input name
        {"shape": [1, 3]},  # other shape
        {"outputs": []},  # other requested outputs
        {"text_outputs": ["Y"]},  # binary_data false: the worker returns JSON text
        {"classification": {"Y": 2}},  # classes asked for
        {"model": _model(serial=2)},  # another version (or a reload)
    ],
)
def test_everything_in_the_key_makes_a_miss(change: dict[str, object]) -> None:
    cache, stats = ResponseCache(1 << 20), ModelStats("m", "1")
    _run(cache, b"abc", stats)
    data = change.pop("data", b"abc")
    assert not _run(cache, data, stats, **change)  # type: ignore[arg-type]
    assert _run(cache, b"abc", stats)


def test_json_values_and_bytes_share_a_key() -> None:
    """Inputs enter the key as the bytes the model gets, however they were sent."""
    cache, stats = ResponseCache(1 << 20), ModelStats("m", "1")
    values = np.arange(4, dtype=np.uint8)
    inference, placements = _request(values)
    probe = cache.lookup(inference, placements, stats)
    assert probe is not None and probe.entry is None
    cache.store(probe, _result(inference, b"out"), stats)
    assert _run(cache, values.tobytes(), stats)


def test_large_inputs_are_sampled_and_compared_whole() -> None:
    """A byte the samples miss still makes a miss: the entry keeps the whole input."""
    cache, stats = ResponseCache(1 << 22), ModelStats("m", "1")
    data = bytes(range(256)) * 400  # 100 KiB: sampled, and past ADMIT_AT: stored at 2nd miss
    assert len(data) > WHOLE and 2 * len(data) > ADMIT_AT
    assert not _run(cache, data, stats) and not _run(cache, data, stats)
    assert _run(cache, data, stats)
    changed = bytearray(data)
    changed[50_001] ^= 0xFF
    inference, placements = _request(bytes(changed))
    probe = cache.lookup(inference, placements, stats)
    assert probe is not None and probe.entry is None


def test_large_inputs_are_copied_at_the_lookup() -> None:
    """Their segment may hold another request's inputs by the time the answer is stored."""
    cache, stats = ResponseCache(1 << 22), ModelStats("m", "1")
    data = bytearray(b"q" * 10_000)
    inference, placements = _request(bytes(data))
    tensor = placements[0][0]
    placements[0] = (tensor, tensor.shape, len(data), memoryview(data))
    probe = cache.lookup(inference, placements, stats)
    assert probe is not None and probe.whole == (bytes(data),)
    data[5000] = 0  # the segment reused by another request before the answer came
    cache.store(probe, _result(inference, b"out"), stats)
    assert _run(cache, b"q" * 10_000, stats)


def test_a_small_request_is_stored_at_once_a_large_one_at_its_second_miss() -> None:
    cache, stats = ResponseCache(1 << 22), ModelStats("m", "1")
    assert not _run(cache, b"x" * 100, stats) and _run(cache, b"x" * 100, stats)
    large = b"y" * ADMIT_AT
    assert [_run(cache, large, stats) for _ in range(3)] == [False, False, True]


def test_bounded_by_bytes_least_recently_used_out_first() -> None:
    # key (the input, whole) and output of 1000 bytes each
    entry = ENTRY_OVERHEAD + 2 * (TENSOR_OVERHEAD + 1000)
    cache, stats = ResponseCache(3 * entry), ModelStats("m", "1")
    a, b, c, d = (bytes([i]) * 1000 for i in range(4))
    for data in (a, b, c):
        assert not _run(cache, data, stats)
    assert cache.used == 3 * entry and len(cache) == 3
    assert _run(cache, a, stats)  # order: b, c, a
    assert not _run(cache, d, stats)  # b goes
    assert cache.used == 3 * entry and len(cache) == 3
    assert [_run(cache, x, stats) for x in (c, a, d)] == [True, True, True]
    assert not _run(cache, b, stats)  # c goes (least recently used)
    assert not _run(cache, c, stats)


def test_an_answer_larger_than_the_cache_is_not_stored() -> None:
    cache, stats = ResponseCache(1600), ModelStats("m", "1")
    assert not _run(cache, b"z" * 600, stats) and not _run(cache, b"z" * 600, stats)
    assert len(cache) == 0 and cache.used == 0


def test_forget_drops_the_entries_of_gone_versions() -> None:
    cache, stats = ResponseCache(1 << 20), ModelStats("m", "1")
    _run(cache, b"abc", stats, model=_model(serial=7))
    _run(cache, b"abc", stats, model=_model(serial=8))
    cache.forget({7})
    assert len(cache) == 1 and cache.used == ENTRY_OVERHEAD + 2 * TENSOR_OVERHEAD + 6


def test_requests_with_output_regions_are_not_cacheable() -> None:
    cache, stats = ResponseCache(1 << 20), ModelStats("m", "1")
    inference, placements = _request(b"abc")
    inference.into_regions = {"Y": object()}  # type: ignore[dict-item]
    assert cache.lookup(inference, placements, stats) is None
    assert (stats.cache_hit_count, stats.cache_miss_count) == (0, 0)


def test_statistics_count_hits_as_successes_without_compute() -> None:
    stats = ModelStats("m", "1")
    stats.request_succeeded(1, 1000, 10, 20, 30, 40)
    stats.cache_miss_count, stats.cache_miss_ns = 1, 5
    stats.cache_hit_count, stats.cache_hit_ns = 1, 7
    stats.answered_from_cache(900)
    report = model_stat(stats)
    infer = report["inference_stats"]
    assert infer["success"] == {"count": 2, "ns": 1900}  # type: ignore[index]
    assert infer["queue"]["count"] == 2  # type: ignore[index]
    assert infer["compute_infer"] == {"count": 1, "ns": 30}  # type: ignore[index]
    assert infer["cache_hit"] == {"count": 1, "ns": 7}  # type: ignore[index]
    assert infer["cache_miss"] == {"count": 1, "ns": 5}  # type: ignore[index]
    assert report["inference_count"] == 1 and report["execution_count"] == 0
    # --http-workers: another front's row adds its cache counts in.
    total = ModelStats("m", "1")
    total.add(stats.row(1))
    assert (total.cache_hit_count, total.cache_miss_ns) == (1, 5)


@pytest.mark.parametrize(
    ("items", "size"),
    [([], 0), (["local,size=1048576"], 1 << 20), (["local,size=1", "local,size=2"], 2)],
)
def test_cache_config(items: list[str], size: int) -> None:
    assert cache_bytes(items) == size


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ("redis,host=localhost", "only the 'local' cache"),
        ("local,bytes=10", "one key, size=BYTES"),
        ("local", "one key, size=BYTES"),
        ("local,size=ten", "a number of bytes"),
        ("local,size=0", "size must be 1 to"),
    ],
)
def test_cache_config_refused(item: str, reason: str) -> None:
    with pytest.raises(CacheConfigError, match=reason):
        cache_bytes([item])


def test_the_flag_and_its_environment_variable() -> None:
    argv = ["serve", "--model-repository", "m", "--cache-config", "local,size=4096"]
    assert load_settings(argv, {})[1].cache_config == ("local,size=4096",)
    env = {"OIPSERVE_CACHE_CONFIG": "local,size=1;local,size=2"}
    settings = load_settings(["serve", "--model-repository", "m"], env)[1]
    assert cache_bytes(settings.cache_config) == 2
    assert load_settings(["serve", "--model-repository", "m"], {})[1].cache_config == ()
    with pytest.raises(SettingsError, match="--cache-config .*only the 'local' cache"):
        load_settings(["serve", "--model-repository", "m", "--cache-config", "redis,port=1"], {})
