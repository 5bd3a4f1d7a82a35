"""Bounds on every number a client may send to ``POST /v2/workers/{worker}/load``.

Each number in a load request buys something real: ``instances`` are worker processes,
``intra_op_threads`` are OS threads in one of them, ``gpu_mem_limit`` is device memory.
Unchecked, one request (``intra_op_threads: 100000``) left a worker with 32,000 threads and
16 GB of memory and the machine unable to fork. So every such number is checked against
two bounds before anything is started: what this node has (logical cores, the chosen
device's memory, from the hardware inventory) and an operator's maximum (a flag). The
first one crossed is named in the 400, with the flag that sets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hardware import CPU_DEVICE, Inventory
from oipserve.config.settings import Settings
from oipserve.errors import InvalidInput

#: Parameters that become OS threads of one session.
THREAD_KEYS = ("intra_op_threads", "inter_op_threads")


@dataclass(frozen=True)
class LoadLimits:
    """The operator's maxima for worker loads and repository loads (flags of ``serve``)."""

    #: Most instances (worker sessions) one endpoint may have: at its first load or
    #: grown one at a time by ``share: false``.
    max_instances_per_endpoint: int = 16
    #: Most threads one session may ask for (also never more than the logical cores).
    max_threads_per_session: int = 64
    #: Largest ``batch_size`` an endpoint may accept.
    max_endpoint_batch_size: int = 65536
    #: Seconds one load may take (worker start + session creation) before it is undone.
    load_timeout: float = 180.0
    #: Most ``file:`` parameters of one repository load.
    max_upload_files: int = 1000
    #: Whether the repository API may load and unload models: False with
    #: ``--model-control-mode none``, which operators use as a lock (Triton's rule).
    repository_control: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> LoadLimits:
        """The limits among the server's settings."""
        return cls(
            max_instances_per_endpoint=settings.max_instances_per_endpoint,
            max_threads_per_session=settings.max_threads_per_session,
            max_endpoint_batch_size=settings.max_endpoint_batch_size,
            load_timeout=settings.load_timeout,
            max_upload_files=settings.max_upload_files,
            repository_control=settings.model_control_mode == "explicit",
        )


def _refuse(name: str, value: object, bound: str) -> InvalidInput:
    return InvalidInput(f"{name} {value} is more than {bound} (the limit)")


def check_instances(
    total: int, device: str, inventory: Inventory | None, limits: LoadLimits
) -> None:
    """400 if an endpoint would have ``total`` instances, more than allowed on ``device``.

    On the CPU each instance is a worker process with at least one thread, so more
    instances than logical cores only time-share; on a GPU only the flag bounds them.
    ``inventory`` is None for echo endpoints, which start no process.
    """
    flag = limits.max_instances_per_endpoint
    if total > flag:
        raise _refuse("instances", total, f"--max-instances-per-endpoint {flag}")
    if inventory is not None and device == CPU_DEVICE:
        cores = inventory.cpu.logical_cores
        if total > cores:
            raise _refuse("instances", total, f"this node's {cores} logical cores")


def check_numbers(
    params: Mapping[str, object],
    device: str,
    inventory: Inventory,
    cuda_options: Mapping[str, str],
    limits: LoadLimits,
) -> None:
    """400 naming the bound for any thread count, batch size or memory limit beyond it.

    ``params`` have passed the type checks of ``worker_params`` (positive integers where
    integers are meant); ``cuda_options`` are the validated CUDA provider options.
    """
    cores = inventory.cpu.logical_cores
    for key in THREAD_KEYS:
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            if value > cores:
                raise _refuse(key, value, f"this node's {cores} logical cores")
            if value > limits.max_threads_per_session:
                raise _refuse(
                    key, value, f"--max-threads-per-session {limits.max_threads_per_session}"
                )
    batch = params.get("batch_size")
    if isinstance(batch, int) and batch > limits.max_endpoint_batch_size:
        raise _refuse(
            "batch_size", batch, f"--max-endpoint-batch-size {limits.max_endpoint_batch_size}"
        )
    if "gpu_mem_limit" in cuda_options:
        limit = int(cuda_options["gpu_mem_limit"])
        memory, what = device_memory(device, inventory)
        if limit > memory:
            raise _refuse("gpu_mem_limit", limit, f"{what} ({memory} bytes)")


def device_memory(device: str, inventory: Inventory) -> tuple[int, str]:
    """(bytes, words) of the memory a ``gpu_mem_limit`` for ``device`` may not exceed.

    The chosen GPU's total memory. On the CPU the option has no effect, but it is still
    bounded (a client's typo should not pass silently): by the largest GPU, or by the
    node's memory on a machine without GPUs.
    """
    for gpu in inventory.gpus:
        if gpu.device_id == device:
            return gpu.memory_total, f"the memory of {device}"
    if inventory.gpus:
        largest = max(inventory.gpus, key=lambda g: g.memory_total)
        return largest.memory_total, f"the memory of this node's largest GPU {largest.device_id}"
    return inventory.cpu.memory_total, "this node's memory"
