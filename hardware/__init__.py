"""Hardware discovery (CPU, NVIDIA GPUs) and device matching/placement for oipserve."""

from __future__ import annotations

from hardware.fake import FakeInventory
from hardware.inventory import (
    CPU_DEVICE,
    CpuInfo,
    GpuInfo,
    Inventory,
    InventoryError,
    InventorySource,
    count_matching,
    parse_devices,
    resolve_device,
    to_json,
)
from hardware.onnxruntime import cuda_provider_options
from hardware.system import SystemInventory


def make_inventory_source(fake_path: str | None) -> InventorySource:
    """The fake file when one is given (tests, GPU-less dev boxes), else the real machine."""
    return FakeInventory(fake_path) if fake_path else SystemInventory()


__all__ = [
    "CPU_DEVICE",
    "CpuInfo",
    "FakeInventory",
    "GpuInfo",
    "Inventory",
    "InventoryError",
    "InventorySource",
    "SystemInventory",
    "count_matching",
    "cuda_provider_options",
    "make_inventory_source",
    "parse_devices",
    "resolve_device",
    "to_json",
]
