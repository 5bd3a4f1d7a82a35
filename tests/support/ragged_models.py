"""A model written for Triton's ragged batching, and repositories that serve it.

``write_ragged_model``: an ONNX graph that takes its input INPUT flat (the elements of every
request of a batch, one request after another) and finds each request's part with the
batch inputs the server makes:

- OFFSETS (INT32, ``BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO``): where each request starts
  and ends; a one-hot [elements, requests] matrix made from it gives each request's sum;
- COUNTS (FP32, ``BATCH_ELEMENT_COUNT``): each request's element count, for its mean;
- MAXSHAPE (FP32, ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``): only its length is read;
- ITEMS (INT32, ``BATCH_ITEM_SHAPE_FLATTEN``) and ITEMS2D (FP32, ``BATCH_ITEM_SHAPE``).

Outputs: CENTERED (each element minus its request's mean; ``BATCH_SCATTER_WITH_INPUT_SHAPE``
gives each request its own part, shaped like its INPUT), and per request one row each of
SUMS, MAXLEN (the batch's longest request), ITEMLEN (from ITEMS2D) and ITEMLEN_FLAT (from
ITEMS). With integer inputs every figure is exact, so a request's answer in a batch is
bit-for-bit its answer alone, except MAXLEN, which describes the batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RAGGED_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [
  {{ name: "CENTERED" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "SUMS" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "MAXLEN" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "ITEMLEN" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "ITEMLEN_FLAT" data_type: TYPE_FP32 dims: [ 1 ] }}
]
batch_input [
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS"
     data_type: TYPE_INT32 source_input: "INPUT" }},
  {{ kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" data_type: TYPE_FP32
     source_input: "INPUT" }},
  {{ kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAXSHAPE" data_type: TYPE_FP32
     source_input: "INPUT" }},
  {{ kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "ITEMS" data_type: TYPE_INT32
     source_input: "INPUT" }},
  {{ kind: BATCH_ITEM_SHAPE target_name: "ITEMS2D" data_type: TYPE_FP32
     source_input: "INPUT" }}
]
batch_output [
  {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "CENTERED" source_input: "INPUT" }}
]
{extra}
"""

#: Configs Triton (or oipserve) refuses at load, and a part of the reason each gets.
MALFORMED = {
    "bad_source": (
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" '
        'data_type: TYPE_FP32 source_input: "NOPE" } ]',
        "unknown source input name 'NOPE' for bad_source",
    ),
    "bad_dtype": (
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" '
        'data_type: TYPE_INT64 source_input: "INPUT" } ]',
        "batch input data type must be TYPE_INT32 or TYPE_FP32 for bad_dtype",
    ),
    "two_sources": (
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" '
        'data_type: TYPE_FP32 source_input: [ "INPUT", "INPUT" ] } ]',
        "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2",
    ),
    "bad_target": (
        'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "NOPE" '
        'source_input: "INPUT" } ]',
        "unknown target output name 'NOPE' for bad_target",
    ),
    "target_twice": (
        'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: [ "OUT", "OUT" ] '
        'source_input: "INPUT" } ]',
        "target output name 'OUT' can only be specified once",
    ),
    "not_in_graph": (
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" '
        'data_type: TYPE_FP32 source_input: "INPUT" } ]',
        "batch input target 'COUNTS' is not an input of the ONNX graph",
    ),
}


def _const(name: str, values: list[int], dtype: type = np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype), name)


def write_ragged_model(path: Path) -> None:
    """The ONNX graph described above (opset 13)."""
    n = helper.make_node
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    nodes = [
        # each element's index, as a float column [n, 1]
        n("Shape", ["INPUT"], ["n"]),
        n(
            "ConstantOfShape",
            ["n"],
            ["ones"],
            value=numpy_helper.from_array(np.ones(1, np.float32)),
        ),
        n("CumSum", ["ones", "axis0"], ["upto"]),
        n("Sub", ["upto", "one"], ["index"]),
        n("Unsqueeze", ["index", "axis1"], ["column"]),
        # each request's [start, end) from OFFSETS
        n("Cast", ["OFFSETS"], ["offsets"], to=f),
        n("Slice", ["offsets", "zero", "minus1"], ["starts"]),
        n("Slice", ["offsets", "one_i", "big"], ["ends"]),
        n("GreaterOrEqual", ["column", "starts"], ["after"]),
        n("Less", ["column", "ends"], ["before"]),
        n("And", ["after", "before"], ["inside"]),
        n("Cast", ["inside"], ["onehot"], to=f),  # [n, requests]
        n("Unsqueeze", ["INPUT", "axis0"], ["row"]),
        n("MatMul", ["row", "onehot"], ["sums_row"]),  # [1, requests]
        n("Transpose", ["sums_row"], ["SUMS"]),  # [requests, 1]
        n("Div", ["sums_row", "COUNTS"], ["means"]),
        n("Transpose", ["means"], ["means_col"]),
        n("MatMul", ["onehot", "means_col"], ["spread"]),  # [n, 1]
        n("Reshape", ["spread", "n"], ["spread_flat"]),
        n("Sub", ["INPUT", "spread_flat"], ["CENTERED"]),
        n("Shape", ["MAXSHAPE"], ["maxshape"]),
        n("Cast", ["maxshape"], ["maxlen"], to=f),
        n("Unsqueeze", ["maxlen", "axis0"], ["maxlen_2d"]),
        n("Shape", ["SUMS"], ["sums_shape"]),
        n("Expand", ["maxlen_2d", "sums_shape"], ["MAXLEN"]),
        n("Identity", ["ITEMS2D"], ["ITEMLEN"]),
        n("Cast", ["ITEMS"], ["items"], to=f),
        n("Reshape", ["items", "column_shape"], ["ITEMLEN_FLAT"]),
    ]
    constants = [
        _const("axis0", [0]),
        _const("axis1", [1]),
        numpy_helper.from_array(np.ones(1, np.float32), "one"),
        _const("zero", [0]),
        _const("minus1", [-1]),
        _const("one_i", [1]),
        _const("big", [2**31 - 1]),
        _const("column_shape", [-1, 1]),
    ]
    inputs = [
        helper.make_tensor_value_info("INPUT", f, ["n"]),
        helper.make_tensor_value_info("OFFSETS", i32, ["r1"]),
        helper.make_tensor_value_info("COUNTS", f, ["r"]),
        helper.make_tensor_value_info("MAXSHAPE", f, ["m"]),
        helper.make_tensor_value_info("ITEMS", i32, ["k"]),
        helper.make_tensor_value_info("ITEMS2D", f, ["k", 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("CENTERED", f, ["n"]),
        helper.make_tensor_value_info("SUMS", f, ["r", 1]),
        helper.make_tensor_value_info("MAXLEN", f, ["r", 1]),
        helper.make_tensor_value_info("ITEMLEN", f, ["k", 1]),
        helper.make_tensor_value_info("ITEMLEN_FLAT", f, ["k", 1]),
    ]
    graph = helper.make_graph(nodes, "ragged", inputs, outputs, constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def _model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    write_ragged_model(root / name / "1" / "model.onnx")
    (root / name / "config.pbtxt").write_text(config)


def write_ragged_repository(root: Path, delay_us: int) -> None:
    """``ragged``: batched (preferred size 4, the queue delay given); ``ragged_alone``: the
    same model without ``dynamic_batching`` (one request per execution); and one model
    per entry of ``MALFORMED``, each refused at load."""
    batching = (
        "dynamic_batching { preferred_batch_size: [ 4 ] "
        f"max_queue_delay_microseconds: {delay_us} }}"
    )
    _model(root, "ragged", RAGGED_CONFIG.format(name="ragged", extra=batching))
    _model(root, "ragged_alone", RAGGED_CONFIG.format(name="ragged_alone", extra=""))
    for name, (fields, _) in MALFORMED.items():
        config = (
            f'name: "{name}" platform: "onnxruntime_onnx" max_batch_size: 8\n'
            'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] '
            "allow_ragged_batch: true } ]\n"
            'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n' + fields + "\n"
        )
        (root / name / "1").mkdir(parents=True)
        _write_identity(root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(config)


def _write_identity(path: Path) -> None:
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUT"])],
        "identity",
        [helper.make_tensor_value_info("INPUT", f, ["n"])],
        [helper.make_tensor_value_info("OUT", f, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def write_unlisted_output_model(path: Path) -> None:
    """``Y = X`` and ``UNLISTED = IDX`` (X FP32 [n], IDX INT32 [r]): a graph with an output
    for a config.pbtxt to leave out."""
    nodes = [
        helper.make_node("Identity", ["X"], ["Y"]),
        helper.make_node("Identity", ["IDX"], ["UNLISTED"]),
    ]
    inputs = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"]),
        helper.make_tensor_value_info("IDX", TensorProto.INT32, ["r"]),
    ]
    outputs = [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n"]),
        helper.make_tensor_value_info("UNLISTED", TensorProto.INT32, ["r"]),
    ]
    graph = helper.make_graph(nodes, "unlisted", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))
