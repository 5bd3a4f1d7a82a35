"""A repository of models whose configuration is missing or partial, for auto-complete
(docs/model-config.md, "Auto-complete"), after Triton's QA models of L0_model_config
(``autofill_noplatform*/onnx``): the sample ``simple`` graph (INT32 [-1, 16] in and out), a
graph of fixed shapes, and one whose tensors are [-1] alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tests.support.server import SAMPLE_REPOSITORY

#: Every input, without the batch dimension (the rest of the configuration completed).
PARTIAL = """\
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }
input { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
"""

#: The inputs with the batch dimension in their dims: auto-complete turns batching on, so
#: the configuration gives [-1, -1, 16] where the graph has [-1, 16].
BATCH_DIM_GIVEN = PARTIAL.replace("dims: [ 16 ]", "dims: [ -1, 16 ]")

#: A max_batch_size for a graph that cannot batch (Triton's ``bad_max_batch_size``).
BAD_MAX_BATCH_SIZE = "max_batch_size: 1\n" + PARTIAL


def _fixed_graph(path: Path) -> None:
    """INPUT0 + INPUT1 -> OUTPUT0, all INT32 [16]: no variable first dim, no batching."""
    tensors = [
        helper.make_tensor_value_info(n, TensorProto.INT32, [16]) for n in ("INPUT0", "INPUT1")
    ]
    output = helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, [16])
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])], "fixed", tensors, [output]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, path)


def _scalar_graph(path: Path) -> None:
    """Y = X + 1, FP32 scalars: no dims, so no batching."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "one"], ["Y"])],
        "scalar",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
        [one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, path)


def _model(root: Path, name: str, source: str, config: str | None = None) -> None:
    (root / name / "1").mkdir(parents=True)
    shutil.copy(SAMPLE_REPOSITORY / source / "1" / "model.onnx", root / name / "1")
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)


def write_autofill_repository(root: Path) -> None:
    """``no_config``, ``partial``, ``batch_dim_given``: the simple graph without a
    configuration, with ``PARTIAL``, with ``BATCH_DIM_GIVEN``; ``no_batch`` and
    ``bad_max_batch_size``: the fixed graph without one, with ``BAD_MAX_BATCH_SIZE``;
    ``vector``: versioned's version 1 (FP32 [-1] -> [-1], + 1) without one; ``scalar``: FP32
    scalars (Y = X + 1) without one."""
    _model(root, "no_config", "simple")
    _model(root, "partial", "simple", PARTIAL)
    _model(root, "batch_dim_given", "simple", BATCH_DIM_GIVEN)
    _model(root, "vector", "versioned")
    _fixed_graph(root / "no_batch" / "1" / "model.onnx")
    _fixed_graph(root / "bad_max_batch_size" / "1" / "model.onnx")
    (root / "bad_max_batch_size" / "config.pbtxt").write_text(BAD_MAX_BATCH_SIZE)
    _scalar_graph(root / "scalar" / "1" / "model.onnx")
