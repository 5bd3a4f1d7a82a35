"""Fake inventory read from a JSON file, so GPU placement can be exercised without GPUs.

File shape (every field optional; unknown fields are rejected to catch typos):

    {"cpu": {"model_name": "...", "physical_cores": 8, "logical_cores": 16,
             "memory_total": 68719476736, "memory_available": 60000000000,
             "usable_cores": 4},
     "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...",
               "memory_total": 85899345920, "memory_free": 80000000000, "utilization": 0,
               "driver_version": "550.54.15", "cuda_version": "12.4"}],
     "gpu_sessions": "simulated"}

`gpu_sessions` says what the front does with a session planned on a fake GPU:
"simulated" (the default) sends the worker only CPUExecutionProvider, so the session
runs on the CPU while the planned CUDA providers are recorded; "real" sends the planned
CUDA providers to the real ONNX Runtime, as on a GPU node. On a machine without a usable
GPU, ONNX Runtime then falls back to the CPU and the load fails as it would on a GPU node
whose CUDA provider cannot start (tests of that failure).

Missing CPU fields come from the real machine. Missing GPU fields: index = position,
uuid = "GPU-fake-<index>", name = "NVIDIA Fake GPU", memory_total = memory_free or 16 GiB,
memory_free = memory_total, utilization = 0, driver_version = cuda_version = "fake".
The file is re-read on every read(), so tests can change free memory between calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec

from hardware.inventory import CpuInfo, GpuInfo, Inventory, InventoryError
from hardware.system import read_cpu

_Count = Annotated[int, msgspec.Meta(ge=1)]
_Bytes = Annotated[int, msgspec.Meta(ge=0)]
_Index = Annotated[int, msgspec.Meta(ge=0)]
_Percent = Annotated[int, msgspec.Meta(ge=0, le=100)]
_DEFAULT_GPU_MEMORY = 16 * 1024**3
T = TypeVar("T")


class _CpuSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model_name: str | None = None
    physical_cores: _Count | None = None
    logical_cores: _Count | None = None
    usable_cores: _Count | None = None
    memory_total: _Bytes | None = None
    memory_available: _Bytes | None = None


class _GpuSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    index: _Index | None = None
    name: str | None = None
    uuid: str | None = None
    memory_total: _Bytes | None = None
    memory_free: _Bytes | None = None
    utilization: _Percent | None = None
    driver_version: str | None = None
    cuda_version: str | None = None


class _FileSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cpu: _CpuSpec = _CpuSpec()
    gpus: list[_GpuSpec] = []
    gpu_sessions: Literal["simulated", "real"] = "simulated"


def _or(value: T | None, default: T) -> T:
    """The given value, or the default where the file left it out."""
    return default if value is None else value


def _cpu(path: Path, spec: _CpuSpec) -> CpuInfo:
    """Overrides on top of the real CPU; the real one is read only if something is missing.

    A file that gives ``logical_cores`` but not ``usable_cores`` describes a node without
    a CPU quota: all its cores are usable.
    """
    overrides = {k: v for k, v in msgspec.structs.asdict(spec).items() if v is not None}
    if "logical_cores" in overrides:
        overrides.setdefault("usable_cores", overrides["logical_cores"])
    if len(overrides) == len(spec.__struct_fields__):
        cpu = CpuInfo(**overrides)
    else:
        cpu = msgspec.structs.replace(read_cpu(), **overrides)
    if cpu.usable_cores > cpu.logical_cores:
        raise InventoryError(
            f"{path}: cpu.usable_cores ({cpu.usable_cores}) exceeds logical_cores "
            f"({cpu.logical_cores})"
        )
    return cpu


def _gpus(path: Path, specs: list[_GpuSpec]) -> tuple[GpuInfo, ...]:
    """GPUs with defaults filled in; indices must be unique and free memory fit the total."""
    gpus: list[GpuInfo] = []
    seen: set[int] = set()
    for position, spec in enumerate(specs):
        where = f"{path}: gpus[{position}]"
        index = position if spec.index is None else spec.index
        if index in seen:
            raise InventoryError(f"{where}.index {index} is used by another GPU")
        seen.add(index)
        total = spec.memory_total
        if total is None:
            total = _DEFAULT_GPU_MEMORY if spec.memory_free is None else spec.memory_free
        free = total if spec.memory_free is None else spec.memory_free
        if free > total:
            raise InventoryError(f"{where}.memory_free ({free}) exceeds memory_total ({total})")
        gpus.append(
            GpuInfo(
                index=index,
                name=_or(spec.name, "NVIDIA Fake GPU"),
                uuid=_or(spec.uuid, f"GPU-fake-{index}"),
                memory_total=total,
                memory_free=free,
                utilization=_or(spec.utilization, 0),
                driver_version=_or(spec.driver_version, "fake"),
                cuda_version=_or(spec.cuda_version, "fake"),
            )
        )
    return tuple(sorted(gpus, key=lambda gpu: gpu.index))


class FakeInventory:
    """InventorySource backed by a JSON file (see module docstring for the format)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> Inventory:
        """Parse the file afresh; any problem is an InventoryError naming file and field."""
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise InventoryError(f"cannot read fake inventory {self.path}: {exc}") from exc
        try:
            spec = msgspec.json.decode(raw, type=_FileSpec)
        except msgspec.ValidationError as exc:
            raise InventoryError(f"invalid fake inventory {self.path}: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise InventoryError(f"fake inventory {self.path} is not valid JSON: {exc}") from exc
        return Inventory(
            cpu=_cpu(self.path, spec.cpu),
            gpus=_gpus(self.path, spec.gpus),
            gpu_note=f"fake inventory from {self.path}",
            simulate_gpu_sessions=spec.gpu_sessions == "simulated",
        )
