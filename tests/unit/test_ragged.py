"""Ragged batching's pieces: the config's checks, the batch inputs, the layout of a batch.

The batch-input values are those Triton's qa/L0_batch_input/batch_input_test.py expects
for the same request shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

from oipserve.dataplane.ragged import RaggedLayout, batch_input_values
from oipserve.errors import InferenceFailed
from oipserve.models.config.batch_io_config import BatchIO, BatchOutputSpec, graph_problem
from oipserve.models.config.parse import ModelConfigError, parse_model_config
from oipserve.wire.messages import TensorDesc

SHAPES = [[1, 2], [1, 4], [1, 1], [1, 3]]

HEAD = """name: "m" max_batch_size: 8
input [ { name: "I" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true },
        { name: "J" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "O" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("BATCH_ELEMENT_COUNT", [2, 4, 1, 3]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [2, 6, 7, 10]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 2, 6, 7, 10]),
        ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", [0, 0, 0, 0]),
    ],
)
def test_element_counts_as_triton(kind: str, expected: list[int]) -> None:
    for datatype, dtype in (("FP32", np.float32), ("INT32", np.int32)):
        values = batch_input_values(kind, datatype, SHAPES)
        assert values.dtype == dtype and values.tolist() == expected


def test_item_shapes_as_triton() -> None:
    flat = batch_input_values(
        "BATCH_ITEM_SHAPE_FLATTEN", "FP32", [[1, 4, 1], [1, 1, 2], [1, 1, 2], [1, 2, 2]]
    )
    assert flat.tolist() == [4, 1, 1, 2, 1, 2, 2, 2]
    # a request of 2 batch items gives 2 rows
    table = batch_input_values("BATCH_ITEM_SHAPE", "FP32", [[2, 1, 2], [1, 1, 2], [1, 2, 2]])
    assert table.shape == (4, 2)
    assert table.tolist() == [[1, 2], [1, 2], [1, 2], [2, 2]]


def test_no_ragged_batching_keeps_the_ordinary_path() -> None:
    plain = parse_model_config(HEAD.replace(" allow_ragged_batch: true", ""))
    assert plain.batch_io is None
    # without a batch dimension allow_ragged_batch changes nothing
    unbatched = HEAD.replace("max_batch_size: 8", "max_batch_size: 0")
    assert parse_model_config(unbatched).batch_io is None
    # honoured now, not ignored with a warning
    ragged = parse_model_config(HEAD)
    assert ragged.batch_io == BatchIO(ragged=("I",)) and ragged.ignored == ()


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" data_type: TYPE_FP32 } ]',
            "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m",
        ),
        (
            'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "C" data_type: TYPE_FP16 '
            'source_input: "I" } ]',
            "batch input data type must be TYPE_INT32 or TYPE_FP32 for m",
        ),
        (
            'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "C" data_type: TYPE_FP32 '
            'source_input: "X" } ]',
            "unknown source input name 'X' for m",
        ),
        (
            'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "J" data_type: TYPE_FP32 '
            'source_input: "I" } ]',
            "batch input target 'J' is also a configured input",
        ),
        (
            'batch_input [ { kind: BATCH_ITEM_SHAPE data_type: TYPE_FP32 source_input: "I" } ]',
            "names no target_name",
        ),
        (
            'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "C" data_type: TYPE_FP32 '
            'source_input: "I" }, { kind: BATCH_ELEMENT_COUNT target_name: "C" '
            'data_type: TYPE_FP32 source_input: "I" } ]',
            "batch input target 'C' can only be specified once",
        ),
        (
            'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "O" '
            'source_input: [ "I", "J" ] } ]',
            "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 2",
        ),
        (
            'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "P" '
            'source_input: "I" } ]',
            "unknown target output name 'P' for m",
        ),
        (
            'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "O" '
            'source_input: "Q" } ]',
            "unknown source input name 'Q' for m",
        ),
    ],
)
def test_malformed_batch_io_is_refused_with_the_reason(fields: str, reason: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        parse_model_config(HEAD + fields)
    assert reason in str(caught.value)


def test_batch_io_needs_a_batch_dimension() -> None:
    config = HEAD.replace("max_batch_size: 8", "max_batch_size: 0") + (
        'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "O" '
        'source_input: "I" } ]'
    )
    with pytest.raises(ModelConfigError, match="need max_batch_size > 0 for m"):
        parse_model_config(config)


def test_not_with_sequence_batching() -> None:
    with pytest.raises(ModelConfigError, match="not supported with sequence_batching for m"):
        parse_model_config(HEAD + "sequence_batching { }")


def test_graph_must_take_ragged_inputs_flat_and_have_the_batch_inputs() -> None:
    config = parse_model_config(
        HEAD + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" '
        'data_type: TYPE_INT32 source_input: "I" } ]'
    )
    io = config.batch_io
    assert io is not None and io.ragged == ("I",)
    good = {"I": ("FP32", (-1,)), "J": ("FP32", (-1, 2)), "C": ("INT32", (-1,))}
    assert graph_problem(io, good) is None
    without = {k: v for k, v in good.items() if k != "C"}
    assert "not an input of the ONNX graph" in str(graph_problem(io, without))
    assert "INT32 in config.pbtxt but FP32" in str(
        graph_problem(io, {**good, "C": ("FP32", (-1,))})
    )
    assert "gets it flat" in str(graph_problem(io, {**good, "I": ("FP32", (-1, -1))}))


class _Tensor:
    def __init__(self, name: str) -> None:
        self.name, self.datatype, self.image = name, "FP32", None


def _placement(name: str, shape: list[int]) -> tuple[object, list[int], int, np.ndarray]:
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return (_Tensor(name), shape, data.nbytes, data)


def test_signature_ignores_only_the_ragged_dims() -> None:
    layout = RaggedLayout(BatchIO(ragged=("I",)))
    a = [_placement("I", [1, 3]), _placement("J", [1, 2])]
    b = [_placement("I", [1, 9]), _placement("J", [1, 2])]
    c = [_placement("I", [1, 9]), _placement("J", [1, 4])]
    assert layout.signature(a) == layout.signature(b)  # type: ignore[arg-type]
    assert layout.signature(a) != layout.signature(c)  # type: ignore[arg-type]


def test_scatter_cuts_by_the_source_shapes_and_rows_for_the_rest() -> None:
    io = BatchIO(
        ragged=("I",), outputs=(BatchOutputSpec("BATCH_SCATTER_WITH_INPUT_SHAPE", ("O",), "I"),)
    )
    layout = RaggedLayout(io)
    requests = [[_placement("I", [1, 3])], [_placement("I", [1, 5])]]
    flat = np.arange(8, dtype=np.float32).tobytes()
    rows = np.array([[10], [20]], np.float32).tobytes()
    segment = memoryview(flat + rows)
    outputs = [
        TensorDesc("O", "FP32", [8], "seg", 0, len(flat)),
        TensorDesc("R", "FP32", [2, 1], "seg", len(flat), len(rows)),
    ]
    parts = layout.split(outputs, segment, requests, [1, 1])  # type: ignore[arg-type]
    (o1, v1), (r1, w1) = parts[0]
    (o2, v2), (r2, w2) = parts[1]
    assert o1.shape == [1, 3] and np.frombuffer(v1, np.float32).tolist() == [0, 1, 2]
    assert o2.shape == [1, 5] and np.frombuffer(v2, np.float32).tolist() == [3, 4, 5, 6, 7]
    assert r1.shape == r2.shape == [1, 1]
    assert np.frombuffer(w2, np.float32).tolist() == [20]
    short = [TensorDesc("O", "FP32", [7], "seg", 0, 28)]
    with pytest.raises(InferenceFailed, match="fewer than the 8"):
        layout.split(short, segment, requests, [1, 1])  # type: ignore[arg-type]
