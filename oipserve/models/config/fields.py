"""What oipserve does with every field of Triton's model configuration.

A config.pbtxt written for Triton may use any field of its ModelConfig. Each one is
either honoured, refused (the model is UNAVAILABLE, with the reason), or ignored with
a WARNING that names it; none is dropped in silence. ``DISPOSITIONS`` is the one
table of that decision, for the top-level fields and those of input, output and
instance_group; a unit test checks that it covers every field of the compiled
descriptor, so a field a newer Triton adds cannot slip through unnoticed.

A field counts as given when protobuf lists it (``ListFields``): a message that is
present, a non-empty repeated field or map, a scalar that is not its default.
Conditions on the values of honoured fields (platform must be ONNX Runtime,
``decoupled`` must be false, ...) are checked in ``oipserve.models.config.parse``.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from google.protobuf.message import Message

from oipserve.grpc_generated import model_config_pb2 as mc

__all__ = ["DISPOSITIONS", "Disposition", "FieldRule", "Review", "review"]


class Disposition(enum.Enum):
    HONOURED = "honoured"
    #: The model is not loaded: serving it without the field would be wrong.
    REFUSED = "refused"
    #: The model is served as if the field were absent; a WARNING names it.
    WARNED = "ignored with a warning"


class FieldRule(NamedTuple):
    disposition: Disposition
    #: Why, in a few words: shown in messages and in docs/model-config.md.
    note: str


H, R, W = Disposition.HONOURED, Disposition.REFUSED, Disposition.WARNED

DISPOSITIONS: dict[str, dict[str, FieldRule]] = {
    "inference.ModelConfig": {
        "name": FieldRule(H, "must match the model's directory name"),
        "platform": FieldRule(H, "must be onnxruntime_onnx (or empty)"),
        "backend": FieldRule(H, "must be onnxruntime (or empty)"),
        "runtime": FieldRule(W, "oipserve always runs ONNX Runtime"),
        "version_policy": FieldRule(H, "latest (default: 1 version), all or specific"),
        "max_batch_size": FieldRule(H, "a batch dimension is prepended to dims"),
        "input": FieldRule(H, "see the input fields"),
        "output": FieldRule(H, "see the output fields"),
        "batch_input": FieldRule(H, "tensors made per batch for ragged inputs (docs/scheduler.md)"),
        "batch_output": FieldRule(H, "BATCH_SCATTER_WITH_INPUT_SHAPE: cut by the input's shapes"),
        "optimization": FieldRule(H, "graph.level honoured, see the optimization fields"),
        "dynamic_batching": FieldRule(H, "the dynamic batcher, see its fields"),
        "sequence_batching": FieldRule(
            H, "direct and oldest strategies, control inputs, implicit state (docs/sequences.md)"
        ),
        "ensemble_scheduling": FieldRule(H, "platform ensemble, steps (docs/ensembles.md)"),
        "instance_group": FieldRule(H, "see the instance_group fields"),
        "default_model_filename": FieldRule(H, "the model file in each version directory"),
        "cc_model_filenames": FieldRule(W, "TensorRT-specific"),
        "metric_tags": FieldRule(W, "oipserve exports no per-model metrics"),
        "parameters": FieldRule(H, "ONNX Runtime provider, session and image options"),
        "model_warmup": FieldRule(W, "no warm-up requests are run"),
        "model_operations": FieldRule(W, "custom operator libraries are not loaded"),
        "model_transaction_policy": FieldRule(H, "decoupled: true is refused"),
        "model_repository_agents": FieldRule(R, "repository agents are not run"),
        "response_cache": FieldRule(H, "enable: true caches answers under --cache-config"),
        "model_metrics": FieldRule(H, "histogram buckets per family (docs/metrics.md)"),
    },
    "inference.ModelInput": {
        "name": FieldRule(H, "required"),
        "data_type": FieldRule(H, "required; must match the graph"),
        "format": FieldRule(H, "FORMAT_NHWC/NCHW need 3 dims, as in Triton"),
        "dims": FieldRule(H, "the shape clients send (without the batch dim)"),
        "reshape": FieldRule(H, "the shape the model gets"),
        "is_shape_tensor": FieldRule(R, "shape tensors are TensorRT-only"),
        "allow_ragged_batch": FieldRule(H, "requests of other shapes join; the model gets it flat"),
        "optional": FieldRule(H, "a request may leave the input out"),
        "is_non_linear_format_io": FieldRule(R, "TensorRT-only"),
    },
    "inference.ModelOutput": {
        "name": FieldRule(H, "required"),
        "data_type": FieldRule(H, "required; must match the graph"),
        "dims": FieldRule(H, "the shape clients receive (without the batch dim)"),
        "reshape": FieldRule(H, "the shape the model produces"),
        "label_filename": FieldRule(
            H,
            "class labels, one a line, read at load from a file inside the model's directory "
            "(classification extension)",
        ),
        "is_shape_tensor": FieldRule(R, "shape tensors are TensorRT-only"),
        "is_non_linear_format_io": FieldRule(R, "TensorRT-only"),
    },
    "inference.ModelDynamicBatching": {
        "preferred_batch_size": FieldRule(H, "batch sizes fired at once (default: max)"),
        "max_queue_delay_microseconds": FieldRule(H, "how long the oldest request may wait"),
        "preserve_ordering": FieldRule(H, "answers in the order requests arrived"),
        "priority_levels": FieldRule(H, "queues served level 1 first"),
        "default_priority_level": FieldRule(H, "the level of a request without priority"),
        "default_queue_policy": FieldRule(H, "see the queue policy fields"),
        "priority_queue_policy": FieldRule(H, "a queue policy per level"),
    },
    "inference.ModelQueuePolicy": {
        "timeout_action": FieldRule(H, "REJECT (503) or DELAY"),
        "default_timeout_microseconds": FieldRule(H, "how long a request may stay queued"),
        "allow_timeout_override": FieldRule(H, "a request's timeout may shorten it"),
        "max_queue_size": FieldRule(H, "more waiting requests are refused (503)"),
    },
    "inference.ModelEnsembling": {
        "step": FieldRule(H, "the composing models and their tensor maps"),
        "max_inflight_requests": FieldRule(H, "requests in flight at each step at once"),
    },
    "inference.ModelEnsembling.Step": {
        "model_name": FieldRule(H, "a model of the repository, loaded with the ensemble"),
        "model_version": FieldRule(H, "-1: the latest ready version"),
        "input_map": FieldRule(H, "model input -> ensemble tensor"),
        "output_map": FieldRule(H, "model output -> ensemble tensor"),
        "model_namespace": FieldRule(R, "oipserve serves one repository namespace"),
    },
    "inference.ModelInstanceGroup": {
        "name": FieldRule(H, "shown in the config response"),
        "kind": FieldRule(H, "KIND_CPU, KIND_GPU, KIND_AUTO, KIND_MODEL"),
        "count": FieldRule(
            H,
            "sessions per device, up to its worker processes (`--instances-per-device`); past "
            "them a warning at the load says how many run (Triton makes `count`; the cap "
            "went unsaid until 2026-11-30). None given (or 0): Triton's default (core's "
            "`SetDefaultInstanceCount`), 2 for a group that runs on the CPU (`KIND_CPU`, or "
            "`KIND_AUTO` on a server without GPUs), 1 for any other; on the CPU no more than "
            "its worker processes, without a warning (until 2026-11-30 it was 1: a repository "
            "moved from Triton ran half its CPU instances)",
        ),
        "rate_limiter": FieldRule(W, "oipserve has no rate limiter"),
        "gpus": FieldRule(H, "the GPUs that get instances"),
        "secondary_devices": FieldRule(R, "NVDLA devices are TensorRT-only"),
        "profile": FieldRule(R, "optimization profiles are TensorRT-only"),
        "passive": FieldRule(R, "every instance takes requests"),
        "host_policy": FieldRule(W, "oipserve has no host policies"),
    },
    "inference.ModelOptimizationPolicy": {
        "graph": FieldRule(H, "level: ONNX Runtime's graph optimization level, as Triton's"),
        "priority": FieldRule(W, "oipserve has no model priorities"),
        "cuda": FieldRule(W, "CUDA graphs are TensorRT-only"),
        "execution_accelerators": FieldRule(W, "ONNX Runtime's CPU or CUDA provider runs it"),
        "input_pinned_memory": FieldRule(W, "inputs come in shared memory, not pinned"),
        "output_pinned_memory": FieldRule(W, "outputs go in shared memory, not pinned"),
        "gather_kernel_buffer_threshold": FieldRule(W, "oipserve has no gather kernel"),
        "eager_batching": FieldRule(W, "batches form as the dynamic batcher forms them"),
    },
}

#: Repeated message fields of ModelConfig whose entries have their own rules above.
_ENTRIES = {"input": "name", "output": "name", "instance_group": None}


class Review(NamedTuple):
    #: "field: note" for each refused field given; the model cannot be served.
    refused: list[str]
    #: Paths of the given fields that are ignored, e.g. "input['x'].allow_ragged_batch".
    ignored: list[str]


def _review_fields(message: Message, path: str, out: Review) -> None:
    rules = DISPOSITIONS[message.DESCRIPTOR.full_name]
    for field, _ in message.ListFields():
        rule = rules.get(field.name)
        where = f"{path}.{field.name}" if path else field.name
        if rule is None:  # a field newer than the table: never let it pass silently
            out.refused.append(f"{where}: not known to oipserve")
        elif rule.disposition is Disposition.REFUSED:
            out.refused.append(f"{where}: {rule.note}")
        elif rule.disposition is Disposition.WARNED:
            out.ignored.append(where)


def review(config: mc.ModelConfig) -> Review:
    """Sort the fields a parsed ``inference.ModelConfig`` gives by their disposition."""
    out = Review([], [])
    _review_fields(config, "", out)
    for field_name, key in _ENTRIES.items():
        for index, entry in enumerate(getattr(config, field_name)):
            label = repr(getattr(entry, key)) if key else str(index)
            _review_fields(entry, f"{field_name}[{label}]", out)
    if config.HasField("ensemble_scheduling"):
        scheduling = config.ensemble_scheduling
        _review_fields(scheduling, "ensemble_scheduling", out)
        for index, step in enumerate(scheduling.step):
            _review_fields(step, f"ensemble_scheduling.step[{index}]", out)
    if config.HasField("optimization"):
        _review_fields(config.optimization, "optimization", out)
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        _review_fields(batching, "dynamic_batching", out)
        if batching.HasField("default_queue_policy"):
            policy = batching.default_queue_policy
            _review_fields(policy, "dynamic_batching.default_queue_policy", out)
        for level, policy in batching.priority_queue_policy.items():
            _review_fields(policy, f"dynamic_batching.priority_queue_policy[{level}]", out)
    return out
