"""A repository of models whose configuration is missing or partial, for auto-complete
(docs/model-config.md, "Auto-complete"), after Triton's QA models of L0_model_config
(``autofill_noplatform*/onnx``): the sample ``simple`` graph (INT32 [-1, 16] in and out), a
graph of fixed shapes, and one whose tensors are [-1] alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tests.support.sequence_models import write_accumulate
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


def _io(kind: str, tensors: dict[str, list[int]]) -> str:
    return "".join(
        f'{kind} {{ name: "{name}" data_type: TYPE_INT32 dims: {dims} }}\n'
        for name, dims in tensors.items()
    )


_ALL_IN = {"INPUT0": [16], "INPUT1": [16]}
_ALL_OUT = {"OUTPUT0": [16], "OUTPUT1": [16]}

#: Triton's QA configs ``qa/L0_model_config/autofill_noplatform/onnx/<case>`` over the simple
#: graph (INT32 [-1, 16] in and out: their outputs are INT32 here, TYPE_INT8 in Triton's
#: graph), each with the substring of Triton's refusal its ``expected`` file holds; and the
#: rest of its backend's ``CompareDimsSupported`` (``*_minus_one``: a -1 where the graph's dim
#: is fixed), in its words.
TRITON_REFUSED: dict[str, tuple[str, str]] = {
    "input_minus_one": (
        _io("input", {"INPUT0": [-1], "INPUT1": [16]}) + _io("output", _ALL_OUT),
        "model 'input_minus_one', tensor 'INPUT0': the model expects 2 dimensions (shape "
        "[-1,16]) but the model configuration specifies 2 dimensions (an initial batch "
        "dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
        "complete shape [-1,-1])",
    ),
    "output_minus_one": (
        _io("input", _ALL_IN) + _io("output", {"OUTPUT0": [-1], "OUTPUT1": [16]}),
        "model 'output_minus_one', tensor 'OUTPUT0': the model expects 2 dimensions (shape "
        "[-1,16]) but the model configuration specifies 2 dimensions (an initial batch "
        "dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
        "complete shape [-1,-1])",
    ),
    "bad_input_dims": (
        _io("input", {"INPUT0": [16, 1], "INPUT1": [16]}) + _io("output", _ALL_OUT),
        "model 'bad_input_dims', tensor 'INPUT0': the model expects 2 dimensions (shape "
        "[-1,16]) but the model configuration specifies 3 dimensions (an initial batch "
        "dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
        "complete shape [-1,16,1])",
    ),
    "bad_output_dims": (
        _io("input", _ALL_IN) + _io("output", {"OUTPUT0": [16], "OUTPUT1": [1]}),
        "model 'bad_output_dims', tensor 'OUTPUT1': the model expects 2 dimensions (shape "
        "[-1,16]) but the model configuration specifies 2 dimensions (an initial batch "
        "dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
        "complete shape [-1,1])",
    ),
    "too_few_inputs": (
        _io("input", {"INPUT1": [16]}) + _io("output", _ALL_OUT),
        "unable to load model 'too_few_inputs', configuration expects 1 inputs, model provides 2",
    ),
    "too_many_inputs": (
        _io("input", {**_ALL_IN, "INPUT_EXTRA": [16]}) + _io("output", _ALL_OUT),
        "unable to load model 'too_many_inputs', configuration expects 3 inputs, model provides 2",
    ),
    "unknown_input": (
        _io("input", {"INPUT0": [16], "INPUT_UNKNOWN": [16]}) + _io("output", _ALL_OUT),
        "unexpected inference input 'INPUT_UNKNOWN', allowed inputs are: INPUT0, INPUT1",
    ),
    "unknown_output": (
        _io("input", _ALL_IN) + _io("output", {"OUTPUT_UNKNOWN": [16]}),
        "unexpected inference output 'OUTPUT_UNKNOWN', allowed outputs are: OUTPUT0, OUTPUT1",
    ),
}


#: Refusals of Triton's ONNX Runtime backend over the other graphs here: model -> its words.
#: ``fixed_first_dim``: a full batching config over a [4, 16] graph; ``scalar_dims``: dims
#: [2] for a scalar.
REFUSED_OTHER_GRAPHS = {
    "fixed_first_dim": (
        "model 'fixed_first_dim', tensor 'INPUT0': for the model to support batching the "
        "shape should have at least 1 dimension and the first dimension must be -1; but "
        "shape expected by the model is [4,16]"
    ),
    "scalar_dims": (
        "unable to load model 'scalar_dims', scalar tensor 'X', should only provide 1 in the "
        "model configuration when the model doesn't support batching. Model configuration "
        "provided: [2]."
    ),
}

#: A sequence model's configuration without inputs or outputs (``write_accumulate``'s graph:
#: INPUT, READY and ACC_IN in, OUTPUT and ACC_OUT out): auto-complete lists INPUT and OUTPUT.
SEQUENCE_PARTIAL = """
max_batch_size: 8
sequence_batching {
  control_input [
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""


def _fixed_graph(path: Path, shape: tuple[int, ...] = (16,)) -> None:
    """INPUT0 + INPUT1 -> OUTPUT0, all INT32 ``shape`` (fixed): no batching."""
    tensors = [
        helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("INPUT0", "INPUT1")
    ]
    output = helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, shape)
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
    scalars (Y = X + 1) without one; ``empty_config``: the simple graph with a configuration
    that gives its name alone; ``sequence_partial``: ``SEQUENCE_PARTIAL``; the
    ``TRITON_REFUSED`` cases, ``max_batch_size: 1``; the ``REFUSED_OTHER_GRAPHS`` ones."""
    _model(root, "no_config", "simple")
    _model(root, "partial", "simple", PARTIAL)
    _model(root, "batch_dim_given", "simple", BATCH_DIM_GIVEN)
    _model(root, "vector", "versioned")
    _fixed_graph(root / "no_batch" / "1" / "model.onnx")
    _fixed_graph(root / "bad_max_batch_size" / "1" / "model.onnx")
    (root / "bad_max_batch_size" / "config.pbtxt").write_text(BAD_MAX_BATCH_SIZE)
    _scalar_graph(root / "scalar" / "1" / "model.onnx")
    for name, (config, _) in TRITON_REFUSED.items():
        _model(root, name, "simple", "max_batch_size: 1\n" + config)
    _model(root, "empty_config", "simple", 'name: "empty_config"\n')
    write_accumulate(root / "sequence_partial" / "1" / "model.onnx")
    (root / "sequence_partial" / "config.pbtxt").write_text(SEQUENCE_PARTIAL)
    _fixed_graph(root / "fixed_first_dim" / "1" / "model.onnx", (4, 16))
    fixed = _io("input", _ALL_IN) + _io("output", {"OUTPUT0": [16]})
    (root / "fixed_first_dim" / "config.pbtxt").write_text("max_batch_size: 4\n" + fixed)
    _scalar_graph(root / "scalar_dims" / "1" / "model.onnx")
    (root / "scalar_dims" / "config.pbtxt").write_text(
        'input { name: "X" data_type: TYPE_FP32 dims: [ 2 ] }\n'
        'output { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }\n'
    )
