"""Checking a new worker endpoint against this node before anything of it is made.

A load's parameters have passed ``worker_params`` (types, kinds); here they are checked
against what needs server state: the hardware inventory (read afresh, for the device and
its free memory), the operator's bounds (``load_limits``) and the model repository (the
model file or model the endpoint serves). Everything that can be refused is refused here,
before any process starts. The outcome is an ``EndpointPlan``: the served model, not yet
on any worker, and what ``worker_endpoints`` is to create for it. Nothing is started or
registered in this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hardware import CPU_DEVICE, Inventory, InventoryError, cuda_provider_options, resolve_device
from oipserve.errors import InvalidInput
from oipserve.management.load_limits import LoadLimits, check_instances, check_numbers
from oipserve.management.worker_params import cuda_settings, optional_str, positive_int
from oipserve.models.config.parse import ModelConfig
from oipserve.models.registry import ModelVersion
from oipserve.models.repository import read_model


@dataclass(frozen=True)
class EndpointPlan:
    """A checked endpoint: its model (no session yet) and what its creation is to make."""

    #: The served model; echo endpoints have one too (``echo = True``, no session).
    model: ModelVersion
    #: The device its sessions go on (``cpu`` for echo endpoints).
    device: str
    #: ``intra_op_threads`` of each session, None when not given.
    threads: int | None
    #: Instances to create: sessions of an onnxruntime endpoint, a count for echo ones.
    instances: int
    #: ``batch_size``: the model's ``max_batch_size`` once created, if its inputs batch.
    batch_size: int | None


def _instances(params: Mapping[str, object]) -> int:
    """``instances``: 1 when absent; a null is refused like any value that is not a
    positive integer (``endpoint_naming.param_key`` refuses it first on a load)."""
    instances = positive_int(params, "instances", 1)
    if instances is None:
        raise InvalidInput("parameter 'instances' must be a positive integer; got None")
    return instances


def plan_echo(name: str, params: Mapping[str, object], limits: LoadLimits) -> EndpointPlan:
    """Check an echo endpoint's parameters; it will have no process and no session."""
    instances = _instances(params)
    check_instances(instances, CPU_DEVICE, None, limits)
    model = ModelVersion(name, "1", "", None)
    model.echo = True
    model.platform = "echo"
    return EndpointPlan(model, CPU_DEVICE, None, instances, None)


def plan_onnx(
    name: str,
    params: Mapping[str, object],
    inventory: Callable[[], Inventory],
    limits: LoadLimits,
    root: Path,
) -> EndpointPlan:
    """Check every parameter of an onnxruntime endpoint against the node and the limits.

    ``inventory`` reads the inventory afresh; an unreadable one is the server's problem
    (its 503 passes through), not the client's 400.
    """
    spec = optional_str(params, "model")
    if not spec:
        raise InvalidInput("No model specified: worker 'onnxruntime' needs a 'model' parameter")
    version = optional_str(params, "version")
    instances = _instances(params)
    batch_size = positive_int(params, "batch_size", None)
    threads = positive_int(params, "intra_op_threads", None)
    positive_int(params, "inter_op_threads", None)
    device_spec = optional_str(params, "device") or "auto"
    settings = cuda_settings(params)
    try:
        options = cuda_provider_options(0, settings)  # validate even when placed on the CPU
    except InventoryError as exc:
        raise InvalidInput(str(exc)) from None
    # Outside the try: an unreadable inventory is the server's problem (503), not a 400.
    node = inventory()
    try:
        device = resolve_device(node, device_spec)
    except InventoryError as exc:
        raise InvalidInput(str(exc)) from None
    check_instances(instances, device, node, limits)
    check_numbers(params, device, node, options, limits)
    path, config, version = model_file(root, spec, version)
    model = ModelVersion(name, version, path, config)
    model.key = f"{name}/{version}#{id(model)}"
    model.cuda_settings = settings
    return EndpointPlan(model, device, threads, instances, batch_size)


def model_file(root: Path, spec: str, version: str | None) -> tuple[str, ModelConfig | None, str]:
    """(path, config, version) for a repository model name or an .onnx path inside it."""
    resolved_root = root.resolve()
    if spec.endswith(".onnx"):
        path = (resolved_root / spec).resolve()
        if not path.is_relative_to(resolved_root):
            raise InvalidInput(f"model path '{spec}' is outside the model repository")
        if not path.is_file():
            raise InvalidInput(f"model file '{spec}' not found in the model repository")
        return str(path), None, version or "1"
    if "/" in spec or spec.startswith("."):
        raise InvalidInput(f"model '{spec}' is neither a repository model nor an .onnx path")
    source = read_model(root, spec)
    if source.error is not None:
        raise InvalidInput(f"model '{spec}' cannot be loaded: {source.error}")
    if version is None:
        version = max(source.versions, key=int)
    if version not in source.versions:
        raise InvalidInput(
            f"model '{spec}' has no version '{version}' (versions: {', '.join(source.versions)})"
        )
    return source.versions[version], source.config, version
