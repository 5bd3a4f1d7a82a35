"""A model repository of small ONNX steps and the ensembles made of them (docs/ensembles.md).

Steps (FP32, ``max_batch_size: 8``, each input ``dims: [ -1 ]`` unless said):

- ``add_one``: ``OUT = IN + 1``; ``double``: ``OUT = IN * 2``; ``plus``: ``OUT = A + B``;
- ``slow_add_one``: ``add_one`` made slow (a chain of no-op nodes) for the unload test;
- ``pixel_mean``: an image input (``IMAGE`` FP32 ``[4, 4, 3]``, NHWC): ``MEAN`` ``[3]``, the
  mean of each channel (the worker decodes PNG/JPEG bytes into it, docs/images.md);
- ``preprocess``: ``OUT = (IN - mean) / scale`` over ``[-1]`` FP32 (the benchmark's first step);
- ``batched_double``: ``double`` with ``dynamic_batching`` (batches of 4, 0.2 s at most).

Ensembles: ``chain`` (add_one then double: ``Y = (X + 1) * 2``), ``diamond`` (add_one and
double of X in parallel, then plus: ``Y = (X + 1) + 2X``), ``image_mean`` (PNG bytes ->
pixel_mean -> double), ``slow_chain`` (slow_add_one then double), ``limited_chain``
(``slow_chain`` with ``max_inflight_requests: 1``), ``batched_chain`` (add_one then
batched_double), ``nested`` (an ensemble as a step, as Triton nests them: ``inner_chain``, a
copy of ``chain`` that only ``nested`` loads, then add_one: ``Y = (X + 1) * 2 + 1``),
``nested_twice`` (``nested`` then double, in a diamond with ``inner_chain``:
``Y = ((X + 1) * 2 + 1) * 2 + (X + 1) * 2``).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.ensemble import EnsembleRunner
from oipserve.dataplane.intake import Intake
from oipserve.errors import InferenceFailed
from oipserve.models.config.parse import parse_model_config
from oipserve.models.ensemble import EnsembleVersion, validate
from oipserve.models.metadata import TensorSpec
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.request.inference import Inference, InferResult, InputTensor, OutputTensor
from oipserve.wire.shm import BufferPool, SegmentCache

__all__ = [
    "ENSEMBLES",
    "StepCalls",
    "fake_ensemble",
    "mapped_output_prefixes",
    "STEPS",
    "ensemble_config",
    "fan_config",
    "write_ensemble",
    "write_repository",
    "write_step",
]

STEPS = (
    "add_one",
    "double",
    "plus",
    "slow_add_one",
    "pixel_mean",
    "preprocess",
    "batched_double",
    "six_wide",
)
ENSEMBLES = (
    "chain",
    "diamond",
    "image_mean",
    "slow_chain",
    "limited_chain",
    "batched_chain",
    "chain3",
    "failing_chain",
    "nested",
    "nested_twice",
)


def _save(path: Path, nodes: list, inputs: list, outputs: list, inits: list) -> None:
    graph = helper.make_graph(nodes, path.parent.parent.name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def _vector(name: str, rank: int = 2) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)


def _const(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([value], np.float32), name)


def _step_config(name: str, inputs: list[str], outputs: list[str], dims: str = "[ -1 ]") -> str:
    tensors = "".join(
        f'input {{ name: "{i}" data_type: TYPE_FP32 dims: {dims} }}\n' for i in inputs
    ) + "".join(f'output {{ name: "{o}" data_type: TYPE_FP32 dims: {dims} }}\n' for o in outputs)
    return f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n{tensors}'


def write_step(root: Path, name: str, slow_nodes: int = 400) -> None:
    """One step model of ``STEPS`` under ``root/name``."""
    path = root / name / "1" / "model.onnx"
    config = _step_config(name, ["IN"], ["OUT"])
    if name in ("add_one", "double", "batched_double"):
        op, value = ("Add", 1.0) if name == "add_one" else ("Mul", 2.0)
        nodes = [helper.make_node(op, ["IN", "c"], ["OUT"])]
        _save(path, nodes, [_vector("IN")], [_vector("OUT")], [_const("c", value)])
        if name == "batched_double":  # waits up to 0.2 s for a batch of 4 rows
            config += (
                "dynamic_batching { preferred_batch_size: [ 4 ] "
                "max_queue_delay_microseconds: 200000 }\n"
            )
    elif name == "slow_add_one":
        nodes, inits, previous = [], [_const("one", 1.0)], "IN"
        for i in range(slow_nodes):
            inits.append(_const(f"z{i}", 0.0 if i % 2 else 1.0))
            nodes.append(
                helper.make_node("Add" if i % 2 else "Mul", [previous, f"z{i}"], [f"t{i}"])
            )
            previous = f"t{i}"
        nodes.append(helper.make_node("Add", [previous, "one"], ["OUT"]))
        _save(path, nodes, [_vector("IN")], [_vector("OUT")], inits)
    elif name == "six_wide":  # a Reshape to [-1, 6]: fails at run time for other sizes
        # NOTE: [-1, 6], not [1, 6]: ONNX Runtime infers the output's shape from it, and
        #   Triton's rule refuses a batching model whose output's first dim is fixed.
        config = _step_config(name, ["IN"], []) + (
            'output { name: "OUT" data_type: TYPE_FP32 dims: [ 6 ] }\n'
        )
        shape = numpy_helper.from_array(np.array([-1, 6], np.int64), "shape")
        nodes = [helper.make_node("Reshape", ["IN", "shape"], ["OUT"])]
        _save(path, nodes, [_vector("IN")], [_vector("OUT")], [shape])
    elif name == "plus":
        config = _step_config(name, ["A", "B"], ["OUT"])
        nodes = [helper.make_node("Add", ["A", "B"], ["OUT"])]
        _save(path, nodes, [_vector("A"), _vector("B")], [_vector("OUT")], [])
    elif name == "preprocess":
        nodes = [
            helper.make_node("Sub", ["IN", "mean"], ["centred"]),
            helper.make_node("Div", ["centred", "scale"], ["OUT"]),
        ]
        inits = [_const("mean", 0.5), _const("scale", 0.25)]
        _save(path, nodes, [_vector("IN")], [_vector("OUT")], inits)
    elif name == "pixel_mean":
        config = (
            'name: "pixel_mean"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input { name: "IMAGE" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 4, 4, 3 ] }\n'
            'output { name: "MEAN" data_type: TYPE_FP32 dims: [ 3 ] }\n'
            'parameters { key: "layout" value: { string_value: "NHWC" } }\n'
        )
        # NOTE: opset 13: ReduceMean's axes is an attribute.
        node = helper.make_node("ReduceMean", ["IMAGE"], ["MEAN"], keepdims=0, axes=[1, 2])
        image = helper.make_tensor_value_info("IMAGE", TensorProto.FLOAT, [None, 4, 4, 3])
        mean = helper.make_tensor_value_info("MEAN", TensorProto.FLOAT, [None, 3])
        _save(path, [node], [image], [mean], [])
    else:
        raise ValueError(f"no step model named {name!r}")
    (root / name / "config.pbtxt").write_text(config)


def ensemble_config(
    name: str,
    steps: list[tuple[str, dict[str, str], dict[str, str]]],
    inputs: list[tuple[str, str, str]],
    outputs: list[tuple[str, str, str]],
    max_batch_size: int = 8,
    extra: str = "",
) -> str:
    """An ensemble's config.pbtxt: ``steps`` of (model, input_map, output_map) and its
    ``inputs`` / ``outputs`` of (name, TYPE_..., dims text)."""
    text = f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
    for key, tensors in (("input", inputs), ("output", outputs)):
        for tensor, dtype, dims in tensors:
            text += f'{key} {{ name: "{tensor}" data_type: {dtype} dims: {dims} }}\n'
    text += "ensemble_scheduling {\n" + extra
    for model, input_map, output_map in steps:
        text += f'  step {{ model_name: "{model}" model_version: -1\n'
        for key, value in input_map.items():
            text += f'    input_map {{ key: "{key}" value: "{value}" }}\n'
        for key, value in output_map.items():
            text += f'    output_map {{ key: "{key}" value: "{value}" }}\n'
        text += "  }\n"
    return text + "}\n"


def fan_config(name: str, width: int) -> str:
    """An ensemble of ``width`` add_one steps all reading its X, run at once: outputs
    Y0 ... Y<width - 1>, each X + 1."""
    steps = [("add_one", {"IN": "X"}, {"OUT": f"Y{n}"}) for n in range(width)]
    outputs = [(f"Y{n}", "TYPE_FP32", "[ -1 ]") for n in range(width)]
    return ensemble_config(name, steps, _X, outputs)


def write_ensemble(root: Path, name: str, config: str) -> None:
    """An ensemble directory: its config.pbtxt and an empty version directory (Triton's)."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(config)


_X = [("X", "TYPE_FP32", "[ -1 ]")]
_Y = [("Y", "TYPE_FP32", "[ -1 ]")]

CONFIGS = {
    "chain": ensemble_config(
        "chain",
        [("add_one", {"IN": "X"}, {"OUT": "x1"}), ("double", {"IN": "x1"}, {"OUT": "Y"})],
        _X,
        _Y,
    ),
    "diamond": ensemble_config(
        "diamond",
        [
            ("plus", {"A": "left", "B": "right"}, {"OUT": "Y"}),
            ("add_one", {"IN": "X"}, {"OUT": "left"}),
            ("double", {"IN": "X"}, {"OUT": "right"}),
        ],
        _X,
        _Y,
    ),
    "image_mean": ensemble_config(
        "image_mean",
        [
            ("pixel_mean", {"IMAGE": "PNG"}, {"MEAN": "mean"}),
            ("double", {"IN": "mean"}, {"OUT": "SCORES"}),
        ],
        [("PNG", "TYPE_STRING", "[ -1 ]")],
        [("SCORES", "TYPE_FP32", "[ -1, 3 ]")],
        max_batch_size=0,
    ),
    "limited_chain": ensemble_config(
        "limited_chain",
        [("slow_add_one", {"IN": "X"}, {"OUT": "x1"}), ("double", {"IN": "x1"}, {"OUT": "Y"})],
        _X,
        _Y,
        extra="  max_inflight_requests: 1\n",
    ),
    "batched_chain": ensemble_config(
        "batched_chain",
        [("add_one", {"IN": "X"}, {"OUT": "x1"}), ("batched_double", {"IN": "x1"}, {"OUT": "Y"})],
        _X,
        _Y,
    ),
    "chain3": ensemble_config(
        "chain3",
        [
            ("add_one", {"IN": "X"}, {"OUT": "x1"}),
            ("double", {"IN": "x1"}, {"OUT": "x2"}),
            ("preprocess", {"IN": "x2"}, {"OUT": "Y"}),
        ],
        _X,
        _Y,
    ),
    "failing_chain": ensemble_config(
        "failing_chain",
        [("add_one", {"IN": "X"}, {"OUT": "x1"}), ("six_wide", {"IN": "x1"}, {"OUT": "Y"})],
        _X,
        _Y,
    ),
    "slow_chain": ensemble_config(
        "slow_chain",
        [("slow_add_one", {"IN": "X"}, {"OUT": "x1"}), ("double", {"IN": "x1"}, {"OUT": "Y"})],
        _X,
        _Y,
    ),
    "nested": ensemble_config(
        "nested",
        [
            ("inner_chain", {"X": "X"}, {"Y": "chained"}),
            ("add_one", {"IN": "chained"}, {"OUT": "Y"}),
        ],
        _X,
        _Y,
    ),
    "nested_twice": ensemble_config(
        "nested_twice",
        [
            ("nested", {"X": "X"}, {"Y": "n"}),
            ("double", {"IN": "n"}, {"OUT": "left"}),
            ("inner_chain", {"X": "X"}, {"Y": "right"}),
            ("plus", {"A": "left", "B": "right"}, {"OUT": "Y"}),
        ],
        _X,
        _Y,
    ),
    "two_inputs": ensemble_config(  # (not in ENSEMBLES: loaded by the test that uses it)
        "two_inputs",
        [("add_one", {"IN": "X"}, {"OUT": "Y"}), ("double", {"IN": "Z"}, {"OUT": "W"})],
        [*_X, ("Z", "TYPE_FP32", "[ -1 ]")],
        [*_Y, ("W", "TYPE_FP32", "[ -1 ]")],
    ),
}
CONFIGS["inner_chain"] = CONFIGS["chain"].replace('name: "chain"', 'name: "inner_chain"', 1)


def write_repository(root: Path, slow_nodes: int = 400) -> Path:
    """Every step of ``STEPS`` and every ensemble of ``CONFIGS`` under ``root``."""
    for name in STEPS:
        write_step(root, name, slow_nodes)
    for name, config in CONFIGS.items():
        write_ensemble(root, name, config)
    return root


_WORKER_SEGMENT = re.compile(r"/dev/shm/(oipserve-\d+-w\d+-)(?:c\d+-)?\d+")


def mapped_output_prefixes(pid: int) -> set[str]:
    """The workers (``oipserve-<front>-w<id>-``) whose output segments process ``pid`` maps:
    a worker's own, and any other worker's it read an ensemble step's input from."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {match.group(1) for match in _WORKER_SEGMENT.finditer(maps)}


class StepCalls:
    """Step models that the front answers itself, for the ensemble runner without workers
    (``tests/unit/test_ensemble_runner.py``): each adds ``add`` to its one input after
    ``delay`` seconds, recording how many of its requests run at once; ``fail`` names steps
    that fail instead."""

    def __init__(self, delay: float = 0.02, fail: frozenset[str] = frozenset()) -> None:
        self.delay = delay
        self.fail = fail
        self.running = 0
        #: Most step requests running at once, across all the step models.
        self.most = 0
        self.calls: list[str] = []

    async def run(self, inference: Inference, stats: object, start: int) -> InferResult:
        """A ``Strategy``: the step's answer, its inputs released as a strategy does."""
        model = inference.model
        self.calls.append(model.name)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay)
            if model.name in self.fail:
                raise InferenceFailed(f"model '{model.name}' failed")
            total = sum(np.frombuffer(_data(t), np.float32) for t in inference.inputs)
            out = (total + float(model.parameters.get("add", "0"))).astype(np.float32)
        finally:
            self.running -= 1
            for held in inference.owned:
                held.release()
        tensor = OutputTensor("OUT", "FP32", list(inference.inputs[0].shape), memoryview(out))
        return InferResult(model, [tensor], lambda: None)


def _data(tensor: InputTensor) -> memoryview:
    if tensor.raw is not None:
        return memoryview(tensor.raw)
    if tensor.located is None:
        raise ValueError(f"input '{tensor.name}' has no bytes here")
    held, start, size = tensor.located
    return held.buf[start : start + size]


def fake_ensemble(
    text: str, adds: dict[str, float], calls: StepCalls
) -> tuple[EnsembleRunner, EnsembleVersion]:
    """The ensemble of config ``text`` over step models ``adds`` (name -> what it adds; inputs
    ``IN`` or ``A``/``B``, output ``OUT``, FP32 ``[-1, -1]``) that ``calls`` answers; call it
    on a running loop."""
    registry = ModelRegistry()
    spec = ("FP32", (-1, -1))
    for name, add in adds.items():
        step = ModelVersion(name, "1", "", None)
        step.echo, step.state, step.max_batch_size = True, "READY", 8
        step.parameters["add"] = str(add)
        names = ("A", "B") if name.startswith("plus") else ("IN",)
        step.set_metadata(tuple(TensorSpec(n, *spec) for n in names), (TensorSpec("OUT", *spec),))
        registry.models[name] = {"1": step}
    config = parse_model_config(text)
    if config.ensemble is None:
        raise ValueError("not an ensemble")
    model = EnsembleVersion(config.name or "e", "1", "", config, config.ensemble, registry)
    model.set_metadata(*validate(model))
    model.state = "READY"
    registry.models[model.name] = {"1": model}
    loop = asyncio.get_running_loop()
    dispatch = Dispatch(SegmentCache(), 8)
    intake = Intake(BufferPool("oipserve-test-unused-"), dispatch, 10.0, loop)
    runner = EnsembleRunner(
        intake,
        dispatch,
        lambda _: calls.run,
        lambda _: None,
        lambda *_: None,  # type: ignore[arg-type,return-value]
    )
    return runner, model
