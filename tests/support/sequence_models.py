"""Sequence models for the tests: equivalents of Triton's example ``simple_sequence`` and
``simple_dyna_sequence`` (the same graphs, rebuilt with onnx.helper), and an accumulator
with implicit state.

- ``simple_sequence``: OUTPUT = READY * (INPUT + START), direct strategy;
- ``simple_dyna_sequence``: OUTPUT = READY * (INPUT + START + END * CORRID), oldest;
- ``accumulate``: OUTPUT = ACC_IN + INPUT * READY, ACC_OUT = OUTPUT: the running sum of a
  sequence's inputs, carried by the worker as implicit state (ACC_IN <- ACC_OUT);
- ``accumulate_ensemble``: an ensemble whose one step is ``accumulate_direct`` (its
  requests' sequence parameters go to the step, as in Triton).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tests.support.ensemble_models import ensemble_config, write_ensemble

INT32 = TensorProto.INT32

SIMPLE_SEQUENCE = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  {extra}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""

DYNA_SEQUENCE = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  oldest {{ max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 {extra} }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""

STRING_DYNA_SEQUENCE = DYNA_SEQUENCE.replace("TYPE_UINT64", "TYPE_STRING").replace(
    "  ]\n}}",
    '  ]\n  state [ {{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 '
    "dims: [ 1 ] }} ]\n}}",
)

ACCUMULATE = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [ {{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


def _io(name: str, elem: int = INT32, batched: bool = True) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, ["batch", 1] if batched else [1])


def save_int32_graph(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[str],
    outputs: list[str],
    corrid: int = TensorProto.UINT64,
    batched: bool = True,
) -> None:
    """An ONNX graph at ``path`` whose tensors are INT32 (CORRID ``corrid``), each
    ``[batch, 1]``, or ``[1]`` without ``batched``."""
    types = {"CORRID": corrid}
    graph = helper.make_graph(
        nodes,
        path.parent.parent.name,
        [_io(name, types.get(name, INT32), batched) for name in inputs],
        [_io(name, batched=batched) for name in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def write_simple_sequence(path: Path) -> None:
    """OUTPUT = READY * (INPUT + START)."""
    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["sum"]),
        helper.make_node("Mul", ["READY", "sum"], ["OUTPUT"]),
    ]
    save_int32_graph(path, nodes, ["INPUT", "START", "READY"], ["OUTPUT"])


def write_dyna_sequence(path: Path) -> None:
    """OUTPUT = READY * ((INPUT + START) + END * int32(CORRID))."""
    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["sum"]),
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=INT32),
        helper.make_node("Mul", ["END", "corrid"], ["ended"]),
        helper.make_node("Add", ["sum", "ended"], ["total"]),
        helper.make_node("Mul", ["READY", "total"], ["OUTPUT"]),
    ]
    save_int32_graph(path, nodes, ["INPUT", "START", "END", "READY", "CORRID"], ["OUTPUT"])


def write_string_dyna_sequence(path: Path) -> None:
    """What Triton's example clients call ``simple_string_dyna_sequence`` with ``--dyna`` (in
    Triton, a custom C++ backend of its QA): the running sum of a sequence's inputs, plus the
    id (a TYPE_STRING CORRID, its text cast to int32) at its END; the sum is implicit state.
    OUTPUT = READY * (ACC_IN + INPUT + END * int32(CORRID)); ACC_OUT = OUTPUT."""
    nodes = [
        helper.make_node("Add", ["ACC_IN", "INPUT"], ["sum"]),
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=INT32),
        helper.make_node("Mul", ["END", "corrid"], ["ended"]),
        helper.make_node("Add", ["sum", "ended"], ["total"]),
        helper.make_node("Mul", ["READY", "total"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
    ]
    save_int32_graph(
        path,
        nodes,
        ["INPUT", "START", "END", "READY", "CORRID", "ACC_IN"],
        ["OUTPUT", "ACC_OUT"],
        TensorProto.STRING,
    )


def write_accumulate(path: Path, batched: bool = True) -> None:
    """OUTPUT = ACC_IN + INPUT * READY; ACC_OUT = OUTPUT (``batched``: a [batch, 1] graph)."""
    nodes = [
        helper.make_node("Mul", ["INPUT", "READY"], ["given"]),
        helper.make_node("Add", ["ACC_IN", "given"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
    ]
    save_int32_graph(
        path, nodes, ["INPUT", "READY", "ACC_IN"], ["OUTPUT", "ACC_OUT"], batched=batched
    )


def write_repository(root: Path, idle_us: int = 1_000_000, count: int = 1) -> None:
    """The sequence models of the e2e tests under ``root``."""
    models = {
        "simple_sequence": (write_simple_sequence, SIMPLE_SEQUENCE, {"extra": ""}),
        "simple_dyna_sequence": (
            write_dyna_sequence,
            DYNA_SEQUENCE,
            {"extra": "", "idle_us": idle_us},
        ),
        "simple_string_dyna_sequence": (
            write_string_dyna_sequence,
            STRING_DYNA_SEQUENCE,
            {"extra": "", "idle_us": idle_us},
        ),
        "accumulate_direct": (
            write_accumulate,
            ACCUMULATE,
            {"strategy": "direct { }", "idle_us": idle_us, "max_batch": 8},
        ),
        "unbatched": (
            partial(write_accumulate, batched=False),
            ACCUMULATE,
            {"strategy": "direct { }", "idle_us": idle_us, "max_batch": 0},
        ),
        "one_slot": (
            write_accumulate,
            ACCUMULATE,
            {"strategy": "direct { }", "idle_us": 60_000_000, "max_batch": 1},
        ),
        "unloaded_one_slot": (  # one_slot's twin, unloaded by a test
            write_accumulate,
            ACCUMULATE,
            {"strategy": "direct { }", "idle_us": 60_000_000, "max_batch": 1},
        ),
        "accumulate_oldest": (
            write_accumulate,
            ACCUMULATE,
            {
                "strategy": "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
                "max_queue_delay_microseconds: 2000 preserve_ordering: true }",
                "idle_us": idle_us,
                "max_batch": 8,
            },
        ),
    }
    for name, (write, template, values) in models.items():
        write(root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(template.format(name=name, count=count, **values))
    tensor = [("INPUT", "TYPE_INT32", "[ 1 ]")]
    write_ensemble(
        root,
        "accumulate_ensemble",
        ensemble_config(
            "accumulate_ensemble",
            [("accumulate_direct", {"INPUT": "INPUT"}, {"OUTPUT": "OUTPUT"})],
            tensor,
            [("OUTPUT", "TYPE_INT32", "[ 1 ]")],
        ),
    )


#: ``write_wide_state``'s state: so many INT32 a sequence (4 MiB).
WIDE_STATE_ELEMENTS = 1 << 20

#: The head of ``WIDE_STATE`` and ``WIDE_INPUT``: a sequence model of one slot, the direct
#: strategy, READY its one control, its sequence_batching block left open.
_WIDE_HEAD = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 1
sequence_batching {{
  max_sequence_idle_microseconds: 600000000
  direct {{ }}
  control_input [
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
"""

WIDE_STATE = (
    _WIDE_HEAD
    + """  state [ {{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32
             dims: [ {elements} ] }} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
)


def write_wide_state(root: Path, name: str = "wide_state") -> None:
    """A sequence model whose implicit state is ``WIDE_STATE_ELEMENTS`` wide, each element
    the running sum of the inputs (OUTPUT = INPUT * READY): what a sequence leaves in its
    worker shows in the worker's memory."""
    nodes = [
        helper.make_node("Mul", ["INPUT", "READY"], ["OUTPUT"]),
        helper.make_node("Add", ["ACC_IN", "OUTPUT"], ["ACC_OUT"]),
    ]
    wide = ["batch", WIDE_STATE_ELEMENTS]
    graph = helper.make_graph(
        nodes,
        name,
        [_io("INPUT"), _io("READY"), helper.make_tensor_value_info("ACC_IN", INT32, wide)],
        [_io("OUTPUT"), helper.make_tensor_value_info("ACC_OUT", INT32, wide)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = root / name / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    config = WIDE_STATE.format(name=name, elements=WIDE_STATE_ELEMENTS)
    (root / name / "config.pbtxt").write_text(config)


WIDE_INPUT = (
    _WIDE_HEAD
    + """}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
)


def write_wide_input(root: Path, name: str = "wide_input") -> None:
    """A sequence model of one slot whose INPUT is as wide as a request makes it:
    OUTPUT = READY * the sum of INPUT (requests of any size waiting for its slot)."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("ReduceSum", ["INPUT", "axes"], ["sum"], keepdims=1),
        helper.make_node("Mul", ["READY", "sum"], ["OUTPUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("INPUT", INT32, ["batch", "width"]), _io("READY")],
        [_io("OUTPUT")],
        initializer=[axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = root / name / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    (root / name / "config.pbtxt").write_text(WIDE_INPUT.format(name=name))
