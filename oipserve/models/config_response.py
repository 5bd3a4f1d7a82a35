"""The answer to ``GET /v2/models/{m}/config`` (and gRPC ModelConfig), Triton's JSON form.

It starts from what config.pbtxt gave (``ModelConfig.document``: every given field,
integers as JSON numbers, as Triton writes them) and states what the server really
does where that can differ: the platform and backend, the inputs and outputs as
merged with the ONNX graph, the instance groups, the version policy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format

from oipserve.grpc_generated import model_config_pb2 as mc
from oipserve.models.config.ensemble import ENSEMBLE_PLATFORM
from oipserve.models.config.json_form import message_json
from oipserve.models.config.parse import InstanceGroup
from oipserve.models.config.sequence import DEFAULT_IDLE_US
from oipserve.models.metadata import TensorSpec
from oipserve.models.registry import PLATFORM, ModelVersion
from oipserve.models.repository import DEFAULT_MODEL_FILENAME
from oipserve.wire.datatypes import DATATYPES

__all__ = ["model_config_document", "model_config_message"]


def _tensor(spec: TensorSpec, batched: bool, given: dict[str, dict[str, Any]]) -> dict[str, object]:
    dims = list(spec.shape[1:] if batched else spec.shape)
    entry: dict[str, object] = dict(given.get(spec.name, {}))
    entry.update(name=spec.name, data_type=DATATYPES[spec.datatype].triton, dims=dims)
    return entry


def _placed_groups(model: ModelVersion) -> list[dict[str, object]]:
    """The instance groups of a model without ``instance_group``, as placed: one worker
    process is one instance, on the GPUs by count (a group for each count) and on the
    CPU. Loading them back as its config places it the same (it read KIND_CPU with every
    worker counted, GPUs included, and such a reload moved the model; found by fuzzing).
    The first is named ``<model>``, as Triton names its (it was ``<model>_0``)."""
    per_gpu = Counter(
        int(w.device.partition(":")[2]) for w in model.workers if w.device.startswith("cuda:")
    )
    by_count: dict[int, list[int]] = {}
    for gpu, count in sorted(per_gpu.items()):
        by_count.setdefault(count, []).append(gpu)
    groups: list[dict[str, object]] = [
        {"count": count, "kind": "KIND_GPU", "gpus": gpus} for count, gpus in by_count.items()
    ]
    on_cpu = sum(1 for w in model.workers if w.device == "cpu")
    if on_cpu or not groups:
        groups.append({"count": on_cpu or 1, "kind": "KIND_CPU"})
    # Triton's one group for a config without any is named after the model (core's
    # NormalizeInstanceGroup); a second one here (GPUs of another count) is <model>_<i>.
    return [
        {"name": model.name if i == 0 else f"{model.name}_{i}", **g} for i, g in enumerate(groups)
    ]


def _instance_groups(
    model: ModelVersion, given: list[dict[str, Any]], groups: Sequence[InstanceGroup]
) -> list[dict[str, object]]:
    """The config's groups as placed (its own fields kept), or the model's placement when
    it gives none; none for an ensemble: the front runs it (Triton shows none either)."""
    if model.platform == ENSEMBLE_PLATFORM:
        return []
    placed = [
        {**fields, "count": g.count, "kind": g.kind, "gpus": list(g.gpus)}
        for fields, g in zip(given, groups, strict=True)
    ]
    return placed or _placed_groups(model)


def model_config_document(model: ModelVersion) -> dict[str, object]:
    """REST's answer: the message printed as Triton prints it, every field without
    presence at its default too (a sequence's START control, enum 0, had no ``kind``
    here, and inputs no ``format`` or ``optional``: found by comparing with Triton's QA
    configs), and Triton's 64-bit fields numbers but the few it leaves as strings
    (``json_form.TRITON_STRING_INT64``: they were numbers)."""
    return message_json(model_config_message(model), defaults=True, triton_strings=True)


def model_config_message(model: ModelVersion) -> mc.ModelConfig:
    """gRPC's answer, and REST's before it is printed: fields of a configuration that
    the proto does not carry are dropped (none of ours)."""
    return json_format.ParseDict(_document(model), mc.ModelConfig(), ignore_unknown_fields=True)


def _document(model: ModelVersion) -> dict[str, Any]:
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
        platform=model.platform,
        # (an echo endpoint has no backend; Triton leaves the field empty then)
        backend="onnxruntime" if model.platform == PLATFORM else "",
        max_batch_size=model.max_batch_size,
        input=[_tensor(t, batched, given_inputs) for t in model.inputs],
        output=[_tensor(t, batched, given_outputs) for t in model.outputs],
        instance_group=_instance_groups(model, given_groups, groups),
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
    _normalise(document, model)
    return document


def _normalise(document: dict[str, Any], model: ModelVersion) -> None:
    """What Triton's ``NormalizeModelConfig`` fills in, shown as this server does it too:
    a batcher's ``preferred_batch_size`` ``[max_batch_size]``, a sequence's idle time
    (1 s), the model file's name, each instance group's name (``<model>_<i>``). The
    response showed 0 and ``[]`` where the server used 1 s and ``max_batch_size``
    (comparing with Triton's core). Given blocks are copied, never changed in place: they
    are the config's own."""
    largest = [model.max_batch_size] if model.max_batch_size > 0 else []
    batching = document.get("dynamic_batching")
    if isinstance(batching, dict) and not batching.get("preferred_batch_size") and largest:
        document["dynamic_batching"] = {**batching, "preferred_batch_size": largest}
    sequence = document.get("sequence_batching")
    if isinstance(sequence, dict):
        sequence = document["sequence_batching"] = dict(sequence)
        if not sequence.get("max_sequence_idle_microseconds"):
            sequence["max_sequence_idle_microseconds"] = DEFAULT_IDLE_US
        oldest = sequence.get("oldest")
        if isinstance(oldest, dict) and not oldest.get("preferred_batch_size") and largest:
            sequence["oldest"] = {**oldest, "preferred_batch_size": largest}
    if model.platform == PLATFORM and not document.get("default_model_filename"):
        document["default_model_filename"] = DEFAULT_MODEL_FILENAME
    groups = document.get("instance_group")
    if isinstance(groups, list):
        document["instance_group"] = [
            group if group.get("name") else {**group, "name": f"{model.name}_{index}"}
            for index, group in enumerate(groups)
        ]
