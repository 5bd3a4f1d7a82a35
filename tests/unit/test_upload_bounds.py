"""A load's ``file:`` parameters: counted before anything else, written outside the load lock.

A load of 100,000 files spent 1.7 s of the event loop checking and decoding them and 6 s
writing them while holding the lock every other repository load waits on. Now their
number is bounded (``--max-upload-files``) before any is looked at, and the writer's
thread decodes and writes them before the load takes the lock.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path, PurePosixPath
from typing import Any, cast

import pytest

from oipserve.errors import InvalidInput
from oipserve.management.load_override import parse_load_parameters
from oipserve.models import uploads
from oipserve.models.config.parse import ConfigLimits, parse_model_config_json
from oipserve.models.manager import ModelManager
from oipserve.models.registry import ModelRegistry
from oipserve.models.uploads import UploadArea, UploadError
from oipserve.pool.worker_pool import WorkerPool


def test_more_files_than_the_bound_are_refused_before_any_is_looked_at() -> None:
    parameters: dict[str, object] = {"config": "{}", "file:../outside": "not base64!"}
    parameters |= {f"file:1/f{i}": "AAAA" for i in range(20_000)}
    with pytest.raises(InvalidInput) as caught:
        parse_load_parameters("m", parameters, True, 1000)
    # The bound, not the unsafe path or the text that is not base64: counted first.
    assert str(caught.value) == (
        "failed to load 'm': the load gives 20001 files, more than --max-upload-files 1000 "
        "(the limit)"
    )
    at_bound = {"config": "{}"} | {f"file:1/f{i}": "AAAA" for i in range(1000)}
    assert len(parse_load_parameters("m", at_bound, True, 1000).files) == 1000


def test_base64_is_decoded_step_by_step_into_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uploads, "DECODE_STEP", 8)  # many steps for a small file
    data = bytes(range(256)) * 3 + b"tail!"
    area = UploadArea(tmp_path)
    files: dict[PurePosixPath, bytes | str] = {
        PurePosixPath("1/a.bin"): base64.b64encode(data).decode(),
        PurePosixPath("1/b.bin"): b"raw bytes (gRPC)",
        PurePosixPath("1/empty"): "",
    }
    place = asyncio.run(area.write("m", files))
    assert (place / "m" / "1" / "a.bin").read_bytes() == data
    assert (place / "m" / "1" / "b.bin").read_bytes() == b"raw bytes (gRPC)"
    assert (place / "m" / "1" / "empty").read_bytes() == b""
    area.close()


@pytest.mark.parametrize(
    "text",
    ["not base64!", "AAAA=AAAAAAAAAAA", "AAAAAAAAAAAAAA=", "AAAAAAA\u00e9", "AAAAAAAAAAAAAAA"],
)
def test_text_that_is_not_base64_is_refused_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Padding inside the text, a missing character, a character that is not ASCII: as
    strict as decoding it whole, wherever a step ends."""
    monkeypatch.setattr(uploads, "DECODE_STEP", 8)
    area = UploadArea(tmp_path)
    files: dict[PurePosixPath, bytes | str] = {PurePosixPath("1/model.onnx"): text}
    with pytest.raises(UploadError, match=r"^file parameter 'file:1/model.onnx' is not valid"):
        asyncio.run(area.write("m", files))
    assert area.root is not None and not any(area.root.iterdir())
    area.close()


class _Pool:
    workers: list[Any] = []
    replacing = 0

    def on_replaced(self, callback: Any) -> None:
        pass

    async def replaced(self, timeout: float) -> None:
        pass  # no replacement under way


def _manager(tmp_path: Path) -> ModelManager:
    pool = cast(WorkerPool, _Pool())
    manager = ModelManager(tmp_path / "repository", pool, ModelRegistry(), False)
    manager.uploads = UploadArea(tmp_path)
    return manager


async def test_files_are_written_while_another_load_holds_the_lock(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    config = parse_model_config_json("{}")
    files: dict[PurePosixPath, bytes | str] = {
        PurePosixPath("1/model.onnx"): base64.b64encode(b"x" * 100_000).decode()
    }
    async with manager.lock:  # another model's load, under way
        loading = asyncio.create_task(manager.load("m", config, files))
        for _ in range(500):
            written = list(tmp_path.glob("oipserve-*-uploads-*/*/m/1/model.onnx"))
            if written and written[0].stat().st_size == 100_000:
                break
            await asyncio.sleep(0.01)
        assert written and written[0].read_bytes() == b"x" * 100_000
        assert not loading.done()  # it waits for the lock only now
    reason = await loading
    assert reason == "version 1: no worker process runs to hold it"
    manager.close()


async def test_a_config_past_a_bound_is_refused_before_its_files_are_written(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path)
    manager.config_limits = ConfigLimits(max_priority_levels=2)
    config = parse_model_config_json(
        '{"max_batch_size": 4, "dynamic_batching": '
        '{"priority_levels": 3, "default_priority_level": 1}}'
    )
    files: dict[PurePosixPath, bytes | str] = {PurePosixPath("1/model.onnx"): "AAAA"}
    reason = await manager.load("m", config, files)
    assert reason == (
        "invalid config override: dynamic_batching.priority_levels 3 is more than "
        "--max-priority-levels 2 (the limit)"
    )
    assert manager.uploads.root is None  # nothing was written
