"""ONNX graphs the tests write themselves, for behaviour the sample repository cannot show."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def write_slow_model(path: Path, nodes: int) -> None:
    """An FP32 chain of ``nodes`` Mul/Add nodes: tiny on disk, slow to make a session of.

    Each constant differs: ONNX Runtime folds equal ones together, which is much faster.
    """
    graph_nodes = []
    initializers = []
    previous = "INPUT0"
    for i in range(nodes):
        constant = f"c{i}"
        initializers.append(numpy_helper.from_array(np.array([1.0 + i], np.float32), constant))
        output = "OUTPUT0" if i == nodes - 1 else f"t{i}"
        graph_nodes.append(
            helper.make_node("Add" if i % 2 else "Mul", [previous, constant], [output])
        )
        previous = output
    graph = helper.make_graph(
        graph_nodes,
        "slow",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [-1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [-1])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def write_weighty_model(path: Path, layers: int, width: int = 1024) -> None:
    """An FP32 chain of ``layers`` MatMuls by ``width``x``width`` weights (4 MiB each at 1024):
    a session whose heap is large, for the tests of the memory an unload gives back.

    The weights are random: ONNX Runtime folds nothing, and every session holds them all.
    """
    rng = np.random.default_rng(39)
    graph_nodes = []
    initializers = []
    previous = "INPUT0"
    for i in range(layers):
        weight = f"w{i}"
        initializers.append(
            numpy_helper.from_array(rng.standard_normal((width, width), np.float32), weight)
        )
        output = "OUTPUT0" if i == layers - 1 else f"t{i}"
        graph_nodes.append(helper.make_node("MatMul", [previous, weight], [output]))
        previous = output
    graph = helper.make_graph(
        graph_nodes,
        "weighty",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [-1, width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [-1, width])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


#: The model ``write_weighty_repository`` writes.
WEIGHTY = "weighty"


#: ``WEIGHTY``'s inputs and outputs as its graph has them: served without batching (the tests
#: send [512, 1024]); auto-complete would make its [-1, 1024] graph a batching model of 4 rows.
WEIGHTY_TENSORS = """\
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 1024 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 1024 ] } ]
"""


def write_weighty_repository(root: Path, layers: int, config: str = "") -> None:
    """A repository at ``root`` holding ``WEIGHTY`` (``write_weighty_model`` of ``layers``),
    its config.pbtxt ``WEIGHTY_TENSORS`` and ``config``."""
    (root / WEIGHTY / "1").mkdir(parents=True)
    write_weighty_model(root / WEIGHTY / "1" / "model.onnx", layers)
    (root / WEIGHTY / "config.pbtxt").write_text(WEIGHTY_TENSORS + config)


#: The defaults of ``write_all_optional_model``'s inputs A and B.
ALL_OPTIONAL_DEFAULTS = {"A": [1.0, 2.0], "B": [10.0, 20.0]}


def write_all_optional_repository(
    root: Path, name: str, max_batch_size: int, config: str = ""
) -> None:
    """A model ``name`` at ``root`` whose inputs are all optional: Y = A + B, FP32, where A
    and B are graph inputs with defaults (``ALL_OPTIONAL_DEFAULTS``, shape [2]; [1, 2] with
    a batch dimension when ``max_batch_size`` > 0), as Triton's QA model
    ``input_all_optional`` (qa/L0_input_validation) has in Python; ``config``: more of its
    config.pbtxt."""
    batch = [1] if max_batch_size > 0 else []
    dims = ["batch", 2] if max_batch_size > 0 else [2]
    defaults = [
        numpy_helper.from_array(np.array([values], np.float32).reshape([*batch, 2]), input_name)
        for input_name, values in ALL_OPTIONAL_DEFAULTS.items()
    ]
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["Y"])],
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("A", "B")],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, dims)],
        defaults,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / name / "1").mkdir(parents=True)
    onnx.save(model, root / name / "1" / "model.onnx")
    inputs = "".join(
        f'input {{ name: "{n}" data_type: TYPE_FP32 dims: [ 2 ] optional: true }}\n'
        for n in ("A", "B")
    )
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f'{inputs}output {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }}\n{config}'
    )
