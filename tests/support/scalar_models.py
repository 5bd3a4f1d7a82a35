"""Models whose outputs are scalars, for a model that batches (docs/model-config.md,
"Scalars"): ``row_scalar``, one value a row (the graph's Y is [-1], listed ``dims: [1]``
with ``reshape: { shape: [] }``, as auto-complete lists it); ``batch_scalar``, one value
for the whole run (the graph's Y has no dims, listed ``dims: [1]``), which Triton's ONNX
Runtime backend answers for a batch of 1 alone. Both: X FP32 [-1, 2], Y its sum (a row's,
or all of it), ``max_batch_size: 4``."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

_CONFIG = """
max_batch_size: 4
input {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }}
output {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ]{reshape} }}
"""


def _sum_graph(path: Path, per_row: bool) -> None:
    attributes = {"axes": [1]} if per_row else {}
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["X"], ["Y"], keepdims=0, **attributes)],
        "sum",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N"] if per_row else [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, path)


def write_scalar_models(root: Path) -> None:
    """``row_scalar`` and ``batch_scalar`` (the module's docstring) under ``root``."""
    for name, per_row in (("row_scalar", True), ("batch_scalar", False)):
        _sum_graph(root / name / "1" / "model.onnx", per_row)
        reshape = " reshape: { shape: [ ] }" if per_row else ""
        (root / name / "config.pbtxt").write_text(_CONFIG.format(reshape=reshape))
