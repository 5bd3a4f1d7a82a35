"""The answer to ``GET /v2/models/{m}/config`` (and gRPC ModelConfig), Triton's JSON form.

It starts from what config.pbtxt gave (``ModelConfig.document``: every given field,
integers as JSON numbers, as Triton writes them) and states what the server really
does where that can differ: the platform and backend, the inputs and outputs as
merged with the ONNX graph, the instance groups, the version policy.
"""

from __future__ import annotations

from typing import Any

from oipserve.models.metadata import TensorSpec
from oipserve.models.registry import ModelVersion
from oipserve.wire.datatypes import DATATYPES

__all__ = ["model_config_document"]


def _tensor(spec: TensorSpec, batched: bool, given: dict[str, dict[str, Any]]) -> dict[str, object]:
    dims = list(spec.shape[1:] if batched else spec.shape)
    entry: dict[str, object] = dict(given.get(spec.name, {}))
    entry.update(name=spec.name, data_type=DATATYPES[spec.datatype].triton, dims=dims)
    return entry


def model_config_document(model: ModelVersion) -> dict[str, object]:
    config = model.config
    document: dict[str, Any] = dict(config.document) if config else {}
    batched = model.max_batch_size > 0
    given_inputs = {e["name"]: e for e in document.get("input", [])}
    given_outputs = {e["name"]: e for e in document.get("output", [])}
    given_groups = document.get("instance_group", [])
    groups = model.instance_groups or (config.instance_groups if config else ())
    policy = config.version_policy if config else None
    document.update(
        name=model.name,
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        max_batch_size=model.max_batch_size,
        input=[_tensor(t, batched, given_inputs) for t in model.inputs],
        output=[_tensor(t, batched, given_outputs) for t in model.outputs],
        instance_group=[
            {**given, "count": g.count, "kind": g.kind, "gpus": list(g.gpus)}
            for given, g in zip(given_groups, groups, strict=True)
        ]
        or [{"count": len(model.workers), "kind": "KIND_CPU"}],
        parameters={k: {"string_value": v} for k, v in model.parameters.items()},
    )
    if policy is None or policy.kind == "latest":
        document["version_policy"] = {
            "latest": {"num_versions": policy.num_versions if policy else 1}
        }
    elif policy.kind == "all":
        document["version_policy"] = {"all": {}}
    else:
        document["version_policy"] = {"specific": {"versions": list(policy.versions)}}
    return document
