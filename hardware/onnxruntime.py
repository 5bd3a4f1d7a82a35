"""ONNX Runtime CUDAExecutionProvider options built from model settings.

Option names are ONNX Runtime's (CUDA EP docs, `cuda_provider_options` keys):
  device_id                  CUDA ordinal of the GPU to run on;
  gpu_mem_limit              arena size limit in bytes (decimal string);
  arena_extend_strategy      "kNextPowerOfTwo" (default) or "kSameAsRequested" (Triton's
                             onnxruntime backend: "0" or "1");
  cudnn_conv_algo_search     "EXHAUSTIVE" (default), "HEURISTIC" or "DEFAULT" (Triton's:
                             "0", "1" or "2");
  do_copy_in_default_stream  "1"/"0" (ORT also parses true/false/True/False).
Values are validated here because ORT's own errors surface only inside a worker process,
as one opaque session-creation failure.

device_id is a CUDA ordinal, and our GPU index is NVML's: they agree only when the worker
runs with CUDA_DEVICE_ORDER=PCI_BUS_ID and without a CUDA_VISIBLE_DEVICES remapping.
"""

from __future__ import annotations

from collections.abc import Mapping

from hardware.inventory import InventoryError

_SIZE_MAX = 2**64 - 1
_ARENA_STRATEGIES = ("kNextPowerOfTwo", "kSameAsRequested")
_CONV_SEARCHES = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")
_BOOLS = {"1": "1", "true": "1", "0": "0", "false": "0"}


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    """Value if it is one of ORT's spellings (exact case, as ORT compares), or its number
    in ``allowed`` as Triton's onnxruntime backend takes it (``cudnn_conv_algo_search``
    "0" is EXHAUSTIVE; ``arena_extend_strategy`` "1" is kSameAsRequested)."""
    if value in allowed:
        return value
    if value.isascii() and value.isdigit() and int(value) < len(allowed):
        return allowed[int(value)]
    numbers = ", ".join(f"{i} ({name})" for i, name in enumerate(allowed))
    raise InventoryError(
        f"{key} must be one of {', '.join(allowed)}, or Triton's number for one: {numbers}; "
        f"got {value!r}"
    )


def _mem_limit(value: str) -> str:
    """Positive byte count that fits ORT's size_t, normalised to plain decimal."""
    if not value.isascii() or not value.isdigit() or not 0 < int(value) <= _SIZE_MAX:
        raise InventoryError(f"gpu_mem_limit must be a positive number of bytes; got {value!r}")
    return str(int(value))


def _flag(key: str, value: str) -> str:
    """Boolean option as "1"/"0"."""
    flag = _BOOLS.get(value.lower())
    if flag is None:
        raise InventoryError(f"{key} must be 1, 0, true or false; got {value!r}")
    return flag


def cuda_provider_options(gpu_index: int, settings: Mapping[str, str]) -> dict[str, str]:
    """Options for ("CUDAExecutionProvider", options); other settings keys are ignored."""
    if gpu_index < 0:
        raise InventoryError(f"GPU index must be >= 0; got {gpu_index}")
    options = {"device_id": str(gpu_index)}
    if "gpu_mem_limit" in settings:
        options["gpu_mem_limit"] = _mem_limit(settings["gpu_mem_limit"].strip())
    for key, allowed in (
        ("arena_extend_strategy", _ARENA_STRATEGIES),
        ("cudnn_conv_algo_search", _CONV_SEARCHES),
    ):
        if key in settings:
            options[key] = _choice(key, settings[key].strip(), allowed)
    if "do_copy_in_default_stream" in settings:
        key = "do_copy_in_default_stream"
        options[key] = _flag(key, settings[key].strip())
    return options
