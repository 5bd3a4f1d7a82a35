"""Where a model's instances go: its config's ``instance_group`` entries, resolved as
Triton normalises them, on the worker processes this server runs (one per device slot).

``Placement.workers_for`` asks ``place_groups``; the resolved groups are what the config
response shows (``models.config_response``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar

import msgspec

from oipserve.models.config.parse import InstanceGroup
from oipserve.models.metadata import MetadataConflict
from oipserve.pool.link import WorkerLink

__all__ = ["DEFAULT_CPU_COUNT", "place_groups", "resolved_group"]

#: A KIND_CPU group's ``count`` when its config gives none: Triton's for its ONNX Runtime
#: backend (core's ``SetDefaultInstanceCount``); a group elsewhere gets 1.
DEFAULT_CPU_COUNT = 2

Worker = TypeVar("Worker", bound=WorkerLink)

log = logging.getLogger("oipserve.models")


def place_groups(
    groups: Sequence[InstanceGroup], workers: Sequence[Worker], model: str = ""
) -> tuple[list[Worker], tuple[InstanceGroup, ...]]:
    """The workers that get a session, and the groups as resolved; MetadataConflict when a
    group asks for a device where this server runs no workers.

    ``count`` sessions of a group go on each of its devices, capped at the worker processes
    there (``--instances-per-device``): two sessions in one single-threaded worker would
    not run at the same time. A cap is logged (a warning naming ``model``): Triton makes
    ``count`` instances, and a group that got fewer, silently, ran its requests one after
    another (found by comparing with Triton's batcher).
    """
    gpu_devices = sorted({w.device for w in workers if w.device.startswith("cuda:")})
    on_cpu = sum(1 for w in workers if w.device == "cpu")
    chosen: list[Worker] = []
    resolved = tuple(resolved_group(group, gpu_devices, on_cpu) for group in groups)
    for group in resolved:
        devices = [f"cuda:{g}" for g in group.gpus]
        if not devices:
            devices = gpu_devices if group.kind == "KIND_MODEL" and gpu_devices else ["cpu"]
        for device in devices:
            on_device = [w for w in workers if w.device == device]
            if not on_device:
                raise MetadataConflict(
                    f"instance_group asks for {device}, where this server runs no workers "
                    f"(--devices gave: {', '.join(sorted({w.device for w in workers}))})"
                )
            if group.count > len(on_device):
                log.warning(
                    "model '%s': instance_group asks for %d instances on %s, which runs %d "
                    "worker process%s: %d instance%s (--instances-per-device %d gives %d)",
                    model,
                    group.count,
                    device,
                    len(on_device),
                    "" if len(on_device) == 1 else "es",
                    len(on_device),
                    "" if len(on_device) == 1 else "s",
                    group.count,
                    group.count,
                )
            chosen.extend(w for w in on_device[: group.count] if w not in chosen)
    return chosen, resolved


def resolved_group(
    group: InstanceGroup, gpu_devices: list[str], cpu_workers: int = DEFAULT_CPU_COUNT
) -> InstanceGroup:
    """``group`` as it runs on a server with ``gpu_devices`` and ``cpu_workers`` CPU worker
    processes, as Triton normalises it: ``KIND_AUTO`` is ``KIND_GPU`` when the server runs
    GPUs, else ``KIND_CPU`` (which cannot name GPUs: refused, as Triton refuses it); a GPU
    group without ``gpus`` is on every GPU. ``KIND_MODEL`` is left as it is
    (``place_groups`` places it as KIND_AUTO, and Triton shows it as given). A group
    without ``count`` gets Triton's: 2 on the CPU (as many as run there when fewer: a
    second session in one worker runs nothing at the same time, and nobody asked for it, so
    no warning), else 1. MetadataConflict for a GPU group on a server without GPUs.
    """
    kind = group.kind
    if not group.count:
        cpu = kind == "KIND_CPU" or (kind == "KIND_AUTO" and not gpu_devices)
        count = min(DEFAULT_CPU_COUNT, max(1, cpu_workers)) if cpu else 1
        group = msgspec.structs.replace(group, count=count)
    if kind == "KIND_MODEL":
        return group
    on_gpus = kind == "KIND_GPU" or (kind == "KIND_AUTO" and bool(gpu_devices))
    if kind == "KIND_AUTO":
        kind = "KIND_GPU" if on_gpus else "KIND_CPU"
    if not on_gpus:
        if group.gpus:
            raise MetadataConflict(
                f"instance_group {group.kind} names GPUs {list(group.gpus)}; this server runs "
                f"none, so it is {kind}, which cannot name GPUs"
            )
        return msgspec.structs.replace(group, kind=kind)
    if not gpu_devices and not group.gpus:
        raise MetadataConflict(f"instance_group {group.kind} asks for a GPU; this server runs none")
    gpus = group.gpus or tuple(int(d.partition(":")[2]) for d in gpu_devices)
    return msgspec.structs.replace(group, kind=kind, gpus=gpus)
