"""Auto-complete's rules (Triton's ONNX Runtime backend, ``AutoCompleteConfig``), on the
configuration and graph alone; tests/e2e/test_autofill.py serves such models."""

from __future__ import annotations

import pytest

from oipserve.config.backend_config import BackendConfigError, default_max_batch_size
from oipserve.models.autofill import AutoComplete, complete, completed_metadata
from oipserve.models.config.parse import ModelConfig, ModelConfigError, parse_model_config
from oipserve.models.metadata import MetadataConflict, TensorSpec
from oipserve.wire.messages import Loaded, TensorMeta

ON = AutoComplete()


def _graph(inputs: dict[str, list[int]], outputs: dict[str, list[int]]) -> Loaded:
    return Loaded(
        0,
        "m",
        [TensorMeta(name, "INT32", shape) for name, shape in inputs.items()],
        [TensorMeta(name, "INT8", shape) for name, shape in outputs.items()],
        ["CPUExecutionProvider"],
    )


#: Triton's QA model of autofill_noplatform_success/onnx/no_config: [-1, 16] everywhere.
BATCHABLE = _graph({"INPUT0": [-1, 16], "INPUT1": [-1, 16]}, {"OUTPUT0": [-1, 16]})
#: ... and of no_config_no_batch: [16].
FIXED = _graph({"INPUT0": [16], "INPUT1": [16]}, {"OUTPUT0": [16]})


def _complete(text: str | None, graph: Loaded, policy: AutoComplete = ON) -> ModelConfig:
    given = None if text is None else parse_model_config(text)
    completed = complete(given, graph, "m", policy)
    assert completed is not None
    return completed


def test_a_graph_that_can_batch_gets_max_batch_size_4_and_a_dynamic_batcher() -> None:
    config = _complete(None, BATCHABLE)
    assert config.max_batch_size == 4
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.preferred_batch_sizes == (4,)
    assert [(t.name, t.data_type, t.dims) for t in config.inputs] == [
        ("INPUT0", "INT32", (16,)),
        ("INPUT1", "INT32", (16,)),
    ]
    assert [(t.name, t.data_type, t.dims) for t in config.outputs] == [("OUTPUT0", "INT8", (16,))]
    assert config.document["max_batch_size"] == 4 and config.document["dynamic_batching"] == {}
    assert config.document["input"][0] == {
        "name": "INPUT0",
        "data_type": "TYPE_INT32",
        "dims": [16],
    }


def test_a_fixed_first_dim_keeps_max_batch_size_0() -> None:
    config = _complete(None, FIXED)
    assert config.max_batch_size == 0 and config.dynamic_batching is None
    assert [t.dims for t in config.inputs] == [(16,), (16,)]
    # (one tensor without a variable first dim is enough)
    mixed = _graph({"INPUT0": [-1, 16]}, {"OUTPUT0": [16]})
    assert _complete(None, mixed).max_batch_size == 0
    scalar = _graph({"INPUT0": [-1, 16]}, {"OUTPUT0": []})
    assert _complete(None, scalar).max_batch_size == 0


def test_max_batch_size_0_given_is_filled_too() -> None:
    """proto3 has no presence for max_batch_size: an explicit 0 is unset (Triton alike)."""
    config = _complete(
        'max_batch_size: 0 input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }', BATCHABLE
    )
    assert config.max_batch_size == 4
    assert [t.dims for t in config.inputs] == [(16,)]  # as given
    assert [t.name for t in config.outputs] == ["OUTPUT0"]


def test_a_given_max_batch_size_is_kept_and_gets_a_batcher_past_1() -> None:
    assert _complete("max_batch_size: 8", BATCHABLE).dynamic_batching is not None
    assert _complete("max_batch_size: 8", BATCHABLE).max_batch_size == 8
    assert _complete("max_batch_size: 1", BATCHABLE).dynamic_batching is None
    timed = _complete("dynamic_batching { max_queue_delay_microseconds: 100 }", BATCHABLE)
    assert timed.max_batch_size == 4
    assert timed.dynamic_batching is not None
    assert timed.dynamic_batching.preferred_batch_sizes == (4,)
    assert timed.document["dynamic_batching"] == {"max_queue_delay_microseconds": 100}


def test_a_given_max_batch_size_on_a_graph_that_cannot_batch_is_refused() -> None:
    with pytest.raises(ModelConfigError) as info:
        _complete("max_batch_size: 1", FIXED)
    assert str(info.value) == (
        "autofill failed for model 'm': model does not support batching while non-zero "
        "max_batch_size is specified"
    )


def test_inputs_and_outputs_given_are_left_alone() -> None:
    text = (
        'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1, 16 ] }\n'
        'output { name: "OUTPUT0" data_type: TYPE_INT8 dims: [ -1, 16 ] }\n'
    )
    given = parse_model_config(text)
    assert complete(given, BATCHABLE, "m", ON) is given
    assert complete(None, BATCHABLE, "m", AutoComplete(enabled=False)) is None


def test_a_tensor_left_without_dims_gets_dims_1() -> None:
    """Triton's rule: [-1] batched is dims [1] with reshape [] (shown); unbatched, a scalar
    input is dims [1], fed to the model as a scalar (reshape () here, not shown)."""
    config = _complete(None, _graph({"X": [-1]}, {"Y": [-1]}))
    assert config.max_batch_size == 4
    assert (config.inputs[0].dims, config.inputs[0].reshape) == ((1,), ())
    assert "reshape" in config.document["input"][0]  # (an empty shape: no field to print)
    unbatched = _complete(None, _graph({"X": []}, {"Y": []}))
    assert (unbatched.inputs[0].dims, unbatched.inputs[0].reshape) == ((1,), ())
    assert "reshape" not in unbatched.document["input"][0]
    # (an output of unknown rank has no dims either: answered as the model makes it)
    assert (unbatched.outputs[0].dims, unbatched.outputs[0].reshape) == ((1,), None)


def test_default_max_batch_size_from_the_backend_config() -> None:
    assert _complete(None, BATCHABLE, AutoComplete(default_max_batch_size=16)).max_batch_size == 16
    zero = _complete(None, BATCHABLE, AutoComplete(default_max_batch_size=0))
    assert zero.max_batch_size == 0 and zero.dynamic_batching is None
    assert [t.dims for t in zero.inputs] == [(-1, 16), (-1, 16)]


def test_a_partial_config_with_the_batch_dim_in_its_dims_is_refused_with_the_way_out() -> None:
    given = parse_model_config(
        'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1, 16 ] }\n'
        'input { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }\n'
    )
    with pytest.raises(MetadataConflict) as info:
        completed_metadata(given, BATCHABLE, "m", ON)
    message = str(info.value)
    assert "config.pbtxt gives input 'INPUT0' shape [-1, -1, 16]" in message
    assert "auto-complete set max_batch_size to 4" in message
    assert "list every input and output in config.pbtxt" in message
    # Another conflict is not blamed on auto-complete.
    missing = parse_model_config('input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }')
    with pytest.raises(MetadataConflict) as info:
        completed_metadata(missing, BATCHABLE, "m", ON)
    assert str(info.value) == (
        "unable to load model 'm', configuration expects 1 inputs, model provides 2; "
        "config.pbtxt leaves out graph inputs ['INPUT1'] (the graph's: ['INPUT0', 'INPUT1'])"
    )
    partial = parse_model_config(
        'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }\n'
        'input { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }\n'
    )
    _, inputs, outputs = completed_metadata(partial, BATCHABLE, "m", ON)
    assert inputs[0] == TensorSpec("INPUT0", "INT32", (-1, 16))
    assert outputs == (TensorSpec("OUTPUT0", "INT8", (-1, 16)),)


def test_tensors_the_server_fills_are_not_listed() -> None:
    graph = _graph({"INPUT0": [-1, 4], "START": [-1, 1]}, {"OUTPUT0": [-1, 4]})
    text = """
    sequence_batching {
      control_input { name: "START" control { kind: CONTROL_SEQUENCE_START
                                               int32_false_true: [ 0, 1 ] } }
    }
    """
    config = _complete(text, graph)
    assert [t.name for t in config.inputs] == ["INPUT0"]
    assert config.max_batch_size == 4 and config.dynamic_batching is None  # a scheduler given


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([], 4),
        (["onnxruntime,default-max-batch-size=8"], 8),
        (["default-max-batch-size=2"], 2),
        (["onnxruntime,default-max-batch-size=8", "default-max-batch-size=2"], 8),
        (["default-max-batch-size=-3"], 0),
    ],
)
def test_backend_config(items: list[str], expected: int) -> None:
    assert default_max_batch_size(items, 4) == expected


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("python,shm-default-byte-size=1", "takes no settings of backend 'python'"),
        ("onnxruntime,enable-global-threadpool=1", "'enable-global-threadpool' is not a setting"),
        ("onnxruntime,default-max-batch-size", "the format is"),
        (",default-max-batch-size=1", "the format is"),
        ("default-max-batch-size=four", "must be a whole number"),
    ],
)
def test_backend_config_refusals(item: str, words: str) -> None:
    with pytest.raises(BackendConfigError, match=words):
        default_max_batch_size([item], 4)
