"""Tests for the Triton config.pbtxt reader: accepted syntax, typed result, precise errors."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from oipserve.model_config import (
    InstanceGroup,
    ModelConfig,
    ModelConfigError,
    TensorConfig,
    parse_model_config,
    read_model_config,
)
from oipserve.wire.datatypes import DATATYPES

REPO_ROOT = Path(__file__).resolve().parents[2]

# Triton's docs/examples/model_repository/simple/config.pbtxt, verbatim layout.
TRITON_SIMPLE = """\
name: "simple"
platform: "tensorflow_graphdef"
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
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""


def test_triton_simple_config() -> None:
    config = parse_model_config(TRITON_SIMPLE)
    tensor = TensorConfig
    assert config == ModelConfig(
        name="simple",
        platform="tensorflow_graphdef",
        max_batch_size=8,
        inputs=(tensor("INPUT0", "INT32", (16,)), tensor("INPUT1", "INT32", (16,))),
        outputs=(tensor("OUTPUT0", "INT32", (16,)), tensor("OUTPUT1", "INT32", (16,))),
    )


def test_committed_simple_config() -> None:
    config = read_model_config(REPO_ROOT / "model-repository" / "simple" / "config.pbtxt")
    assert config.name == "simple"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8
    assert [t.name for t in config.inputs] == ["INPUT0", "INPUT1"]
    assert [t.name for t in config.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert all(t.data_type == "INT32" and t.dims == (16,) for t in config.inputs + config.outputs)
    assert config.instance_groups == (InstanceGroup(count=1, kind="KIND_CPU"),)


def test_empty_config_gives_defaults() -> None:
    config = parse_model_config("  # nothing but a comment\n")
    assert config == ModelConfig()
    assert config.parameters == {} and config.extra == {}


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
        "intra_op_thread_count": "4",
        "cudnn_conv_algo_search": "HEURISTIC",
        "empty": "",
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
        InstanceGroup(count=1, kind="KIND_CPU"),
        InstanceGroup(count=3, kind="KIND_MODEL"),
        InstanceGroup(count=1, kind="KIND_AUTO", gpus=(3, 5)),
    )


def test_syntax_variants() -> None:
    config = parse_model_config(
        """# leading comment
        name: 'with \\'quotes\\' and \\x41\\101\\u00e9' # trailing comment
        backend: "onnx" "runtime";   # adjacent strings concatenate
        max_batch_size: 0x10,
        default_model_filename: "model.onnx"
        input < name: "a" data_type: TYPE_FP32 dims: [-1, 3] >
        input { name: "b", data_type: TYPE_STRING; dims: 1 dims: -1 }
        input: [ { name: "c" data_type: TYPE_BF16 dims: [] format: FORMAT_NONE optional: true } ]
        output [ ]
        output { name: "o" data_type: TYPE_BOOL dims: [ 2 ] reshape: { shape: [ ] } }
        """
    )
    assert config.name == "with 'quotes' and AAé"
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 16
    assert config.default_model_filename == "model.onnx"
    assert config.inputs == (
        TensorConfig("a", "FP32", (-1, 3)),
        TensorConfig("b", "BYTES", (1, -1)),
        TensorConfig("c", "BF16", ()),
    )
    assert config.outputs == (TensorConfig("o", "BOOL", (2,)),)


def test_known_but_unused_fields_kept_in_extra() -> None:
    config = parse_model_config(
        """
        name: "m"
        version_policy: { specific { versions: [ 1, 3 ] } }
        dynamic_batching {
          preferred_batch_size: [ 4, 8 ]
          max_queue_delay_microseconds: 100
        }
        optimization { execution_accelerators {
          gpu_execution_accelerator : [ {
            name : "tensorrt"
            parameters { key: "precision_mode" value: "FP16" }
          } ]
        } }
        response_cache { enable: true }
        model_warmup { name: "w" batch_size: 1 }
        model_warmup { name: "x" batch_size: 2 }
        metric_tags { key: "team" value: "ml" }
        """
    )
    assert config.name == "m"
    assert config.extra == {
        "version_policy": {"specific": {"versions": [1, 3]}},
        "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 100},
        "optimization": {
            "execution_accelerators": {
                "gpu_execution_accelerator": [
                    {
                        "name": "tensorrt",
                        "parameters": {"key": "precision_mode", "value": "FP16"},
                    }
                ]
            }
        },
        "response_cache": {"enable": True},
        "model_warmup": [{"name": "w", "batch_size": 1}, {"name": "x", "batch_size": 2}],
        "metric_tags": [{"key": "team", "value": "ml"}],
    }


def test_numbers_in_extra() -> None:
    config = parse_model_config(
        "model_metrics { metric_control { histogram_options {"
        " buckets: [ -5.0, -2, 0, 3.5, 1e3, 2f, -inf ] } } }"
    )
    buckets = config.extra["model_metrics"]["metric_control"]["histogram_options"]["buckets"]
    assert buckets == [-5.0, -2, 0, 3.5, 1000.0, 2.0, float("-inf")]


def test_every_triton_datatype_name_parses() -> None:
    for row in DATATYPES.values():
        text = f'input {{ name: "x" data_type: {row.triton} dims: [1] }}'
        assert parse_model_config(text).inputs[0].data_type == row.name


def test_config_is_frozen() -> None:
    config = parse_model_config(TRITON_SIMPLE)
    with pytest.raises(AttributeError):
        config.name = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.inputs[0].dims = (1,)  # type: ignore[misc]


def test_config_encodes_as_json() -> None:
    config = parse_model_config(TRITON_SIMPLE)
    decoded = msgspec.json.decode(msgspec.json.encode(config), type=ModelConfig)
    assert decoded == config


# (config text, substring of the message, line, column)
SYNTAX_ERRORS = [
    ('name: "simple', "unterminated string", 1, 7),
    ('name: "two\nlines"', "unterminated string", 1, 7),
    ("input {\n  name: 'x'\n", "expected '}' to close '{' opened at line 1, column 7", 3, 1),
    ("input < name: 'x' }", "expected a field name, got '}'", 1, 19),
    ("name: @", "unexpected character '@'", 1, 7),
    ('name "simple"', "expected ':' or '{' after field name 'name'", 1, 6),
    ("max_batch_size:", "expected a value for field 'max_batch_size', got end of input", 1, 16),
    ("max_batch_size: }", "expected a value for field 'max_batch_size', got '}'", 1, 17),
    ("input { dims: [1 2] }", "expected ',' or ']' in list, got '2'", 1, 18),
    ("input { dims: [1, ] }", "expected a value, got ']'", 1, 19),
    ("input { dims: [1, 2 }", "expected ',' or ']' in list, got '}'", 1, 21),
    ("}", "expected a field name, got '}'", 1, 1),
    ("\n\n  : 3", "expected a field name, got ':'", 3, 3),
    ('name: "bad \\q escape"', "unknown escape sequence \\q", 1, 12),
    ('name: "\\u12"', "\\u escape needs 4 hex digits", 1, 8),
    ('name: "\\xZZ"', "\\x escape needs hex digits", 1, 8),
    ('name: "\\777"', "octal escape out of range", 1, 8),
    ('name: "\\xff"', "string is not valid UTF-8", 1, 7),
    ("max_batch_size: 16abc", "invalid token starting '16'", 1, 17),
    ("max_batch_size: 09", "invalid integer literal '09'", 1, 17),
    ("max_batch_size: -x", "expected a number after '-', got 'x'", 1, 17),
    ("max_batch_size: - 1", "unexpected character '-'", 1, 17),
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


# (config text, substring of the message)
SEMANTIC_ERRORS = [
    ("max_batch_sise: 8", "unknown field 'max_batch_sise'"),
    ('name: "a"\nname: "b"', "name is specified more than once"),
    ('name: [ "a" ]', "name is not a repeated field"),
    ("name: simple", "name must be a quoted string, got 'simple'"),
    ("name { }", "name must be a value, not a message"),
    ('max_batch_size: "8"', "max_batch_size must be an integer, got '\"8\"'"),
    ("max_batch_size: 1.5", "max_batch_size must be an integer, got '1.5'"),
    ("max_batch_size: -1", "max_batch_size out of range: -1"),
    ("max_batch_size: 4294967296", "max_batch_size out of range: 4294967296"),
    ("input: 3", "input[0] must be a message"),
    ("dynamic_batching { }\nsequence_batching { }", "only one of"),
    (_tensor_text("data_type: TYPE_FP32 dims: [1]"), "input[0].name is required"),
    (_tensor_text('name: "" data_type: TYPE_FP32 dims: [1]'), "input[0].name must not be empty"),
    (_tensor_text('name: "x" dims: [1]'), "input[0] ('x').data_type is required"),
    (_tensor_text('name: "x" data_type: TYPE_FP32'), "input[0] ('x').dims is required"),
    (
        _tensor_text('name: "x" data_type: TYPE_FP128 dims: [1]'),
        "input[0] ('x').data_type: unknown data type 'TYPE_FP128'",
    ),
    (
        _tensor_text('name: "x" data_type: "TYPE_FP32" dims: [1]'),
        "input[0] ('x').data_type must be an enum name",
    ),
    (_tensor_text('name: "x" data_type: TYPE_INVALID dims: [1]'), "unknown data type"),
    (_tensor_text('name: "x" data_type: TYPE_FP32 dims: [4, -2]'), "dims: -2 is invalid"),
    (_tensor_text('name: "x" data_type: TYPE_FP32 dims: [0]'), "dims: 0 is invalid"),
    (_tensor_text('name: "x" data_type: TYPE_FP32 dims: [1.0]'), "dims must be an integer"),
    (_tensor_text('name: "x" data_type: TYPE_FP32 dims: [1] shape: [1]'), "unknown field"),
    (
        'output { name: "x" data_type: TYPE_FP32 dims: [1] format: FORMAT_NHWC }',
        "unknown field 'output[0].format'",
    ),
    (
        'input { name: "x" data_type: TYPE_FP32 dims: [1] }\n'
        'input { name: "x" data_type: TYPE_FP32 dims: [2] }',
        "input 'x' is specified more than once",
    ),
    ("instance_group { kind: KIND_TPU }", "instance_group[0].kind: unknown kind 'KIND_TPU'"),
    ("instance_group { kind: 'KIND_CPU' }", "instance_group[0].kind must be an enum name"),
    ("instance_group { count: 0 }", "instance_group[0].count must be at least 1, got 0"),
    ("instance_group { gpus: [-1] }", "instance_group[0].gpus out of range: -1"),
    (
        "instance_group [ {}, { kind: KIND_CPU gpus: [0] } ]",
        "instance_group[1].gpus cannot be given with KIND_CPU",
    ),
    ('parameters { value { string_value: "v" } }', "parameters.key is required"),
    (
        'parameters { key: "k" value { string_value: "1" } }\n'
        'parameters { key: "k" value { string_value: "2" } }',
        "parameters['k'] is specified more than once",
    ),
    ('parameters { key: "k" value: "v" }', "parameters['k'].value must be a message"),
    ('parameters { key: "k" value { int_value: 1 } }', "unknown field"),
]


@pytest.mark.parametrize(("text", "message"), SEMANTIC_ERRORS)
def test_semantic_errors(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(text)
    assert message in str(info.value)
    assert info.value.line is not None and info.value.column is not None


def test_semantic_error_points_at_the_value() -> None:
    text = 'input {\n  name: "x"\n  data_type: TYPE_FP32\n  dims: [ 3, -7 ]\n}\n'
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(text)
    assert (info.value.line, info.value.column) == (4, 14)


def test_model_config_error_is_value_error() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        parse_model_config("nonsense: 1")


def test_read_model_config_names_file(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: -3\n', encoding="utf-8")
    with pytest.raises(ModelConfigError) as info:
        read_model_config(path)
    assert str(info.value).startswith(f"{path}: line 2, column 17: max_batch_size out of range")
    assert (info.value.line, info.value.column) == (2, 17)

    path.write_bytes(b'name: "\xff"\n')
    with pytest.raises(ModelConfigError, match="not valid UTF-8"):
        read_model_config(path)

    path.write_text('name: "m" # ok\n', encoding="utf-8")
    assert read_model_config(path).name == "m"
    with pytest.raises(FileNotFoundError):
        read_model_config(tmp_path / "missing.pbtxt")
