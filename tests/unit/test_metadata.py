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
