"""Triton's QA repository for optional inputs (qa/L0_optional_input), in ONNX.

- ``identity_2_float32``: OUTPUT0 = INPUT0, OUTPUT1 = INPUT1, FP32 ``dims: [ 1 ]``, both
  inputs ``optional: true``, ``max_batch_size: 4`` and a dynamic batcher. Triton's is its
  identity backend; here each input is a graph input with a default of 0 (``[1, 1]``: ONNX
  Runtime uses it when a request leaves the input out), so an output whose input is absent
  is zeros, as Triton's QA expects of ``pipeline_identity_2_float32``. Each output adds 0
  times the other input, so that it has a batch's rows when its own input is absent (a
  default of one row would not: a batch of requests without it could not be split). Its
  batcher waits for a batch of 2 (Triton's waits for 4 with the same 5 s bound: two requests
  sent together form one batch either way, without waiting out the delay here).
- ``ensemble_identity_2_float32``: one step over it, both ensemble inputs optional;
- ``pipeline_identity_2_float32``: two steps, the second mapping only INPUT1 (its optional
  INPUT0 unmapped): OUTPUT0 = 0, OUTPUT1 = INPUT0;
- ``default_row`` (ours): OUTPUT0 = INPUT0, OUTPUT1 = INPUT1 (Identity), INPUT1 optional
  with a default of one row (``[1, 1]``, 7), ``max_batch_size: 4``, the identity's batcher:
  a batch of requests without INPUT1 gets OUTPUT1 of the default's one row, not the batch's.
- ``optional_to_required`` (ours): X, and an optional Z into ``plus`` (A + B, both
  required): a request without Z is refused in ``plus``'s words, as Triton's step is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.ensemble_models import write_step

__all__ = ["BATCH_DELAY_S", "DEFAULT_ROW", "write_optional_repository"]

#: The identity's batcher's max_queue_delay (Triton's QA: 5 s).
BATCH_DELAY_S = 5

#: ``default_row``'s INPUT1 when a request leaves it out.
DEFAULT_ROW = 7.0

_OPTIONAL_IO = """
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] }
]
"""


def _rows(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"{name}_rows", 1])


def _save(root: Path, graph: onnx.GraphProto, config: str) -> None:
    """``graph`` as version 1 of the model named after it, with ``config``."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / graph.name / "1").mkdir(parents=True)
    onnx.save(model, root / graph.name / "1" / "model.onnx")
    (root / graph.name / "config.pbtxt").write_text(config)


def _identity(root: Path) -> None:
    # NOTE: rows of their own for each input and output: one may be a default's 1 row
    #   while the other has a batch's.
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT1", "zero"], ["none1"]),
            helper.make_node("Add", ["INPUT0", "none1"], ["OUTPUT0"]),
            helper.make_node("Mul", ["INPUT0", "zero"], ["none0"]),
            helper.make_node("Add", ["INPUT1", "none0"], ["OUTPUT1"]),
        ],
        "identity_2_float32",
        [_rows(n) for n in ("INPUT0", "INPUT1")],
        [_rows(n) for n in ("OUTPUT0", "OUTPUT1")],
        [
            *(
                numpy_helper.from_array(np.zeros((1, 1), np.float32), n)
                for n in ("INPUT0", "INPUT1")
            ),
            numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
        ],
    )
    _save(
        root,
        graph,
        'name: "identity_2_float32"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        f"{_OPTIONAL_IO}dynamic_batching {{ preferred_batch_size: [ 2 ] "
        f"max_queue_delay_microseconds: {BATCH_DELAY_S * 1_000_000} }}\n",
    )


def _default_row(root: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"]),
            helper.make_node("Identity", ["INPUT1"], ["OUTPUT1"]),
        ],
        "default_row",
        [_rows(n) for n in ("INPUT0", "INPUT1")],
        [_rows(n) for n in ("OUTPUT0", "OUTPUT1")],
        [numpy_helper.from_array(np.full((1, 1), DEFAULT_ROW, np.float32), "INPUT1")],
    )
    _save(
        root,
        graph,
        'name: "default_row"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] },\n'
        '  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] },\n'
        '  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"dynamic_batching {{ preferred_batch_size: [ 2 ] "
        f"max_queue_delay_microseconds: {BATCH_DELAY_S * 1_000_000} }}\n",
    )


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f'input_map {{ key: "{k}" value: "{v}" }} ' for k, v in inputs.items())
    maps += "".join(f'output_map {{ key: "{k}" value: "{v}" }} ' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {maps}}}'


def _ensemble(root: Path, name: str, io: str, steps: list[str]) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 4\n{io}'
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


def write_optional_repository(root: Path) -> Path:
    """The models above under ``root``."""
    _identity(root)
    _default_row(root)
    both = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    outputs = {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}
    _ensemble(
        root,
        "ensemble_identity_2_float32",
        _OPTIONAL_IO,
        [_step("identity_2_float32", both, outputs)],
    )
    _ensemble(
        root,
        "pipeline_identity_2_float32",
        _OPTIONAL_IO,
        [
            _step("identity_2_float32", both, {"OUTPUT0": "internal_output"}),
            _step("identity_2_float32", {"INPUT1": "internal_output"}, outputs),
        ],
    )
    write_step(root, "plus")
    _ensemble(
        root,
        "optional_to_required",
        'input { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }\n'
        'input { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] optional: true }\n'
        'output { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }\n',
        [_step("plus", {"A": "X", "B": "Z"}, {"OUT": "Y"})],
    )
    return root
