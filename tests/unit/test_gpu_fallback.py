"""A session sent to a GPU that ONNX Runtime put on the CPU is a failed load, as in Triton."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from oipserve.errors import InvalidInput
from oipserve.models.manager import ModelManager
from oipserve.models.placement import gpu_fallback_refusal
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.handle import WorkerHandle
from oipserve.pool.worker_pool import WorkerPool
from oipserve.wire.messages import Loaded

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def test_a_gpu_session_on_the_cpu_is_refused_with_what_to_do() -> None:
    message = gpu_fallback_refusal("simple", "1", "cuda:0", [CUDA, CPU], [CPU])
    assert message == (
        "model 'simple' version 1 on cuda:0: ONNX Runtime could not use the GPU (the session "
        "got CPUExecutionProvider only); install onnxruntime-gpu with CUDA and cuDNN libraries "
        "that match the driver (docs/deploy.md), or serve the model on the CPU (--devices cpu, "
        "or instance_group KIND_CPU)"
    )


@pytest.mark.parametrize(
    ("sent", "got"),
    [
        ([CUDA, CPU], [CUDA, CPU]),  # the GPU works
        ([CPU], [CPU]),  # a CPU worker, or a simulated GPU (fake inventory)
        ([], [CPU]),
    ],
)
def test_sessions_that_got_what_they_were_sent_are_fine(sent: list[str], got: list[str]) -> None:
    assert gpu_fallback_refusal("m", "1", "cuda:0", sent, got) is None


class _Worker:
    """Stands in for a WorkerHandle on cuda:0 whose ONNX Runtime cannot use CUDA."""

    def __init__(self) -> None:
        self.device = "cuda:0"
        self.worker_id = 3
        self.models: dict[str, object] = {}
        self.sent: list[tuple[str, dict[str, str]]] = []
        self.unloaded: list[str] = []

    async def load(
        self,
        key: str,
        path: str,
        providers: list[tuple[str, dict[str, str]]],
        threads: int | None,
        options: dict[str, str],
    ) -> Loaded:
        self.sent = providers
        self.models[key] = object()
        return Loaded(1, key, [], [], [CPU])

    async def unload(self, key: str) -> None:
        self.unloaded.append(key)
        self.models.pop(key, None)


class _Pool:
    def on_replaced(self, callback: Any) -> None:
        pass


def _manager(simulate: bool) -> ModelManager:
    pool = cast(WorkerPool, _Pool())
    return ModelManager(Path("/nonexistent"), pool, ModelRegistry(), simulate)


async def test_place_unloads_the_fallen_back_session_and_fails() -> None:
    model = ModelVersion("simple", "1", "/models/simple/1/model.onnx", None)
    model.key = "simple/1#1"
    worker = _Worker()
    with pytest.raises(InvalidInput, match="version 1 on cuda:0: ONNX Runtime could not use"):
        await _manager(simulate=False).placement.place(model, cast(WorkerHandle, worker), None)
    assert [name for name, _ in worker.sent] == [CUDA, CPU]
    assert worker.unloaded == [model.key] and not worker.models
    assert model.placements == {} and model.providers == {}


async def test_a_simulated_gpu_session_on_the_cpu_is_what_was_asked() -> None:
    model = ModelVersion("simple", "1", "/models/simple/1/model.onnx", None)
    model.key = "simple/1#1"
    worker = _Worker()
    await _manager(simulate=True).placement.place(model, cast(WorkerHandle, worker), None)
    assert [name for name, _ in worker.sent] == [CPU]
    assert worker.unloaded == [] and model.key in worker.models
    assert model.placements[3]["simulated"] is True
