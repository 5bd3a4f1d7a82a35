"""Tests for the config.pbtxt reader: Triton's syntax and schema, typed result, precise errors,
and oipserve's disposition of every field (honoured, refused, or ignored with a warning)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import text_format

from oipserve.grpc_generated import model_config_pb2 as mc
from oipserve.models.config.fields import DISPOSITIONS, Disposition
from oipserve.models.config.parse import (
    InstanceGroup,
    ModelConfig,
    ModelConfigError,
    TensorConfig,
    VersionPolicy,
    parse_model_config,
    read_model_config,
)
from oipserve.models.config.session_options import session_options
from oipserve.wire.datatypes import DATATYPES

REPO_ROOT = Path(__file__).resolve().parents[2]

# Triton's docs/examples/model_repository/simple/config.pbtxt layout, for ONNX Runtime.
TRITON_SIMPLE = """\
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""


def test_triton_simple_config() -> None:
    config = parse_model_config(TRITON_SIMPLE)
    tensor = TensorConfig
    assert config.name == "simple" and config.platform == "onnxruntime_onnx"
    assert config.backend is None and config.max_batch_size == 8
    assert config.inputs == (tensor("INPUT0", "INT32", (16,)), tensor("INPUT1", "INT32", (16,)))
    assert config.outputs == (tensor("OUTPUT0", "INT32", (16,)),)
    assert config.version_policy == VersionPolicy("latest", 1)
    assert config.ignored == ()


def test_committed_simple_config() -> None:
    config = read_model_config(REPO_ROOT / "model-repository" / "simple" / "config.pbtxt")
    assert config.name == "simple"
    assert [t.name for t in config.inputs] == ["INPUT0", "INPUT1"]
    assert all(t.data_type == "INT32" and t.dims == (16,) for t in config.inputs + config.outputs)
    assert config.instance_groups == (InstanceGroup(count=1, kind="KIND_CPU"),)


def test_empty_config_gives_defaults() -> None:
    config = parse_model_config("  # nothing but a comment\n")
    assert config == ModelConfig()
    assert config.parameters == {} and config.document == {}


def test_parameters_both_spellings() -> None:
    config = parse_model_config(
        """
        parameters { key: "intra_op_thread_count" value: { string_value: "4" } }
        parameters: {
          key: 'cudnn_conv_algo_search'
          value { string_value: "HEURISTIC" }
        }
        parameters [ { key: "empty" value: { } } ]
        """
    )
    assert config.parameters == {
        "cudnn_conv_algo_search": "HEURISTIC",
        "empty": "",
        "intra_op_thread_count": "4",
    }


def test_instance_groups() -> None:
    config = parse_model_config(
        """
        instance_group [
          { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] },
          { kind: KIND_CPU },
          { name: "m" count: 3 kind: KIND_MODEL },
          { gpus: 3 gpus: 5 }
        ]
        """
    )
    assert config.instance_groups == (
        InstanceGroup(count=2, kind="KIND_GPU", gpus=(0, 1)),
        InstanceGroup(count=0, kind="KIND_CPU"),  # not given: Triton's default when placed
        InstanceGroup(count=3, kind="KIND_MODEL"),
        InstanceGroup(count=0, kind="KIND_AUTO", gpus=(3, 5)),
    )


def test_syntax_variants() -> None:
    config = parse_model_config(
        """# leading comment
        name: 'with \\'quotes\\' and \\x41\\101' # trailing comment
        backend: "onnx" "runtime";   # adjacent strings concatenate
        max_batch_size: 0x10,
        default_model_filename: "model.onnx"
        input < name: "a" data_type: TYPE_FP32 dims: [-1, 3] >
        input { name: "b", data_type: TYPE_STRING; dims: 1 dims: -1 }
        input: [ { name: "c" data_type: TYPE_BF16 dims: [] format: FORMAT_NONE optional: true } ]
        output [ ]
        output { name: "o" data_type: TYPE_BOOL dims: [ 1 ] reshape: { shape: [ ] } }
        """
    )
    assert config.name == "with 'quotes' and AA"
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 16
    assert config.default_model_filename == "model.onnx"
    assert config.inputs == (
        TensorConfig("a", "FP32", (-1, 3)),
        TensorConfig("b", "BYTES", (1, -1)),
        TensorConfig("c", "BF16", (), optional=True),
    )
    assert config.outputs == (TensorConfig("o", "BOOL", (1,), reshape=()),)


def test_every_triton_datatype_name_parses() -> None:
    for row in DATATYPES.values():
        text = f'input {{ name: "x" data_type: {row.triton} dims: [1] }}'
        assert parse_model_config(text).inputs[0].data_type == row.name


@pytest.mark.parametrize(
    ("text", "policy", "available", "served"),
    [
        ("", VersionPolicy("latest", 1), [3, 1, 2], [3]),
        (
            "version_policy { latest { num_versions: 2 } }",
            VersionPolicy("latest", 2),
            [1, 3, 2],
            [2, 3],
        ),
        ("version_policy { all { } }", VersionPolicy("all"), [2, 1], [1, 2]),
        (
            "version_policy: { specific { versions: [ 1, 3 ] } }",
            VersionPolicy("specific", versions=(1, 3)),
            [1, 2],
            [1],
        ),
    ],
)
def test_version_policy(
    text: str, policy: VersionPolicy, available: list[int], served: list[int]
) -> None:
    config = parse_model_config(text)
    assert config.version_policy == policy
    assert config.version_policy.select(available) == served


def test_document_is_tritons_json_with_integer_numbers() -> None:
    config = parse_model_config(
        TRITON_SIMPLE
        + """
        version_policy { specific { versions: [ 3 ] } }
        dynamic_batching { max_queue_delay_microseconds: 100 priority_levels: 2
          default_priority_level: 1 priority_queue_policy {
          key: 2 value { timeout_action: DELAY default_timeout_microseconds: 7 } } }
        """
    )
    assert config.document["input"][0] == {
        "name": "INPUT0",
        "data_type": "TYPE_INT32",
        "dims": [16],
    }
    assert config.document["version_policy"] == {"specific": {"versions": [3]}}
    assert config.document["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100,
        "priority_levels": 2,
        "default_priority_level": 1,
        "priority_queue_policy": {
            "2": {"timeout_action": "DELAY", "default_timeout_microseconds": 7}
        },
    }


# --------------------------------------------------------------------------- dispositions


def test_disposition_table_covers_every_field_of_the_schema() -> None:
    messages = (
        mc.ModelConfig,
        mc.ModelInput,
        mc.ModelOutput,
        mc.ModelInstanceGroup,
        mc.ModelDynamicBatching,
        mc.ModelQueuePolicy,
        mc.ModelEnsembling,
        mc.ModelEnsembling.Step,
        mc.ModelOptimizationPolicy,
    )
    for message in messages:
        descriptor = message.DESCRIPTOR
        names = {f.name for f in descriptor.fields}
        assert set(DISPOSITIONS[descriptor.full_name]) == names, descriptor.full_name
    assert set(DISPOSITIONS) == {
        "inference.ModelConfig",
        "inference.ModelInput",
        "inference.ModelOutput",
        "inference.ModelInstanceGroup",
        "inference.ModelDynamicBatching",
        "inference.ModelQueuePolicy",
        "inference.ModelEnsembling",
        "inference.ModelEnsembling.Step",
        "inference.ModelOptimizationPolicy",
    }


def test_ignored_fields_are_listed_by_path() -> None:
    config = parse_model_config(
        """
        optimization { execution_accelerators { gpu_execution_accelerator : [ {
            name : "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ] } }
        response_cache { enable: true }
        model_warmup { name: "w" batch_size: 1 }
        metric_tags { key: "team" value: "ml" }
        input { name: "x" data_type: TYPE_FP32 dims: [1] allow_ragged_batch: true }
        output { name: "y" data_type: TYPE_FP32 dims: [1] label_filename: "labels.txt" }
        instance_group { host_policy: "numa0" }
        """
    )
    assert set(config.ignored) == {
        "optimization.execution_accelerators",
        "model_warmup",
        "metric_tags",
        "instance_group[0].host_policy",
    }
    assert config.outputs[0].label_filename == "labels.txt"  # honoured: read at load
    assert config.response_cache  # honoured: the response cache (docs/cache.md)
    # Defaults do not count as given: a false flag is not an ignored field.
    assert parse_model_config("instance_group { passive: false }").ignored == ()


def test_the_graph_optimization_level_is_honoured() -> None:
    """Triton's ONNX Runtime backend's table: -1 basic, 1 extended, 2 none, any other all."""
    config = parse_model_config("optimization { graph { level: -1 } priority: PRIORITY_MAX }")
    assert config.ignored == ("optimization.priority",)
    assert config.graph_level == -1
    levels = {
        level: session_options("m", {}, level).get("graph_optimization_level")
        for level in (0, -1, 1, 2, 3)
    }
    assert levels == {
        0: None,  # not given: ONNX Runtime's default, which is Triton's (all)
        -1: "ORT_ENABLE_BASIC",
        1: "ORT_ENABLE_EXTENDED",
        2: "ORT_DISABLE_ALL",
        3: "ORT_ENABLE_ALL",
    }


def test_every_warned_field_is_reported_and_every_refused_one_refused() -> None:
    """Drive the table itself: give each field a non-default value and check the outcome."""
    for name, rule in DISPOSITIONS["inference.ModelConfig"].items():
        if rule.disposition is Disposition.HONOURED:
            continue
        message = mc.ModelConfig()
        field = message.DESCRIPTOR.fields_by_name[name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, name)["k"] = field.message_type.fields_by_name["value"].default_value
        elif field.is_repeated:
            getattr(message, name).add()
        elif field.message_type is not None:
            getattr(message, name).SetInParent()
        else:
            setattr(message, name, "x")
        text = text_format.MessageToString(message)
        if rule.disposition is Disposition.WARNED:
            assert parse_model_config(text).ignored == (name,), name
        else:
            with pytest.raises(ModelConfigError, match=f"{name}: {rule.note}"):
                parse_model_config(text)


# (config text, substring of the message)
REFUSED = [
    ('platform: "tensorflow_graphdef"', "only ONNX models"),
    ('backend: "python"', "backend='python'"),
    (
        "sequence_batching { iterative_sequence: true }",
        "sequence_batching.iterative_sequence: not supported by oipserve",
    ),
    ("ensemble_scheduling { }", "ensemble scheduling cannot be set for model"),
    (
        'input { name: "s" data_type: TYPE_INT32 dims: [1] is_shape_tensor: true }',
        "input['s'].is_shape_tensor: shape tensors are TensorRT-only",
    ),
    (
        'output { name: "s" data_type: TYPE_INT32 dims: [1] is_shape_tensor: true }',
        "output['s'].is_shape_tensor",
    ),
    ("instance_group { passive: true }", "instance_group[0].passive"),
    ("model_transaction_policy { decoupled: true }", "decoupled models are not supported"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_refused(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(text)
    assert message in str(info.value)


# --------------------------------------------------------------------------- errors

# (config text, substring of the message, line, column)
SYNTAX_ERRORS = [
    ('name: "simple', "String missing ending quote", 1, 7),
    ("input {\n  name: 'x'\n", 'Expected "}"', 2, 9),
    ("max_batch_sise: 8", 'has no field named "max_batch_sise"', 1, 1),
    ('name: "a"\nname: "b"', 'should not have multiple "name" fields', 2, 7),
    ("name: simple", "Expected string but found: 'simple'", 1, 7),
    ("max_batch_size: 1.5", "Couldn't parse integer: 1.5", 1, 17),
    ("max_batch_size: 4294967296", "Value out of range: 4294967296", 1, 17),
    ("input { dims: [1 2] }", 'Expected ","', 1, 18),
    ("max_batch_size: 09", "Couldn't parse integer: 09", 1, 17),
    (
        "dynamic_batching { }\nsequence_batching { }",
        'another member of oneof "scheduling_choice"',
        2,
        1,
    ),
    ("instance_group { kind: KIND_TPU }", "has no value named KIND_TPU", 1, 24),
    ("instance_group { kind: 'KIND_CPU' }", "has no value named 'KIND_CPU'", 1, 24),
    ('input { name: "x" data_type: TYPE_FP128 }', "has no value named TYPE_FP128", 1, 30),
    ('parameters { key: "k" value: "v" }', 'Expected "{"', 1, 30),
    ('parameters { key: "k" value { int_value: 1 } }', 'no field named "int_value"', 1, 31),
    ('name: "\\xff"', "Couldn't parse string", 1, 13),
]


@pytest.mark.parametrize(("text", "message", "line", "column"), SYNTAX_ERRORS)
def test_syntax_errors(text: str, message: str, line: int, column: int) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(text)
    assert message in str(info.value)
    assert (info.value.line, info.value.column) == (line, column)
    assert str(info.value).startswith(f"line {line}, column {column}: ")


def _tensor_text(body: str) -> str:
    return f"input {{ {body} }}"


# (config text, substring of the message): checks the schema cannot express.
SEMANTIC_ERRORS = [
    ("max_batch_size: -1", "max_batch_size must be 0 or more, got -1"),
    (_tensor_text("data_type: TYPE_FP32 dims: [1]"), "input[0].name is required"),
    (_tensor_text('name: "x" dims: [1]'), "input[0] ('x').data_type is required"),
    (_tensor_text('name: "x" data_type: TYPE_INVALID dims: [1]'), "data_type is required"),
    (_tensor_text('name: "x" data_type: TYPE_FP32 dims: [4, -2]'), "dims: -2 is invalid"),
    (_tensor_text('name: "x" data_type: TYPE_FP32 dims: [0]'), "dims: 0 is invalid"),
    # reshape: Triton's rules and words (core's ValidateIOShape; qa/L0_model_config's
    #   reshape_* configs; the last two loaded here until 2026-11-30)
    (
        _tensor_text('name: "x" data_type: TYPE_FP32 dims: [4] reshape { shape: [3] }'),
        "model input 'x' has different size for dims and reshape (input[0] ('x'): dims [4], "
        "reshape [3])",
    ),
    (
        _tensor_text('name: "x" data_type: TYPE_FP32 dims: [-1, 4] reshape { shape: [4] }'),
        "model input 'x' has different size for dims and reshape",
    ),
    (
        _tensor_text('name: "x" data_type: TYPE_FP32 dims: [-1, 4] reshape { shape: [-1, 4, -1] }'),
        "model input 'x' has different number of variable-size dimensions for dims and reshape",
    ),
    (
        _tensor_text('name: "x" data_type: TYPE_FP32 dims: [4] reshape { shape: [0] }'),
        "model input 'x' reshape dimensions must be integer >= 1, or -1 to indicate a "
        "variable-size dimension",
    ),
    (
        'output { name: "y" data_type: TYPE_FP32 dims: [1] reshape { shape: [] } }',
        "model output 'y' cannot have empty reshape for non-batching model as scalar tensors "
        "are not supported",
    ),
    (
        _tensor_text('name: "x" data_type: TYPE_FP32 dims: [2, -1] reshape { shape: [1, -1, 2] }'),
        "model input 'x' has different size for dims and reshape",
    ),
    (
        _tensor_text('name: "x" data_type: TYPE_FP32 dims: [1] format: FORMAT_NHWC'),
        "FORMAT_NHWC needs 3 dims, got [1]",
    ),
    (
        'input { name: "x" data_type: TYPE_FP32 dims: [1] }\n'
        'input { name: "x" data_type: TYPE_FP32 dims: [2] }',
        "input[1] ('x') is specified more than once",
    ),
    ("instance_group { count: -1 }", "instance_group[0].count must be at least 1, got -1"),
    ("instance_group { gpus: [-1] }", "instance_group[0].gpus: -1 is not a GPU index"),
    (
        "instance_group [ {}, { kind: KIND_CPU gpus: [0] } ]",
        "instance_group[1].gpus cannot be given with KIND_CPU",
    ),
    ("version_policy { latest { } }", "num_versions must be at least 1"),
    ("version_policy { specific { } }", "specific.versions must list version numbers"),
]


@pytest.mark.parametrize(("text", "message"), SEMANTIC_ERRORS)
def test_semantic_errors(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(text)
    assert message in str(info.value)


def test_reshape_with_variable_dims() -> None:
    """Triton's example: the sizes between the -1s hold as many elements (2 * 4 = 8, 6 = 1 * 6)."""
    text = _tensor_text(
        'name: "x" data_type: TYPE_FP32 dims: [2, 4, -1, 6] reshape { shape: [8, -1, 1, 6] }'
    )
    assert parse_model_config(text).inputs[0].reshape == (8, -1, 1, 6)


def test_an_empty_reshape_of_a_batching_model() -> None:
    """A scalar per batch item, from dims of one element (Triton's special case)."""
    text = "max_batch_size: 4\n" + _tensor_text(
        'name: "x" data_type: TYPE_FP32 dims: [1, 1] reshape { shape: [] }'
    )
    assert parse_model_config(text).inputs[0].reshape == ()


def test_model_config_error_is_value_error() -> None:
    with pytest.raises(ValueError, match="no field named"):
        parse_model_config("nonsense: 1")


def test_read_model_config_names_file(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: x\n', encoding="utf-8")
    with pytest.raises(ModelConfigError) as info:
        read_model_config(path)
    assert str(info.value).startswith(f"{path}: line 2, column 17: ")
    assert (info.value.line, info.value.column) == (2, 17)

    path.write_bytes(b'name: "\xff"\n')
    with pytest.raises(ModelConfigError, match="not valid UTF-8"):
        read_model_config(path)

    path.write_text('name: "m" # ok\n', encoding="utf-8")
    assert read_model_config(path).name == "m"
    with pytest.raises(FileNotFoundError):
        read_model_config(tmp_path / "missing.pbtxt")


def test_docs_show_the_disposition_table() -> None:
    doc = (REPO_ROOT / "docs" / "model-config.md").read_text(encoding="utf-8")
    for fields in DISPOSITIONS.values():
        for name, rule in fields.items():
            assert f"| `{name}` | {rule.disposition.value} | {rule.note} |" in doc, name


@pytest.mark.parametrize(
    "name", ["../other/1/model.onnx", "/etc/passwd", "sub/model.onnx", "..", "a\\\\b"]
)
def test_default_model_filename_is_a_file_name_not_a_path(name: str) -> None:
    """A load's ``config`` could point a worker at any file the server reads (issue #35)."""
    with pytest.raises(ModelConfigError, match="must be a file name"):
        parse_model_config(f'default_model_filename: "{name}"')


def test_default_model_filename_may_name_another_file() -> None:
    assert parse_model_config('default_model_filename: "net.onnx"').default_model_filename == (
        "net.onnx"
    )


def test_a_config_that_is_no_regular_file_is_refused_unread(tmp_path: Path) -> None:
    """A FIFO as config.pbtxt: its open blocked until a writer came, so the start (or a
    load, and the whole front with it) hung, deaf to SIGTERM (found by fuzzing)."""
    fifo = tmp_path / "config.pbtxt"
    os.mkfifo(fifo)
    with pytest.raises(ModelConfigError, match="not a regular file"):
        read_model_config(fifo)
    with pytest.raises(FileNotFoundError):  # a missing file is still the caller's to judge
        read_model_config(tmp_path / "none.pbtxt")


def test_durations_past_int64_nanoseconds_are_refused() -> None:
    """A queue delay whose nanoseconds overflowed the message to the other front: a front's
    start failed, or a load was a 500 and that front was lost (found by fuzzing)."""
    with pytest.raises(ModelConfigError, match="max_queue_delay_microseconds: 18446744073709552"):
        parse_model_config("dynamic_batching { max_queue_delay_microseconds: 18446744073709552 }")
    config = parse_model_config(
        "dynamic_batching { max_queue_delay_microseconds: 9223372036854775 }"
    )
    assert config.dynamic_batching is not None
