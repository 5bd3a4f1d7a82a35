"""Real hardware discovery: CPU and RAM via psutil, NVIDIA GPUs via NVML (pynvml).

GPUs come only from NVML: onnxruntime-gpu lists the CUDA provider even on machines without
a GPU, so it says nothing about the devices present. Any NVML failure (NVMLError, or OSError
from a broken libnvidia-ml) means "no GPUs" plus a note for the log, never an exception, so a
CPU-only node still starts; other exceptions are bugs and propagate.

NVML numbers GPUs in PCI bus order and ignores CUDA_VISIBLE_DEVICES; CUDA uses the same
order only with CUDA_DEVICE_ORDER=PCI_BUS_ID and no CUDA_VISIBLE_DEVICES remapping.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import psutil

from hardware.cpus import usable_cpus
from hardware.inventory import CpuInfo, GpuInfo, Inventory

_CPUINFO = Path("/proc/cpuinfo")


def _cpu_model_name() -> str:
    """First "model name" in /proc/cpuinfo; platform's answer where Linux gives none (ARM)."""
    try:
        with _CPUINFO.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def read_cpu() -> CpuInfo:
    """Current CPU facts; psutil may not know the physical core count, then use logical."""
    logical = psutil.cpu_count(logical=True) or 1
    physical = psutil.cpu_count(logical=False) or logical
    memory = psutil.virtual_memory()
    return CpuInfo(
        model_name=_cpu_model_name(),
        physical_cores=physical,
        logical_cores=logical,
        memory_total=int(memory.total),
        memory_available=int(memory.available),
        usable_cores=min(logical, usable_cpus()),
    )


def _text(value: str | bytes) -> str:
    """pynvml returned bytes before 11.5 and str after."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def format_cuda_version(version: int) -> str:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _utilization(nvml: Any, handle: Any) -> int | None:
    """GPU utilisation percent; None where the device does not report it (e.g. MIG)."""
    try:
        return int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:
        return None


def _read_gpus(nvml: Any) -> tuple[GpuInfo, ...]:
    """Every GPU NVML sees; NVML must already be initialised."""
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    cuda = format_cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
    gpus: list[GpuInfo] = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        gpus.append(
            GpuInfo(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                memory_total=int(memory.total),
                memory_free=int(memory.free),
                utilization=_utilization(nvml, handle),
                driver_version=driver,
                cuda_version=cuda,
            )
        )
    return tuple(gpus)


def read_gpus() -> tuple[tuple[GpuInfo, ...], str]:
    """(GPUs, note). NVML is initialised and shut down per call, so nothing stays open."""
    try:
        import pynvml
    except ImportError as exc:
        return (), f"pynvml not importable: {exc}"
    # Only NVML's own failures mean "no GPUs"; anything else is a bug here and must show.
    # pynvml reports a missing libnvidia-ml or a missing symbol as NVMLError, but a call
    # into a broken library can still surface from ctypes as OSError, so init accepts both.
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        return (), f"NVML unavailable: {exc}"
    try:
        gpus = _read_gpus(pynvml)
    except pynvml.NVMLError as exc:
        return (), f"NVML query failed: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:  # a failed shutdown must not hide the answer we already have
            pass
    return gpus, "" if gpus else "NVML found no GPUs"


class SystemInventory:
    """InventorySource for the machine the server runs on."""

    def read(self) -> Inventory:
        """Fresh snapshot; memory and utilisation numbers change between calls."""
        gpus, note = read_gpus()
        return Inventory(cpu=read_cpu(), gpus=gpus, gpu_note=note)
