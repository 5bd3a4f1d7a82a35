"""Configuration numbers that size nothing ahead of requests, and the bounds on them.

``priority_levels`` was a queue and a policy per level, made at load and at the first
request: 10^9 levels took 55 s and 7.7 GB. The levels are now kept only while they hold
requests, the policies only where a level has its own; ``check_limits`` bounds the number.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import uvloop
from google.protobuf import text_format

from oipserve.grpc_generated import model_config_pb2 as mc
from oipserve.models import repository
from oipserve.models.config.parse import (
    CONFIG_MAX_BYTES,
    ConfigLimits,
    ModelConfigError,
    check_limits,
    parse_model_config,
    parse_model_config_json,
    read_model_config,
)
from oipserve.models.repository import with_labels
from oipserve.scheduling.policy import BatchPolicy, QueuePolicy, batch_policy
from oipserve.scheduling.scheduler import DynamicBatcher, Entry
from oipserve.wire.images import ImageError, ImageSpec
from tests.support.batcher_calls import submit
from workers.images import decode_batch

#: Levels many enough that one object per level would show (the eager batcher took
#: ~1.3 KB a level: 260 MB), few enough not to hurt a machine running the old code.
LEVELS = 200_000


def _allocated(make: Any) -> tuple[Any, int]:
    """What ``make()`` returns, and the bytes it allocated at its peak."""
    tracemalloc.start()
    try:
        result = make()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_policy_keeps_no_copy_per_level() -> None:
    text = f"""priority_levels: {LEVELS} default_priority_level: {LEVELS}
        default_queue_policy {{ max_queue_size: 3 }}
        priority_queue_policy {{ key: 7 value {{ max_queue_size: 1 }} }}"""
    message = text_format.Parse(text, mc.ModelDynamicBatching())
    started = time.monotonic()
    policy, peak = _allocated(lambda: batch_policy(message, 8, "m"))
    assert time.monotonic() - started < 1.0 and peak < 100_000
    assert policy.priority_levels == LEVELS and policy.level(0) == LEVELS
    assert policy.policy(7) == QueuePolicy(max_queue_size=1)
    assert policy.policy(LEVELS) == policy.policy(1) == QueuePolicy(max_queue_size=3)
    assert policy.level_policies == {7: QueuePolicy(max_queue_size=1)}


class _Instance:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = asyncio.Event()


async def _serve_levels() -> tuple[list[list[str]], int, int]:
    instance = _Instance()

    async def execute(entries: list[Entry], _: Any) -> list[str]:
        instance.batches.append([e.request for e in entries])
        await instance.gate.wait()
        return [f"done {e.request}" for e in entries]

    policy = BatchPolicy(max_batch_size=1, priority_levels=LEVELS, default_priority_level=LEVELS)
    batcher, made = _allocated(lambda: DynamicBatcher("m", policy, lambda: [instance], execute, id))
    first = submit(batcher, "busy", 1, "s", 0, 0)
    for _ in range(5):
        await asyncio.sleep(0)
    # Queued behind the busy instance, each at a level of its own, the highest last.
    futures = [submit(batcher, name, 1, "s", level, 0) for name, level in
               (("low", 0), ("mid", LEVELS // 2), ("top", 1), ("mid2", LEVELS // 2))]  # fmt: skip
    held = len(batcher._levels)
    for _ in range(len(futures) + 1):
        instance.gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
    results = await asyncio.gather(first, *futures)
    assert results == ["done busy", "done low", "done mid", "done top", "done mid2"]
    assert not batcher._levels  # every level is gone with its last request
    batcher.close()
    return instance.batches, made, held


def test_the_batcher_makes_a_queue_only_for_levels_that_hold_requests() -> None:
    batches, made, held = uvloop.run(_serve_levels())
    assert made < 200_000, f"a batcher of {LEVELS} levels took {made} bytes"
    assert held == 3  # "mid" and "mid2" share theirs
    assert batches == [["busy"], ["top"], ["mid"], ["mid2"], ["low"]]


def test_the_bound_on_priority_levels_names_its_flag() -> None:
    limits = ConfigLimits(max_priority_levels=4)
    at_bound = parse_model_config(
        "max_batch_size: 2 dynamic_batching { priority_levels: 4 default_priority_level: 4 }"
    )
    check_limits(at_bound, limits)
    check_limits(parse_model_config("max_batch_size: 2"), limits)
    past = parse_model_config_json(
        '{"max_batch_size": 2, "dynamic_batching": '
        '{"priority_levels": "18446744073709551615", "default_priority_level": 1}}'
    )
    with pytest.raises(ModelConfigError) as caught:
        check_limits(past, limits)
    assert str(caught.value) == (
        "dynamic_batching.priority_levels 18446744073709551615 is more than "
        "--max-priority-levels 4 (the limit)"
    )
    assert ConfigLimits().max_priority_levels == 1000


def test_a_configuration_longer_than_the_bound_is_not_parsed(tmp_path: Path) -> None:
    padding = " " * CONFIG_MAX_BYTES
    with pytest.raises(ModelConfigError, match=f"longer than {CONFIG_MAX_BYTES} characters"):
        parse_model_config_json("{" + padding + "}")
    with pytest.raises(ModelConfigError, match=f"longer than {CONFIG_MAX_BYTES} characters"):
        parse_model_config("max_batch_size: 1" + padding)
    path = tmp_path / "config.pbtxt"
    path.write_text("max_batch_size: 1\n" + "#" * CONFIG_MAX_BYTES)
    with pytest.raises(ModelConfigError, match=f"{path}: .* longer than {CONFIG_MAX_BYTES} bytes"):
        read_model_config(path)
    # Just under it: parsed as usual.
    assert parse_model_config_json("{" + padding[:-2] + "}").max_batch_size == 0


def test_a_label_file_named_by_many_outputs_is_read_once(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    outputs = ", ".join(
        f'{{ name: "o{i}" data_type: TYPE_FP32 dims: [2] label_filename: "labels.txt" }}'
        for i in range(1000)
    )
    config = parse_model_config(f"output [ {outputs} ]")
    labelled = with_labels(config, tmp_path, "config.pbtxt")
    assert all(o.labels == ("cat", "dog") for o in labelled.outputs)
    assert labelled.outputs[0].labels is labelled.outputs[999].labels  # one tuple, one read


def test_the_label_files_of_one_model_are_bounded_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repository, "LABELS_MAX_BYTES", 10)
    (tmp_path / "a").write_text("abcd\nefgh\n")  # 9 characters
    (tmp_path / "b").write_text("ij\n")
    one = parse_model_config('output [ { name: "x" data_type: TYPE_FP32 label_filename: "a" } ]')
    assert with_labels(one, tmp_path, "config.pbtxt").outputs[0].labels == ("abcd", "efgh")
    two = parse_model_config(
        'output [ { name: "x" data_type: TYPE_FP32 label_filename: "a" }, '
        '{ name: "y" data_type: TYPE_FP32 label_filename: "b" } ]'
    )
    with pytest.raises(ValueError, match="label files of its outputs hold more than 10"):
        with_labels(two, tmp_path, "config.pbtxt")


def _png(height: int, width: int) -> bytes:
    ok, data = cv2.imencode(".png", np.zeros((height, width, 3), np.uint8))
    assert ok
    return data.tobytes()


def test_the_fixed_size_images_are_resized_to_is_bounded_like_an_image() -> None:
    """A configuration's dims set the size a 4x4 PNG is resized to: 9000x9000 FP32 took
    the worker ~1 GB; 50000x50000 would take 30 GB."""
    small = _png(4, 4)
    limits = {"max_pixels": 100, "max_request_pixels": 150}
    spec = ImageSpec("NHWC", 10, 10, 3, "float32")
    assert decode_batch("image", [small], spec, **limits).shape == (1, 10, 10, 3)
    with pytest.raises(ImageError, match="200 pixels for 2 images, more than the limit of 150"):
        decode_batch("image", [small, small], spec, **limits)
    with pytest.raises(ImageError, match="11x10 .* more than the limit of 100 pixels$"):
        decode_batch("image", [small], ImageSpec("NHWC", 11, 10, 3, "float32"), **limits)
    huge = ImageSpec("NCHW", 50_000, 50_000, 3, "float32")
    with pytest.raises(ImageError, match="50000x50000"):
        decode_batch("image", [small], huge)
