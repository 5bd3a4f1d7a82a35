"""Hardware inventory types and the rules that match and place work on devices.

Everything here is pure: it takes an `Inventory` snapshot and answers questions about it,
so the same rules apply to the real machine (`hardware.system`) and to a fake one
(`hardware.fake`) used by tests and by development boxes without GPUs.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import msgspec

CPU_DEVICE = "cpu"
_CUDA_ID = re.compile(r"cuda:(\d+)")
_GPU_WORDS = frozenset({"gpu", "cuda"})
_NVIDIA_PREFIX = "nvidia "


class InventoryError(ValueError):
    """A device request or an inventory file that cannot be honoured; the message says why."""


class CpuInfo(msgspec.Struct, frozen=True):
    """Host CPU and RAM; memory figures are bytes."""

    model_name: str
    physical_cores: int
    logical_cores: int
    memory_total: int
    memory_available: int
    #: CPUs this process may use: its affinity mask capped by its cgroup's CPU quota
    #: (``hardware.cpus``); what CPU workers' default threads are sized from.
    usable_cores: int


class GpuInfo(msgspec.Struct, frozen=True):
    """One GPU as NVML numbers it; memory in bytes, utilization in percent (None if unknown)."""

    index: int
    name: str
    uuid: str
    memory_total: int
    memory_free: int
    utilization: int | None
    driver_version: str
    cuda_version: str

    @property
    def device_id(self) -> str:
        """Device id used by --devices, placement and /v2/hardware ("cuda:N")."""
        return f"cuda:{self.index}"


class Inventory(msgspec.Struct, frozen=True):
    """One snapshot of the machine.

    `gpu_note` is for the start-up log: why GPU discovery found nothing, or where fake GPUs
    came from; empty when NVML found GPUs. `simulate_gpu_sessions` is True for a fake
    inventory's GPUs (`hardware.fake`, `gpu_sessions: "simulated"`): they do not exist, so
    sessions planned on them are given the CPU provider only.
    """

    cpu: CpuInfo
    gpus: tuple[GpuInfo, ...] = ()
    gpu_note: str = ""
    simulate_gpu_sessions: bool = False

    @property
    def device_ids(self) -> tuple[str, ...]:
        """Every device id, "cpu" first, then GPUs in index order."""
        return (CPU_DEVICE, *(gpu.device_id for gpu in self.gpus))

    def gpu(self, index: int) -> GpuInfo | None:
        """The GPU with this index, or None; indices need not be contiguous in fakes."""
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None


class InventorySource(Protocol):
    """Where inventories come from; read() is called at start and again to refresh numbers."""

    def read(self) -> Inventory: ...


def _cuda_index(name: str) -> int | None:
    """The N of a "cuda:N" id (already lower-cased), or None if it is not one."""
    match = _CUDA_ID.fullmatch(name)
    return int(match.group(1)) if match else None


def _names_gpu(gpu_name: str, wanted: str) -> bool:
    """Case-insensitive product-name match, with or without the leading "NVIDIA "."""
    full = gpu_name.strip().casefold()
    short = full[len(_NVIDIA_PREFIX) :] if full.startswith(_NVIDIA_PREFIX) else full
    return wanted in (full, short)


def count_matching(inv: Inventory, name: str) -> int:
    """How many units named `name` exist, for `POST /v2/hardware {"name", "num"}`.

    The name is stripped and compared case-insensitively:
    - "" → 0 (as in amdinfer v0.3+, an empty name never matches);
    - "cpu" → logical cores;
    - "gpu" or "cuda" → number of GPUs;
    - "cuda:N" → 1 if GPU N exists, else 0;
    - anything else is a GPU product name and counts the GPUs whose name equals it exactly,
      either in full ("NVIDIA H100 80GB HBM3") or without the leading "NVIDIA " ("H100 80GB
      HBM3"). Prefixes such as "H100" do not match, so a test asking for a model gets it.
    """
    wanted = name.strip().casefold()
    if not wanted:
        return 0
    if wanted == CPU_DEVICE:
        return inv.cpu.logical_cores
    if wanted in _GPU_WORDS:
        return len(inv.gpus)
    index = _cuda_index(wanted)
    if index is not None:
        return 1 if inv.gpu(index) is not None else 0
    return sum(1 for gpu in inv.gpus if _names_gpu(gpu.name, wanted))


def _available(inv: Inventory) -> str:
    """The "what exists" part of error messages."""
    return ", ".join(inv.device_ids)


def _existing_device(inv: Inventory, item: str, what: str) -> str:
    """Canonical id for "cpu" or an existing "cuda:N"; InventoryError otherwise."""
    if item == CPU_DEVICE:
        return CPU_DEVICE
    index = _cuda_index(item)
    if index is None:
        raise InventoryError(
            f"unknown device {item!r} in {what}; expected 'cpu' or 'cuda:N' "
            f"(available: {_available(inv)})"
        )
    gpu = inv.gpu(index)
    if gpu is None:
        raise InventoryError(
            f"device {item!r} in {what} does not exist on this machine "
            f"(available: {_available(inv)})"
        )
    return gpu.device_id


def parse_devices(inv: Inventory, spec: str) -> tuple[str, ...]:
    """Devices the server may use, from the --devices flag.

    "auto" → every GPU, or ("cpu",) if there is none; otherwise a comma list of "cpu" and
    existing "cuda:N" ids, kept in the given order. Empty items, duplicates, unknown or
    absent devices raise InventoryError, so a typo fails at start rather than at first load.
    """
    text = spec.strip().lower()
    if text == "auto":
        return tuple(gpu.device_id for gpu in inv.gpus) or (CPU_DEVICE,)
    what = f"--devices {spec!r}"
    devices: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise InventoryError(f"empty device in {what} (available: {_available(inv)})")
        if item == "auto":
            raise InventoryError(f"'auto' cannot be combined with other devices in {what}")
        device = _existing_device(inv, item, what)
        if device in devices:
            raise InventoryError(f"device {device!r} is listed twice in {what}")
        devices.append(device)
    return tuple(devices)


def _roomiest_gpu(inv: Inventory) -> GpuInfo | None:
    """GPU with the most free memory; ties go to the lowest index so placement is stable."""
    if not inv.gpus:
        return None
    return min(inv.gpus, key=lambda gpu: (-gpu.memory_free, gpu.index))


def resolve_device(inv: Inventory, spec: str) -> str:
    """The one device a placement request names.

    "cpu"; "cuda:N" (must exist); "gpu"/"cuda" → the GPU with the most free memory (error if
    there is none); "auto" → that GPU, or "cpu" on a machine without GPUs.
    """
    item = spec.strip().lower()
    what = f"device request {spec!r}"
    if item == "auto" or item in _GPU_WORDS:
        gpu = _roomiest_gpu(inv)
        if gpu is not None:
            return gpu.device_id
        if item == "auto":
            return CPU_DEVICE
        note = f": {inv.gpu_note}" if inv.gpu_note else ""
        raise InventoryError(f"{what} needs a GPU but this machine has none{note}")
    return _existing_device(inv, item, what)


def to_json(inv: Inventory) -> dict[str, Any]:
    """Plain JSON-able view for `GET /v2/hardware`.

    Devices are keyed by their id ("cpu", "cuda:0", ...) so the server can add per-device
    workers, models and memory in use under the same key.
    """
    devices: dict[str, dict[str, Any]] = {
        CPU_DEVICE: {"id": CPU_DEVICE, "kind": "cpu", **msgspec.to_builtins(inv.cpu)},
    }
    for gpu in inv.gpus:
        devices[gpu.device_id] = {"id": gpu.device_id, "kind": "gpu", **msgspec.to_builtins(gpu)}
    return {"devices": devices, "gpu_note": inv.gpu_note}
