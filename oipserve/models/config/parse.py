"""Reader for Triton ``config.pbtxt`` model configurations.

The text is parsed by protobuf's ``text_format`` against Triton's own schema
(proto/model_config.proto, compiled into oipserve/grpc_generated), so the syntax and
the set of fields are exactly Triton's; a typo fails at load with a line and column.
Then come the checks Triton makes that a schema cannot express (names given, dims
-1 or positive, reshape compatible with dims, ...) and oipserve's own decision for
every given field (``oipserve.models.config.fields``): refused fields raise
``ModelConfigError``, ignored ones are listed in ``ModelConfig.ignored`` for the
caller to log.

The result is a small typed view (``ModelConfig``) of what the server uses, plus
``document``: the given configuration as Triton renders it in JSON, for the
model_configuration extension.

Bounds (docs/limits.md): a configuration longer than ``CONFIG_MAX_BYTES`` is refused
before it is parsed (protobuf's parsers take seconds and gigabytes on the event loop for
a 256 MiB ``config`` parameter). Parsing allocates nothing sized by a number the
configuration gives; the numbers that size something later are checked against the
operator's ``ConfigLimits`` by ``check_limits`` before a model is loaded.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Literal

import msgspec
from google.protobuf import json_format, text_format

from oipserve.grpc_generated import model_config_pb2 as mc
from oipserve.models.config.batch_io_config import BatchIO, BatchIOError, batch_io
from oipserve.models.config.ensemble import (
    ENSEMBLE_PLATFORM,
    EnsembleConfig,
    EnsembleError,
    ensemble_scheduling,
)
from oipserve.models.config.field_values import meaningless_value
from oipserve.models.config.fields import Review, review
from oipserve.models.config.json_form import message_json
from oipserve.models.config.model_metrics import histogram_buckets
from oipserve.models.config.padding_config import PadBatch, PadBatchError, pad_batch
from oipserve.models.config.sequence import SequenceConfigError, SequencePolicy, sequence_policy
from oipserve.scheduling.policy import BatchPolicy, BatchPolicyError, batch_policy
from oipserve.wire.datatypes import BY_TRITON

__all__ = [
    "CONFIG_MAX_BYTES",
    "ConfigLimits",
    "InstanceGroup",
    "ModelConfig",
    "ModelConfigError",
    "TensorConfig",
    "VersionPolicy",
    "check_limits",
    "config_from_message",
    "parse_model_config",
    "parse_model_config_json",
    "read_model_config",
]

PLATFORMS = ("", "onnxruntime_onnx")
BACKENDS = ("", "onnxruntime")

_POSITION = re.compile(r"^(\d+):(\d+) : ")

#: Longest configuration read (a config.pbtxt, or a load's ``config`` parameter, counted
#: in characters). Triton's own example configurations take under 2 KB; one of 1 MiB
#: declares tens of thousands of tensors.
CONFIG_MAX_BYTES = 1024 * 1024


class ModelConfigError(ValueError):
    """A config.pbtxt that is not valid, or that asks for what oipserve cannot do."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        prefix = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(prefix + message)


class TensorConfig(msgspec.Struct, frozen=True):
    """One ``input``/``output`` entry; ``data_type`` is the OIP datatype (e.g. "FP32").

    ``dims`` is the shape clients see, ``reshape`` (when given) the shape the model
    sees; both exclude the batch dimension when max_batch_size > 0.
    """

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    #: Inputs only: a request may leave it out.
    optional: bool = False
    #: Outputs only: the file of class labels, relative to the model's directory.
    label_filename: str = ""
    #: Outputs only: the labels of ``label_filename``, one per index (read at load).
    labels: tuple[str, ...] = ()


class InstanceGroup(msgspec.Struct, frozen=True):
    """One ``instance_group`` entry."""

    #: 0: not given, Triton's default then (``instance_groups.resolved_group``).
    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] = ()


class VersionPolicy(msgspec.Struct, frozen=True):
    """Which version directories are served; Triton's default is the latest one."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of ``available``, in ascending order."""
        ordered = sorted(set(available))
        if self.kind == "all":
            return ordered
        if self.kind == "latest":
            return ordered[-self.num_versions :]
        return [v for v in ordered if v in self.versions]


class ModelConfig(msgspec.Struct, frozen=True):
    """The parts of a Triton model configuration this server uses."""

    name: str | None = None
    platform: str | None = None
    backend: str | None = None
    max_batch_size: int = 0
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    instance_groups: tuple[InstanceGroup, ...] = ()
    parameters: dict[str, str] = msgspec.field(default_factory=dict)
    default_model_filename: str | None = None
    version_policy: VersionPolicy = VersionPolicy()
    #: Set by a ``dynamic_batching`` block: requests go through the dynamic batcher.
    dynamic_batching: BatchPolicy | None = None
    #: ``model_metrics``: latency histogram family -> its upper bounds (microseconds).
    histogram_buckets: dict[str, tuple[float, ...]] = msgspec.field(default_factory=dict)
    #: ``response_cache { enable: true }``: answers cached when the server has a cache
    #: (``--cache-config``, docs/cache.md).
    response_cache: bool = False
    #: Given fields oipserve ignores (e.g. "dynamic_batching"); the loader warns about each.
    ignored: tuple[str, ...] = ()
    #: The configuration as given, in Triton's JSON form (integers as numbers).
    document: dict[str, Any] = msgspec.field(default_factory=dict)
    #: Set by a ``sequence_batching`` block: a stateful model (docs/sequences.md).
    sequence_batching: SequencePolicy | None = None
    #: ``platform: "ensemble"``: its steps (oipserve.models.config.ensemble); no model file.
    ensemble: EnsembleConfig | None = None
    #: Ragged batching (``allow_ragged_batch``, ``batch_input``, ``batch_output``); None
    #: when the model uses none of it (batch_io_config.py).
    batch_io: BatchIO | None = None
    #: Padded batching (the ``pad_batch`` parameter); None without it (padding_config.py).
    pad_batch: PadBatch | None = None
    #: ``optimization.graph.level`` (0: not given), ONNX Runtime's graph optimization level
    #: as Triton's backend maps it (``session_keys.GRAPH_LEVELS``).
    graph_level: int = 0


class ConfigLimits(msgspec.Struct, frozen=True):
    """The operator's bounds on the numbers of a model configuration (flags of serve).

    Only the numbers that size something the server keeps have one; the others count
    nothing ahead of requests (``max_queue_size``, ``max_batch_size``, an instance
    group's ``count``, ``num_versions``: docs/model-config.md, "Bounds").
    """

    #: Most ``dynamic_batching.priority_levels`` (``--max-priority-levels``).
    max_priority_levels: int = 1000


def check_limits(config: ModelConfig, limits: ConfigLimits) -> None:
    """ModelConfigError naming the bound when a number of ``config`` is past it."""
    batching = config.dynamic_batching
    if batching is not None and batching.priority_levels > limits.max_priority_levels:
        raise ModelConfigError(
            f"dynamic_batching.priority_levels {batching.priority_levels} is more than "
            f"--max-priority-levels {limits.max_priority_levels} (the limit)"
        )


def _check_length(length: int, unit: str) -> None:
    if length > CONFIG_MAX_BYTES:
        raise ModelConfigError(
            f"the configuration is longer than {CONFIG_MAX_BYTES} {unit} (the limit)"
        )


# --------------------------------------------------------------------------- checks


def _dims(values: Any, path: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in values)
    for dim in dims:
        if dim < 1 and dim != -1:
            raise ModelConfigError(f"{path}: {dim} is invalid, use -1 or a positive size")
    return dims


def _trunks(shape: tuple[int, ...]) -> list[int]:
    """The products of the fixed sizes before, between and after the -1s of ``shape``."""
    trunks, product = [], 1
    for dim in shape:
        if dim == -1:
            trunks.append(product)
            product = 1
        else:
            product *= dim
    trunks.append(product)
    return trunks


def _check_reshape(
    dims: tuple[int, ...], reshape: tuple[int, ...], path: str, tensor: str, batching: bool
) -> None:
    """Triton's rules for a reshape, in its words first (core's ValidateIOShape; Triton's
    QA configs qa/L0_model_config/noautofill_platform/reshape_*).

    At run time the reshape's -1s take, in order, the sizes a request gives for the -1s of
    ``dims``: so the fixed sizes before, between and after the -1s must hold as many
    elements in each. An empty reshape is a scalar per batch item: only for a model that
    batches, and only from dims of one element.
    """
    triton = f"model {tensor}"
    given = f" ({path}: dims {list(dims)}, reshape {list(reshape)})"
    if not reshape and not batching:
        raise ModelConfigError(
            f"{triton} cannot have empty reshape for non-batching model as scalar tensors are "
            f"not supported{given}"
        )
    if any(dim < 1 and dim != -1 for dim in reshape):
        raise ModelConfigError(
            f"{triton} reshape dimensions must be integer >= 1, or -1 to indicate a "
            f"variable-size dimension{given}"
        )
    wanted, got = _trunks(dims), _trunks(reshape)  # (an empty reshape: [1], one element)
    if len(wanted) > 1 and len(got) > 1 and len(wanted) != len(got):
        raise ModelConfigError(
            f"{triton} has different number of variable-size dimensions for dims and reshape{given}"
        )
    if wanted != got:
        raise ModelConfigError(
            f"{triton} has different size for dims and reshape{given}: the fixed sizes "
            "before, between and after the -1s must hold as many elements in each"
        )


def _tensor(entry: Any, path: str, seen: set[str], batching: bool) -> TensorConfig:
    if not entry.name:
        raise ModelConfigError(f"{path}.name is required and must not be empty")
    tensor = f"{path.partition('[')[0]} '{entry.name}'"  # (Triton's: input 'x')
    path = f"{path} ({entry.name!r})"
    if entry.name in seen:
        raise ModelConfigError(f"{path} is specified more than once")
    seen.add(entry.name)
    if entry.data_type == mc.TYPE_INVALID:
        raise ModelConfigError(f"{path}.data_type is required (e.g. TYPE_FP32)")
    row = BY_TRITON[mc.DataType.Name(entry.data_type)]
    dims = _dims(entry.dims, f"{path}.dims")
    reshape = None
    if entry.HasField("reshape"):
        reshape = tuple(int(d) for d in entry.reshape.shape)
        _check_reshape(dims, reshape, path, tensor, batching)
    optional = bool(getattr(entry, "optional", False))
    if getattr(entry, "format", mc.ModelInput.FORMAT_NONE) != mc.ModelInput.FORMAT_NONE:
        if len(dims) != 3:
            fmt = mc.ModelInput.Format.Name(entry.format)
            raise ModelConfigError(f"{path}: {fmt} needs 3 dims, got {list(dims)}")
    label_filename = getattr(entry, "label_filename", "")
    return TensorConfig(entry.name, row.name, dims, reshape, optional, label_filename)


def _instance_group(group: Any, path: str) -> InstanceGroup:
    if group.count < 0:
        raise ModelConfigError(f"{path}.count must be at least 1, got {group.count}")
    kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
    gpus = tuple(group.gpus)
    if any(g < 0 for g in gpus):
        raise ModelConfigError(f"{path}.gpus: {min(gpus)} is not a GPU index")
    if gpus and kind in ("KIND_CPU", "KIND_MODEL"):
        raise ModelConfigError(f"{path}.gpus cannot be given with {kind}")
    return InstanceGroup(count=group.count, kind=kind, gpus=gpus)


def _version_policy(config: Any) -> VersionPolicy:
    if not config.HasField("version_policy"):
        return VersionPolicy()
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy(kind="all")
    if choice == "specific":
        versions = tuple(int(v) for v in policy.specific.versions)
        if not versions or min(versions) < 0:
            raise ModelConfigError(
                "version_policy.specific.versions must list version numbers (0 or more)"
            )
        return VersionPolicy(kind="specific", versions=versions)
    if choice == "latest" and policy.latest.num_versions < 1:
        raise ModelConfigError("version_policy.latest.num_versions must be at least 1")
    num = policy.latest.num_versions if choice == "latest" else 1
    return VersionPolicy(kind="latest", num_versions=num)


def _served_by_us(config: Any) -> Review:
    """Refuse what oipserve cannot serve: other runtimes, refused fields, decoupled."""
    platform_ok = config.platform in PLATFORMS or config.platform == ENSEMBLE_PLATFORM
    if not platform_ok or config.backend not in BACKENDS:
        raise ModelConfigError(
            "only ONNX models (platform onnxruntime_onnx, backend onnxruntime) and ensembles "
            "(platform ensemble) are served; "
            f"config.pbtxt says platform={config.platform!r} backend={config.backend!r}"
        )
    if config.model_transaction_policy.decoupled:
        raise ModelConfigError(
            "model_transaction_policy.decoupled: decoupled models are not supported by oipserve"
        )
    reviewed = review(config)
    refused = reviewed.refused
    if refused:
        raise ModelConfigError(
            "config.pbtxt asks for what oipserve does not support: " + "; ".join(refused)
        )
    return reviewed


def _typed(config: Any) -> ModelConfig:
    meaningless = meaningless_value(config)
    if meaningless:
        raise ModelConfigError(meaningless)
    if config.max_batch_size < 0:
        raise ModelConfigError(f"max_batch_size must be 0 or more, got {config.max_batch_size}")
    tensors: dict[str, tuple[TensorConfig, ...]] = {}
    for key in ("input", "output"):
        seen: set[str] = set()
        entries = getattr(config, key)
        tensors[key] = tuple(
            _tensor(e, f"{key}[{i}]", seen, config.max_batch_size > 0)
            for i, e in enumerate(entries)
        )
    groups = tuple(
        _instance_group(g, f"instance_group[{i}]") for i, g in enumerate(config.instance_group)
    )
    try:
        ensemble = ensemble_scheduling(config)
    except EnsembleError as exc:
        raise ModelConfigError(str(exc)) from None
    reviewed = _served_by_us(config)
    batching = None
    if config.HasField("dynamic_batching"):
        try:
            batching = batch_policy(
                config.dynamic_batching, config.max_batch_size, config.name or "this model"
            )
        except BatchPolicyError as exc:
            raise ModelConfigError(f"dynamic_batching: {exc}") from None
    sequence = None
    if config.HasField("sequence_batching"):
        try:
            sequence = sequence_policy(config)
        except SequenceConfigError as exc:
            raise ModelConfigError(str(exc)) from None
    try:
        ragged = batch_io(config)
    except BatchIOError as exc:
        raise ModelConfigError(f"{exc} for {config.name or 'this model'}") from None
    try:
        padding = pad_batch(config)
    except PadBatchError as exc:
        raise ModelConfigError(str(exc)) from None
    try:
        buckets, unused_metrics = histogram_buckets(config.model_metrics)
    except ValueError as exc:
        raise ModelConfigError(str(exc)) from None
    return ModelConfig(
        name=config.name or None,
        platform=config.platform or None,
        backend=config.backend or None,
        max_batch_size=config.max_batch_size,
        inputs=tensors["input"],
        outputs=tensors["output"],
        instance_groups=groups,
        parameters={k: v.string_value for k, v in sorted(config.parameters.items())},
        default_model_filename=_model_filename(config.default_model_filename) or None,
        version_policy=_version_policy(config),
        dynamic_batching=batching,
        histogram_buckets=buckets,
        graph_level=config.optimization.graph.level,
        response_cache=config.response_cache.enable,
        ignored=(*reviewed.ignored, *unused_metrics),
        document=message_json(config),
        batch_io=ragged,
        pad_batch=padding,
        sequence_batching=sequence,
        ensemble=ensemble,
    )


def _model_filename(name: str) -> str:
    """``default_model_filename``, a file name in each version directory, nothing more.

    A path (``../../other/model.onnx``, ``/etc/x``) would let a load's ``config`` point a
    worker at any file the server can read; refused.
    """
    if name and (name in (".", "..") or any(c in name for c in "/\\\0")):
        raise ModelConfigError(
            f"default_model_filename '{name}' must be a file name in the version directory, "
            "not a path"
        )
    return name


# --------------------------------------------------------------------------- public API


def config_from_message(message: Any) -> ModelConfig:
    """An ``inference.ModelConfig`` message checked and typed as a config.pbtxt is: the
    configuration auto-complete made from a partial one and the ONNX graph
    (``oipserve.models.autofill``)."""
    return _typed(message)


def parse_model_config(text: str) -> ModelConfig:
    """Parse the text of a Triton config.pbtxt; raise ModelConfigError if it is invalid."""
    _check_length(len(text), "characters")
    message = mc.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        # NOTE: str(exc) starts "LINE:COLUMN : "; ours says "line L, column C: " instead.
        detail = _POSITION.sub("", str(exc))
        raise ModelConfigError(detail, exc.GetLine(), exc.GetColumn()) from None
    return _typed(message)


def parse_model_config_json(text: str) -> ModelConfig:
    """Parse a configuration given as JSON (a load's ``config`` parameter), as Triton does.

    The JSON is protobuf's JSON mapping of the same ``ModelConfig`` message (so
    ``{"max_batch_size": "16"}`` is valid, as is ``maxBatchSize``), parsed by protobuf's
    ``json_format``; then come the same checks as for a config.pbtxt.
    """
    _check_length(len(text), "characters")
    _check_surrogates(text)
    if not text.lstrip(" \t\r\n").startswith("{"):
        # NOTE: protobuf's parser walks any JSON root: ``[]`` or ``""`` read as an empty
        #   configuration, and the load replaced config.pbtxt with nothing (found by fuzzing).
        raise ModelConfigError("the configuration must be a JSON object")
    message = mc.ModelConfig()
    try:
        json_format.Parse(text, message)
    except json_format.ParseError as exc:
        # NOTE: an unknown field's message goes on with every field of the message;
        #   its first line says what is wrong.
        raise ModelConfigError(str(exc).partition("\n")[0]) from None
    except RecursionError:
        raise ModelConfigError("the JSON is nested too deeply") from None
    return _typed(message)


def _check_surrogates(text: str) -> None:
    """Refuse JSON whose strings hold a lone UTF-16 surrogate (``"\\ud800"``): it is no
    character, so no name or file can hold it, and protobuf's parser, meeting one as a key,
    fails with an internal error of its own."""
    if "\\ud" not in text.lower():
        return  # PERF: no escape of the surrogate range, nothing to decode
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError):
        return  # not JSON: protobuf's parser says what is wrong
    try:
        json.dumps(decoded, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        return
    except UnicodeEncodeError:
        raise ModelConfigError(
            "a JSON string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), "
            "which is not a character"
        ) from None


def read_model_config(path: Path) -> ModelConfig:
    """Read and parse a config.pbtxt file; errors name the file. OSError passes through."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        # NOTE: a FIFO there blocked the open until a writer came: the start, or the load
        #   and the whole front, hung (found by fuzzing); a device would be read as text.
        raise ModelConfigError(f"{path}: not a regular file")
    with Path(path).open("rb") as file:
        data = file.read(CONFIG_MAX_BYTES + 1)
    try:
        _check_length(len(data), "bytes")
        return parse_model_config(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        message = f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
        raise ModelConfigError(message) from None
    except ModelConfigError as exc:
        located = ModelConfigError(f"{path}: {exc}")
        located.line, located.column = exc.line, exc.column
        raise located from None
