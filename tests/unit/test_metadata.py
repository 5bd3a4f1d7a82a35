"""Graph metadata refined by config.pbtxt: reshape and optional inputs."""

from __future__ import annotations

import pytest

from oipserve.models.config.parse import parse_model_config
from oipserve.models.metadata import MetadataConflict, TensorSpec, merge_metadata, reshaped
from oipserve.wire.messages import Loaded, TensorMeta


def test_reshaped_maps_variable_sizes_in_order() -> None:
    assert reshaped([3, 4], (-1, 4), (-1, 2, 2)) == [3, 2, 2]
    assert reshaped([3, 2, 2], (-1, 2, 2), (-1, 4)) == [3, 4]
    assert reshaped([5, 6], (-1, 6), (2, -1, 3)) == [2, 5, 3]
    assert reshaped([1], (1,), ()) == []
    with pytest.raises(ValueError, match="rank"):
        reshaped([3], (-1, 4), (-1, 2, 2))
    with pytest.raises(ValueError, match="elements"):
        reshaped([3, 2, 3], (-1, 2, 2), (-1, 4))


def _loaded(
    inputs: list[TensorMeta],
    outputs: list[TensorMeta],
    defaults: tuple[TensorMeta, ...] = (TensorMeta("BIAS", "FP32", [-1, 2, 2]),),
) -> Loaded:
    """What a worker reports: ``defaults`` are the graph inputs with an initializer."""
    return Loaded(0, "m", inputs, outputs, ["CPUExecutionProvider"], list(defaults))


CONFIG = """
max_batch_size: 4
input { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } }
input { name: "BIAS" data_type: TYPE_FP32 dims: [ 2, 2 ] optional: true }
output { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } }
"""


def test_reshape_and_optional_metadata() -> None:
    loaded = _loaded([TensorMeta("X", "FP32", [-1, 2, 2])], [TensorMeta("Y", "FP32", [-1, 2, 2])])
    inputs, outputs = merge_metadata(parse_model_config(CONFIG), loaded)
    assert inputs == (
        TensorSpec("X", "FP32", (-1, 4), model_shape=(-1, 2, 2)),
        TensorSpec("BIAS", "FP32", (-1, 2, 2), optional=True),
    )
    assert outputs == (TensorSpec("Y", "FP32", (-1, 4), model_shape=(-1, 2, 2)),)


def test_reshape_is_checked_against_the_graph() -> None:
    loaded = _loaded([TensorMeta("X", "FP32", [-1, 4])], [TensorMeta("Y", "FP32", [-1, 2, 2])])
    with pytest.raises(MetadataConflict, match=r"input 'X' shape \[-1, 2, 2\]"):
        merge_metadata(parse_model_config(CONFIG), loaded)


def test_optional_input_the_graph_requires_is_refused() -> None:
    loaded = _loaded(
        [TensorMeta("X", "FP32", [-1, 2, 2]), TensorMeta("BIAS", "FP32", [-1, 2, 2])],
        [TensorMeta("Y", "FP32", [-1, 2, 2])],
    )
    with pytest.raises(MetadataConflict) as info:
        merge_metadata(parse_model_config(CONFIG), loaded, "m")
    # Triton's backend counts the inputs not optional first (1 against the graph's 2).
    assert str(info.value).startswith(
        "unable to load model 'm', configuration expects 1 inputs, model provides 2; "
        "config.pbtxt declares input 'BIAS' optional, but the ONNX graph requires it"
    )


def test_optional_input_without_a_default_in_the_graph_is_refused() -> None:
    loaded = _loaded(
        [TensorMeta("X", "FP32", [-1, 2, 2])], [TensorMeta("Y", "FP32", [-1, 2, 2])], defaults=()
    )
    with pytest.raises(MetadataConflict) as info:
        merge_metadata(parse_model_config(CONFIG), loaded)
    assert str(info.value).startswith(
        "unexpected inference input 'BIAS', allowed inputs are: X; config.pbtxt declares "
        "input 'BIAS' optional, but the ONNX graph has no input with a default value"
    )


def test_optional_input_is_checked_against_its_default() -> None:
    wrong_type = (TensorMeta("BIAS", "INT32", [-1, 2, 2]),)
    loaded = _loaded(
        [TensorMeta("X", "FP32", [-1, 2, 2])], [TensorMeta("Y", "FP32", [-1, 2, 2])], wrong_type
    )
    with pytest.raises(MetadataConflict, match="'BIAS' is FP32 but the ONNX graph says INT32"):
        merge_metadata(parse_model_config(CONFIG), loaded)
    wrong_shape = (TensorMeta("BIAS", "FP32", [-1, 3]),)
    loaded = _loaded(
        [TensorMeta("X", "FP32", [-1, 2, 2])], [TensorMeta("Y", "FP32", [-1, 2, 2])], wrong_shape
    )
    with pytest.raises(MetadataConflict, match="input 'BIAS' shape"):
        merge_metadata(parse_model_config(CONFIG), loaded)


def _simple(inputs: list[int], outputs: list[int]) -> Loaded:
    return _loaded([TensorMeta("X", "FP32", inputs)], [TensorMeta("Y", "FP32", outputs)], ())


@pytest.mark.parametrize(
    ("config", "graph", "words"),
    [
        # Triton's CompareDimsSupported: an input's -1 over a fixed graph dim
        (
            'input { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }\n'
            'output { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }',
            ([4], [4]),
            "model 'm', tensor 'X': the model expects 1 dimensions (shape [4]) but the model "
            "configuration specifies 1 dimensions (shape [-1]); config.pbtxt gives input 'X' "
            "shape [-1] but the ONNX graph has [4] (where the graph's dim is fixed, dims must "
            "give its size, not -1)",
        ),
        # an output's dims are compared exactly: -1 over a fixed dim, a size over -1
        (
            'input { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }\n'
            'output { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }',
            ([4], [4]),
            "model 'm', tensor 'Y': the model expects 1 dimensions (shape [4]) but the model "
            "configuration specifies 1 dimensions (shape [-1])",
        ),
        (
            'input { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }\n'
            'output { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }',
            ([-1], [-1]),
            "model 'm', tensor 'Y': the model expects 1 dimensions (shape [-1]) but the model "
            "configuration specifies 1 dimensions (shape [4]); config.pbtxt gives output 'Y' "
            "shape [4] but the ONNX graph has [-1] (an output's dims must be the graph's "
            "exactly: -1 where it is variable)",
        ),
        # batching over a fixed first dim
        (
            'max_batch_size: 4\ninput { name: "X" data_type: TYPE_FP32 dims: [ 2 ] }\n'
            'output { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }',
            ([4, 2], [-1, 2]),
            "model 'm', tensor 'X': for the model to support batching the shape should have at "
            "least 1 dimension and the first dimension must be -1; but shape expected by the "
            "model is [4,2]; config.pbtxt gives max_batch_size > 0",
        ),
        # a scalar's dims are 1s
        (
            'input { name: "X" data_type: TYPE_FP32 dims: [ 1 ] }\n'
            'output { name: "Y" data_type: TYPE_FP32 dims: [ 1, 2 ] }',
            ([], []),
            "unable to load model 'm', scalar tensor 'Y', should only provide 1 in the model "
            "configuration when the model doesn't support batching. Model configuration "
            "provided: [1,2].; config.pbtxt gives output 'Y' dims [1, 2]",
        ),
        # no inputs given (auto-complete off): Triton's count
        (
            'output { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }',
            ([4], [4]),
            "unable to load model 'm', configuration expects 0 inputs, model provides 1; "
            "config.pbtxt leaves out graph inputs ['X']",
        ),
    ],
    ids=["input_minus_one", "output_minus_one", "output_fixed", "fixed_batch", "scalar", "none"],
)
def test_tritons_shape_rules(config: str, graph: tuple[list[int], list[int]], words: str) -> None:
    with pytest.raises(MetadataConflict) as info:
        merge_metadata(parse_model_config(config), _simple(*graph), "m")
    assert str(info.value).startswith(words), str(info.value)


def test_what_tritons_shape_rules_take() -> None:
    """An input's fixed size over a variable graph dim, 1s over a scalar, the exact dims."""
    config = parse_model_config(
        'input { name: "X" data_type: TYPE_FP32 dims: [ 3, 4 ] }\n'
        'output { name: "Y" data_type: TYPE_FP32 dims: [ -1, 4 ] }'
    )
    inputs, outputs = merge_metadata(config, _simple([-1, 4], [-1, 4]), "m")
    assert inputs[0].shape == (3, 4) and outputs[0].shape == (-1, 4)
    config = parse_model_config(
        'input { name: "X" data_type: TYPE_FP32 dims: [ 1 ] }\n'
        'output { name: "Y" data_type: TYPE_FP32 dims: [ 1, 1 ] }'
    )
    inputs, outputs = merge_metadata(config, _simple([], []), "m")
    assert inputs[0].shape == (1,) and outputs[0].shape == (1, 1)
