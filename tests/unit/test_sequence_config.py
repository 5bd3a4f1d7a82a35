"""``sequence_batching`` in config.pbtxt: the policy read from it and Triton's load-time
messages for malformed blocks (oipserve.models.config.sequence)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oipserve.models.config.parse import ModelConfigError, parse_model_config
from oipserve.models.config.sequence import SequenceConfigError, read_initial_states
from oipserve.models.metadata import MetadataConflict, merge_metadata
from oipserve.wire.messages import Loaded, TensorMeta

HEAD = 'name: "m"\nmax_batch_size: 8\n'


def _control(name: str, kind: str, values: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {values} }} ] }}'


def test_triton_example_configs_are_read() -> None:
    config = parse_model_config(
        HEAD
        + "sequence_batching { control_input ["
        + _control("START", "START", "int32_false_true: [0, 1]")
        + ","
        + _control("READY", "READY", "fp32_false_true: [0.5, 2]")
        + ","
        + _control("END", "END", "bool_false_true: [false, true]")
        + ","
        + _control("CORRID", "CORRID", "data_type: TYPE_UINT32")
        + "] }"
    )
    policy = config.sequence_batching
    assert policy is not None
    assert policy.strategy == "direct" and policy.idle_ns == 1_000_000_000  # Triton's defaults
    kinds = {c.kind: (c.name, c.datatype, c.false_value, c.true_value) for c in policy.controls}
    assert kinds["START"] == ("START", "INT32", 0, 1)
    assert kinds["READY"] == ("READY", "FP32", 0.5, 2.0)
    assert kinds["END"] == ("END", "BOOL", False, True)
    assert kinds["CORRID"][:2] == ("CORRID", "UINT32")
    assert policy.input_names == {"START", "READY", "END", "CORRID"}


def test_oldest_defaults_to_the_max_batch_size() -> None:
    config = parse_model_config(
        HEAD + "sequence_batching { max_sequence_idle_microseconds: 5000 "
        "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 100 "
        "preserve_ordering: true } }"
    )
    policy = config.sequence_batching
    assert policy is not None and policy.strategy == "oldest"
    assert policy.preferred_batch_sizes == (8,)
    assert policy.max_queue_delay_ns == 100_000 and policy.idle_ns == 5_000_000
    assert policy.max_candidate_sequences == 4 and policy.preserve_ordering


MALFORMED = [
    (
        "control_input [ { control [ { kind: CONTROL_SEQUENCE_START "
        "int32_false_true: [0, 1] } ] } ]",
        "sequence batching control tensor must have a name for m",
    ),
    (
        "control_input [ { name: 'S' control [ { kind: CONTROL_SEQUENCE_START } ] } ]",
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
        "'bool_false_true' for CONTROL_SEQUENCE_START for m",
    ),
    (
        "control_input [ { name: 'S' control [ { kind: CONTROL_SEQUENCE_START "
        "int32_false_true: [0, 1] fp32_false_true: [0, 1] } ] } ]",
        "specifies more than one from 'int32_false_true', 'fp32_false_true' and "
        "'bool_false_true' for CONTROL_SEQUENCE_START for m",
    ),
    (
        "control_input [ { name: 'S' control [ { kind: CONTROL_SEQUENCE_READY "
        "int32_false_true: [0, 1, 2] } ] } ]",
        "sequence batching control 'int32_false_true' must have exactly 2 entries for "
        "CONTROL_SEQUENCE_READY for m",
    ),
    (
        "control_input [ "
        + _control("A", "START", "int32_false_true: [0, 1]")
        + ","
        + _control("B", "START", "int32_false_true: [0, 1]")
        + "]",
        "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
    ),
    (
        "control_input [ "
        + _control("A", "START", "int32_false_true: [0, 1]")
        + ","
        + _control("A", "END", "int32_false_true: [0, 1]")
        + "]",
        "sequence batching control tensor 'A' is specified for multiple control kinds for m",
    ),
    (
        "control_input [ " + _control("C", "CORRID", "data_type: TYPE_FP32") + "]",
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types "
        "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
    ),
    (
        "oldest { preferred_batch_size: [ 16 ] }",
        "sequence batching preferred batch size must be <= max batch size for m",
    ),
    (
        "oldest { preferred_batch_size: [ 0 ] }",
        "sequence batching preferred batch size must be positive for m",
    ),
    (
        "direct { minimum_slot_utilization: 1.5 }",
        "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
    ),
    (
        "state [ { input_name: 'I' output_name: 'O' data_type: TYPE_INT32 dims: [1] "
        "initial_state [ { data_type: TYPE_FP32 dims: [1] zero_data: true name: 'z' } ] } ]",
        "The data type used for 'initial_state' field of state 'I' does not match the state "
        "data type.",
    ),
    (
        "state [ { input_name: 'I' output_name: 'O' data_type: TYPE_INT32 dims: [1] "
        "initial_state [ { data_type: TYPE_INT32 dims: [1] zero_data: true } ] } ]",
        "Field 'name' must be set when using initial_state for state input 'I'.",
    ),
    (
        "state [ { input_name: 'I' output_name: 'O' data_type: TYPE_INT32 dims: [-1] "
        "initial_state [ { data_type: TYPE_INT32 dims: [-1] zero_data: true name: 'z' } ] } ]",
        "'initial_state' field for state input name 'I' contains variable dimensions.",
    ),
    (
        "state [ { input_name: 'I' output_name: 'O' data_type: TYPE_INT32 dims: [2] "
        "initial_state [ { data_type: TYPE_INT32 dims: [3] zero_data: true name: 'z' } ] } ]",
        "'initial_state' dim for input name 'I' doesn't match 'state' dim description. 3 != 2",
    ),
    (
        "state [ { input_name: 'I' output_name: 'O' data_type: TYPE_INT32 dims: [1] },"
        " { input_name: 'I' output_name: 'P' data_type: TYPE_INT32 dims: [1] } ]",
        "State input name 'I' specified more than once.",
    ),
    ("iterative_sequence: true", "sequence_batching.iterative_sequence: not supported"),
]


@pytest.mark.parametrize(("block", "message"), MALFORMED)
def test_malformed_blocks_fail_with_tritons_message(block: str, message: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(HEAD + f"sequence_batching {{ {block} }}")
    assert message in str(info.value)


def test_response_cache_is_refused_with_sequences() -> None:
    with pytest.raises(ModelConfigError, match="Response Cache does not currently support"):
        parse_model_config(HEAD + "sequence_batching { }\nresponse_cache { enable: true }")


def test_initial_state_data_file_is_read(tmp_path: Path) -> None:
    block = (
        "state [ { input_name: 'I' output_name: 'O' data_type: TYPE_INT32 dims: [2] "
        "initial_state [ { data_type: TYPE_INT32 dims: [2] data_file: 'init' name: 'x' } ] } ]"
    )
    policy = parse_model_config(HEAD + f"sequence_batching {{ {block} }}").sequence_batching
    assert policy is not None
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init").write_bytes(b"\x01\x00\x00\x00")
    with pytest.raises(SequenceConfigError, match="expects 8 bytes, but the data provided"):
        read_initial_states(policy, tmp_path)
    (tmp_path / "initial_state" / "init").write_bytes(bytes(range(10)))
    assert read_initial_states(policy, tmp_path).states[0].initial_data == bytes(range(8))


def test_control_and_state_tensors_are_not_client_inputs() -> None:
    config = parse_model_config(
        HEAD
        + "sequence_batching { control_input ["
        + _control("START", "START", "int32_false_true: [0, 1]")
        + "] state [ { input_name: 'S_IN' output_name: 'S_OUT' data_type: TYPE_INT32 "
        "dims: [1] } ] }\n"
        "input [ { name: 'INPUT' data_type: TYPE_INT32 dims: [1] } ]\n"
        "output [ { name: 'OUTPUT' data_type: TYPE_INT32 dims: [1] } ]"
    )
    metas = [TensorMeta(n, "INT32", [-1, 1]) for n in ("INPUT", "START", "S_IN")]
    outs = [TensorMeta(n, "INT32", [-1, 1]) for n in ("OUTPUT", "S_OUT")]
    inputs, outputs = merge_metadata(config, Loaded(1, "m/1", metas, outs, []))
    assert [t.name for t in inputs] == ["INPUT"]
    assert [t.name for t in outputs] == ["OUTPUT"]


def test_controls_and_states_must_be_in_the_graph() -> None:
    config = parse_model_config(
        HEAD
        + "sequence_batching { control_input ["
        + _control("START", "START", "int32_false_true: [0, 1]")
        + "] state [ { input_name: 'S_IN' output_name: 'S_OUT' data_type: TYPE_INT32 "
        "dims: [1] } ] }\n"
        "input [ { name: 'INPUT' data_type: TYPE_INT32 dims: [1] } ]\n"
        "output [ { name: 'OUTPUT' data_type: TYPE_INT32 dims: [1] } ]"
    )
    outs = [TensorMeta(n, "INT32", [-1, 1]) for n in ("OUTPUT", "S_OUT")]
    cases = [
        (["INPUT", "S_IN"], "INT32", "control input 'START' (CONTROL_SEQUENCE_START) is not "
         "among the ONNX graph's inputs ['INPUT', 'S_IN']"),
        (["INPUT", "START", "S_IN"], "FP32", "control input 'START' (CONTROL_SEQUENCE_START) is "
         "INT32 but the ONNX graph has FP32"),
        (["INPUT", "START"], "INT32", "state input 'S_IN' is not among the ONNX graph's inputs"),
    ]  # fmt: skip
    for names, start_type, message in cases:
        metas = [TensorMeta(n, start_type if n == "START" else "INT32", [-1, 1]) for n in names]
        with pytest.raises(MetadataConflict, match=re.escape(message)):
            merge_metadata(config, Loaded(1, "m/1", metas, outs, []))
    metas = [TensorMeta(n, "INT32", [-1, 1]) for n in ("INPUT", "START", "S_IN")]
    with pytest.raises(MetadataConflict, match="state output 'S_OUT' is not among"):
        merge_metadata(config, Loaded(1, "m/1", metas, outs[:1], []))
