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


def write_weighty_repository(root: Path, layers: int, config: str = "") -> None:
    """A repository at ``root`` holding ``WEIGHTY`` (``write_weighty_model`` of ``layers``),
    with ``config`` as its config.pbtxt when given."""
    (root / WEIGHTY / "1").mkdir(parents=True)
    write_weighty_model(root / WEIGHTY / "1" / "model.onnx", layers)
    if config:
        (root / WEIGHTY / "config.pbtxt").write_text(config)
