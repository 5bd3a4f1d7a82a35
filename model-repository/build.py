"""Build the sample ONNX model repository used by tests, examples and benchmarks.

The models are generated with the ONNX helper API rather than downloaded, so the repository
is reproducible offline and stays tiny. Output is byte-identical across runs (fixed producer,
no timestamps), which lets a test check that the committed files match a fresh build.

Usage: python model-repository/build.py [--out DIR]   (default DIR: this script's folder)
Any interpreter will do: without onnx it re-runs itself with the repository's .venv/bin/python
(the README's venv, installed with the test extra) when there is one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError as missing:
    VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
    if VENV_PYTHON.is_file() and Path(sys.executable).absolute() != VENV_PYTHON.absolute():
        os.execv(VENV_PYTHON, [str(VENV_PYTHON), __file__, *sys.argv[1:]])
    raise SystemExit(
        f"build.py needs numpy and onnx ({missing}): run it with a Python that has the test "
        "extra (python3 -m venv .venv && .venv/bin/pip install -e '.[test]')"
    ) from None

OPSET = 17
IR_VERSION = 8  # onnxruntime 1.31 loads IR 8; newer IRs would needlessly narrow support
PRODUCER_NAME = "oipserve-model-repository"
PRODUCER_VERSION = "1"

Dims = Sequence[int | str] | None

# OIP datatype suffix (lower-case, as used in model names) -> ONNX element type.
IDENTITY_TYPES: dict[str, int] = {
    "bool": TensorProto.BOOL,
    "uint8": TensorProto.UINT8,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
    "uint64": TensorProto.UINT64,
    "int8": TensorProto.INT8,
    "int16": TensorProto.INT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "fp16": TensorProto.FLOAT16,
    "fp32": TensorProto.FLOAT,
    "fp64": TensorProto.DOUBLE,
    "bf16": TensorProto.BFLOAT16,
    "bytes": TensorProto.STRING,
}


def _add_sub_config(name: str, data_type: str) -> str:
    """config.pbtxt of Triton's `simple` family: INPUT0, INPUT1 -> OUTPUT0, OUTPUT1, all [16]."""
    tensors = {
        kind: ",\n".join(
            f'  {{\n    name: "{kind.upper()}{i}"\n'
            f"    data_type: {data_type}\n    dims: [ 16 ]\n  }}"
            for i in (0, 1)
        )
        for kind in ("input", "output")
    }
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f"input [\n{tensors['input']}\n]\noutput [\n{tensors['output']}\n]\n"
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n"
    )


SIMPLE_CONFIG = _add_sub_config("simple", "TYPE_INT32")
# Triton's examples (simple_grpc_explicit_int8_content_client.py) call it with INT8 tensors.
SIMPLE_INT8_CONFIG = _add_sub_config("simple_int8", "TYPE_INT8")
# Triton's string examples: BYTES elements hold decimal integers; outputs are decimal strings.
SIMPLE_STRING_CONFIG = _add_sub_config("simple_string", "TYPE_STRING")

# Triton's string examples echo BYTES tensors (embedded NULs, arbitrary bytes) through it.
SIMPLE_IDENTITY_CONFIG = """\
name: "simple_identity"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }
]
"""

# Image preprocessing settings read by the image-input path (docs/images.md).
IMAGE_RGB_FP32_CONFIG = """\
name: "image_rgb_fp32"
platform: "onnxruntime_onnx"
max_batch_size: 2
parameters [
  {
    key: "color_order"
    value: { string_value: "RGB" }
  },
  {
    key: "mean"
    value: { string_value: "10" }
  },
  {
    key: "scale"
    value: { string_value: "2" }
  }
]
"""

#: Heads the config.pbtxt of each model served without batching (``_unbatched_config``).
UNBATCHED_NOTE = """\
# Every input and output listed, no max_batch_size: served without batching, with the
# graph's own shapes. Without this file, auto-complete (Triton's) would make this graph,
# whose first dims are all variable, a batching model (max_batch_size 4, dynamic_batching).
"""

Tensors = list[tuple[str, str, list[int]]]


def _unbatched_config(inputs: Tensors, outputs: Tensors, extra: str = "") -> str:
    """config.pbtxt listing every input and output (name, Triton datatype, dims) of a model
    served without batching; ``extra``: more fields, first. No ``name``: the directory's is
    taken, so a copy under another name serves as it is (tests and users make such copies)."""

    def block(kind: str, tensors: Tensors) -> str:
        items = [
            f'  {{ name: "{n}" data_type: {t} dims: [ {", ".join(str(d) for d in dims)} ] }}'
            for n, t, dims in tensors
        ]
        return f"{kind} [\n" + ",\n".join(items) + "\n]\n"

    return UNBATCHED_NOTE + extra + block("input", inputs) + block("output", outputs)


def _triton_type(type_name: str) -> str:
    """An identity model's suffix as Triton's config datatype (bytes: TYPE_STRING)."""
    return "TYPE_STRING" if type_name == "bytes" else f"TYPE_{type_name.upper()}"


# Serve both versions: Triton's default version policy serves only the latest.
VERSIONED_CONFIG = _unbatched_config(
    [("INPUT0", "TYPE_FP32", [-1])],
    [("OUTPUT0", "TYPE_FP32", [-1])],
    "version_policy: { all { } }\n",
)

# Clients send X as [batch, 4] and get Y as [batch, 4]; the graph works on [batch, 2, 2].
# BIAS is optional: the graph gives it a default (an initializer), a request may override it.
RESHAPE_OPTIONAL_CONFIG = """\
name: "reshape_optional"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [
  {
    name: "X"
    data_type: TYPE_FP32
    dims: [ 4 ]
    reshape: { shape: [ 2, 2 ] }
  },
  {
    name: "BIAS"
    data_type: TYPE_FP32
    dims: [ 2, 2 ]
    optional: true
  }
]
output [
  {
    name: "Y"
    data_type: TYPE_FP32
    dims: [ 4 ]
    reshape: { shape: [ 2, 2 ] }
  }
]
"""

# Dynamic batching: requests that wait together run as one batch of up to 16 rows.
BATCHED_CONFIG = """\
name: "batched"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ROWS" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""

MATMUL_SIZE = 1024
MATMUL_SEED = 20240601


def _tensor(name: str, elem_type: int, dims: Dims) -> onnx.ValueInfoProto:
    """Value info whose string dims become symbolic, so ORT reports them as names (-> -1)."""
    return helper.make_tensor_value_info(name, elem_type, dims)


def _model(
    graph_name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] | None = None,
    doc: str = "",
) -> onnx.ModelProto:
    """Assemble and validate a model with the repository-wide opset, IR version and producer."""
    graph = helper.make_graph(
        nodes, graph_name, inputs, outputs, initializer=initializers or [], doc_string=doc
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name=PRODUCER_NAME,
        producer_version=PRODUCER_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _write(out: Path, model_name: str, version: int, model: onnx.ModelProto) -> Path:
    """Write `out/<model>/<version>/model.onnx` (Triton layout) and return its path."""
    path = out / model_name / str(version) / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def _write_with_config(out: Path, model_name: str, model: onnx.ModelProto, config: str) -> str:
    """Write version 1 of a model and its config.pbtxt; return the model's name."""
    _write(out, model_name, 1, model)
    (out / model_name / "config.pbtxt").write_text(config, encoding="utf-8")
    return model_name


def make_simple(name: str = "simple", elem_type: int = TensorProto.INT32) -> onnx.ModelProto:
    """Triton's `simple` example: element-wise sum and difference of two [-1,16] inputs.

    INT32 for `simple`; `simple_int8` is the same graph over INT8 (wrapping as INT8 does).
    """
    dims: Dims = ["batch", 16]
    return _model(
        name,
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        [_tensor("INPUT0", elem_type, dims), _tensor("INPUT1", elem_type, dims)],
        [_tensor("OUTPUT0", elem_type, dims), _tensor("OUTPUT1", elem_type, dims)],
        doc="OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1",
    )


def build_simple(out: Path) -> str:
    """Write `simple` and its Triton config.pbtxt."""
    return _write_with_config(out, "simple", make_simple(), SIMPLE_CONFIG)


def build_simple_autofill(out: Path) -> str:
    """Write `simple_autofill`: `simple`'s graph without a config.pbtxt, served as Triton
    serves it, its configuration completed from the graph (max_batch_size 4, dynamic
    batching, dims [16]; docs/model-config.md, "Auto-complete")."""
    _write(out, "simple_autofill", 1, make_simple("simple_autofill"))
    return "simple_autofill"


def build_simple_int8(out: Path) -> str:
    """Write `simple_int8` (Triton's INT8 `simple`) and its config.pbtxt."""
    return _write_with_config(
        out, "simple_int8", make_simple("simple_int8", TensorProto.INT8), SIMPLE_INT8_CONFIG
    )


def make_simple_string() -> onnx.ModelProto:
    """Triton's `simple_string`: BYTES [-1,16] inputs holding decimal integers.

    Cast parses each element as an INT32, Add/Sub compute as `simple` does, and Cast writes
    the results back as decimal strings ("-1", "16"). An element that is not a decimal
    integer makes ONNX Runtime fail the request (a 400 with its message).
    """
    dims: Dims = ["batch", 16]
    nodes = [
        helper.make_node("Cast", [name], [f"{name}_INT"], name=f"parse{i}", to=TensorProto.INT32)
        for i, name in enumerate(("INPUT0", "INPUT1"))
    ]
    nodes += [
        helper.make_node("Add", ["INPUT0_INT", "INPUT1_INT"], ["SUM"], name="add"),
        helper.make_node("Sub", ["INPUT0_INT", "INPUT1_INT"], ["DIFFERENCE"], name="sub"),
        helper.make_node("Cast", ["SUM"], ["OUTPUT0"], name="format0", to=TensorProto.STRING),
        helper.make_node(
            "Cast", ["DIFFERENCE"], ["OUTPUT1"], name="format1", to=TensorProto.STRING
        ),
    ]
    return _model(
        "simple_string",
        nodes,
        [_tensor("INPUT0", TensorProto.STRING, dims), _tensor("INPUT1", TensorProto.STRING, dims)],
        [
            _tensor("OUTPUT0", TensorProto.STRING, dims),
            _tensor("OUTPUT1", TensorProto.STRING, dims),
        ],
        doc="OUTPUT0 = str(int(INPUT0) + int(INPUT1)), OUTPUT1 = str(int(INPUT0) - int(INPUT1))",
    )


def build_simple_string(out: Path) -> str:
    """Write `simple_string` and its config.pbtxt."""
    return _write_with_config(out, "simple_string", make_simple_string(), SIMPLE_STRING_CONFIG)


def build_simple_identity(out: Path) -> str:
    """Write `simple_identity` (Triton's BYTES identity, batched [-1,-1]) and its config.pbtxt."""
    model = make_identity("bytes")
    model.graph.name = "simple_identity"
    onnx.checker.check_model(model, full_check=True)
    return _write_with_config(out, "simple_identity", model, SIMPLE_IDENTITY_CONFIG)


def make_identity(type_name: str) -> onnx.ModelProto:
    """Identity over a [-1,-1] tensor of one OIP datatype, for datatype round-trip tests."""
    elem_type = IDENTITY_TYPES[type_name]
    dims: Dims = ["batch", "n"]
    return _model(
        f"identity_{type_name}",
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        [_tensor("INPUT0", elem_type, dims)],
        [_tensor("OUTPUT0", elem_type, dims)],
        doc=f"OUTPUT0 = INPUT0 ({type_name})",
    )


def build_identity(out: Path, type_name: str) -> str:
    """Write `identity_<type_name>` and its config.pbtxt (no batching)."""
    name = f"identity_{type_name}"
    tensor = _triton_type(type_name)
    config = _unbatched_config([("INPUT0", tensor, [-1, -1])], [("OUTPUT0", tensor, [-1, -1])])
    return _write_with_config(out, name, make_identity(type_name), config)


def make_string_upper() -> onnx.ModelProto:
    """BYTES model: upper-cases each string.

    locale "C" because ORT's default (en_US.UTF-8) is missing on minimal images and then the
    session fails to load; with "C" only ASCII letters change case. ORT rejects an empty input.
    """
    return _model(
        "string_upper",
        [
            helper.make_node(
                "StringNormalizer",
                ["INPUT0"],
                ["OUTPUT0"],
                name="upper",
                case_change_action="UPPER",
                locale="C",
            )
        ],
        [_tensor("INPUT0", TensorProto.STRING, ["n"])],
        [_tensor("OUTPUT0", TensorProto.STRING, ["n"])],
        doc="OUTPUT0 = upper(INPUT0), ASCII letters only",
    )


def build_string_upper(out: Path) -> str:
    """Write `string_upper` and its config.pbtxt (no batching)."""
    config = _unbatched_config(
        [("INPUT0", "TYPE_STRING", [-1])], [("OUTPUT0", "TYPE_STRING", [-1])]
    )
    return _write_with_config(out, "string_upper", make_string_upper(), config)


def make_versioned(version: int) -> onnx.ModelProto:
    """`versioned` version N adds N, so a response shows which version served it."""
    addend = numpy_helper.from_array(np.array(float(version), dtype=np.float32), "ADDEND")
    return _model(
        f"versioned_v{version}",
        [helper.make_node("Add", ["INPUT0", "ADDEND"], ["OUTPUT0"], name="add")],
        [_tensor("INPUT0", TensorProto.FLOAT, ["n"])],
        [_tensor("OUTPUT0", TensorProto.FLOAT, ["n"])],
        initializers=[addend],
        doc=f"OUTPUT0 = INPUT0 + {version}",
    )


def build_versioned(out: Path) -> str:
    """Write versions 1 and 2 of `versioned`, and a config.pbtxt that serves both."""
    for version in (1, 2):
        _write(out, "versioned", version, make_versioned(version))
    (out / "versioned" / "config.pbtxt").write_text(VERSIONED_CONFIG, encoding="utf-8")
    return "versioned"


def make_reshape() -> onnx.ModelProto:
    """Reshape(DATA, SHAPE): an incompatible SHAPE makes ORT fail at run time, not load time.

    The output is declared rank 2 with symbolic dims: an unknown-rank output would fail the
    ONNX checker and ORT would report its shape as [] (indistinguishable from a scalar).
    Other ranks still run; ORT only logs a shape-mismatch warning.
    """
    return _model(
        "reshape",
        [helper.make_node("Reshape", ["DATA", "SHAPE"], ["OUTPUT0"], name="reshape")],
        [_tensor("DATA", TensorProto.FLOAT, ["n"]), _tensor("SHAPE", TensorProto.INT64, ["rank"])],
        [_tensor("OUTPUT0", TensorProto.FLOAT, ["rows", "cols"])],
        doc="OUTPUT0 = Reshape(DATA, SHAPE)",
    )


def build_reshape(out: Path) -> str:
    """Write `reshape` and its config.pbtxt (no batching: SHAPE is a shape, not rows)."""
    config = _unbatched_config(
        [("DATA", "TYPE_FP32", [-1]), ("SHAPE", "TYPE_INT64", [-1])],
        [("OUTPUT0", "TYPE_FP32", [-1, -1])],
    )
    return _write_with_config(out, "reshape", make_reshape(), config)


def make_reshape_optional() -> onnx.ModelProto:
    """Y = X @ [[1, 0], [0, 2]] + BIAS on [batch, 2, 2]; BIAS defaults to [[10, 20], [30, 40]].

    BIAS is a graph input with an initializer, so ONNX Runtime does not require it.
    Its declared shape has a symbolic batch so a request may give [batch, 2, 2]; the
    default [1, 2, 2] broadcasts over the batch.
    """
    scale = numpy_helper.from_array(np.array([[1, 0], [0, 2]], dtype=np.float32), "SCALE")
    bias = numpy_helper.from_array(np.array([[[10, 20], [30, 40]]], dtype=np.float32), "BIAS")
    return _model(
        "reshape_optional",
        [
            helper.make_node("MatMul", ["X", "SCALE"], ["SCALED"], name="scale"),
            helper.make_node("Add", ["SCALED", "BIAS"], ["Y"], name="bias"),
        ],
        [
            _tensor("X", TensorProto.FLOAT, ["batch", 2, 2]),
            _tensor("BIAS", TensorProto.FLOAT, ["bias_batch", 2, 2]),
        ],
        [_tensor("Y", TensorProto.FLOAT, ["batch", 2, 2])],
        initializers=[scale, bias],
        doc="Y = X @ SCALE + BIAS (BIAS optional)",
    )


def build_reshape_optional(out: Path) -> str:
    """Write `reshape_optional` and its config.pbtxt (reshape, optional input)."""
    return _write_with_config(
        out, "reshape_optional", make_reshape_optional(), RESHAPE_OPTIONAL_CONFIG
    )


def make_batched() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + 1, TEXT_OUT = TEXT, and ROWS: the row count of the execution.

    Every row of ROWS holds the first dimension of the batch the model ran on, so a
    client sees whether its request ran alone or joined with others.
    """
    zero = numpy_helper.from_array(np.array([0], dtype=np.int64), "ZERO")
    one = numpy_helper.from_array(np.array([1], dtype=np.int64), "ONE")
    one_f = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "ONE_F")
    square = numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "SQUARE")
    return _model(
        "batched",
        [
            helper.make_node("Add", ["INPUT0", "ONE_F"], ["OUTPUT0"], name="add"),
            helper.make_node("Identity", ["TEXT"], ["TEXT_OUT"], name="text"),
            helper.make_node("Shape", ["INPUT0"], ["SHAPE"], name="shape"),
            helper.make_node("Slice", ["SHAPE", "ZERO", "ONE"], ["N"], name="rows"),
            helper.make_node("Reshape", ["N", "SQUARE"], ["N11"], name="n11"),
            helper.make_node("Concat", ["N", "ONE"], ["N_BY_1"], axis=0, name="dims"),
            helper.make_node("Expand", ["N11", "N_BY_1"], ["ROWS"], name="expand"),
        ],
        [
            _tensor("INPUT0", TensorProto.FLOAT, ["batch", 4]),
            _tensor("TEXT", TensorProto.STRING, ["batch", 1]),
        ],
        [
            _tensor("OUTPUT0", TensorProto.FLOAT, ["batch", 4]),
            _tensor("TEXT_OUT", TensorProto.STRING, ["batch", 1]),
            _tensor("ROWS", TensorProto.INT64, ["batch", 1]),
        ],
        initializers=[zero, one, one_f, square],
        doc="OUTPUT0 = INPUT0 + 1; TEXT_OUT = TEXT; ROWS = the batch's row count",
    )


def build_batched(out: Path) -> str:
    """Write `batched` and its config.pbtxt (dynamic batching)."""
    return _write_with_config(out, "batched", make_batched(), BATCHED_CONFIG)


def make_image_nhwc_u8() -> onnx.ModelProto:
    """UINT8 NHWC image model: per-channel mean plus the pixels echoed back for exact checks."""
    image_dims: Dims = ["batch", 224, 224, 3]
    return _model(
        "image_nhwc_u8",
        [
            helper.make_node("Cast", ["image"], ["image_f32"], name="cast", to=TensorProto.FLOAT),
            helper.make_node(
                "ReduceMean", ["image_f32"], ["mean"], name="mean", axes=[1, 2], keepdims=0
            ),
            helper.make_node("Identity", ["image"], ["pixels"], name="pixels"),
        ],
        [_tensor("image", TensorProto.UINT8, image_dims)],
        [
            _tensor("mean", TensorProto.FLOAT, ["batch", 3]),
            _tensor("pixels", TensorProto.UINT8, image_dims),
        ],
        doc="mean = per-channel mean over H and W, pixels = image",
    )


def build_image_nhwc_u8(out: Path) -> str:
    """Write `image_nhwc_u8` and its config.pbtxt (no batching)."""
    config = _unbatched_config(
        [("image", "TYPE_UINT8", [-1, 224, 224, 3])],
        [("mean", "TYPE_FP32", [-1, 3]), ("pixels", "TYPE_UINT8", [-1, 224, 224, 3])],
    )
    return _write_with_config(out, "image_nhwc_u8", make_image_nhwc_u8(), config)


def make_image_nchw_fp32() -> onnx.ModelProto:
    """FP32 NCHW image model that echoes its input, for checking image preprocessing."""
    dims: Dims = ["batch", 3, 32, 32]
    return _model(
        "image_nchw_fp32",
        [helper.make_node("Identity", ["image"], ["pixels"], name="pixels")],
        [_tensor("image", TensorProto.FLOAT, dims)],
        [_tensor("pixels", TensorProto.FLOAT, dims)],
        doc="pixels = image",
    )


def build_image_nchw_fp32(out: Path) -> str:
    """Write `image_nchw_fp32` and its config.pbtxt (no batching)."""
    config = _unbatched_config(
        [("image", "TYPE_FP32", [-1, 3, 32, 32])],
        [("pixels", "TYPE_FP32", [-1, 3, 32, 32])],
    )
    return _write_with_config(out, "image_nchw_fp32", make_image_nchw_fp32(), config)


def make_image_nhwc_fp32() -> onnx.ModelProto:
    """FP32 NHWC 224x224 model with a small output, for comparing image bytes with tensors."""
    image_dims: Dims = ["batch", 224, 224, 3]
    return _model(
        "image_nhwc_fp32",
        [helper.make_node("ReduceMean", ["image"], ["mean"], name="mean", axes=[1, 2], keepdims=0)],
        [_tensor("image", TensorProto.FLOAT, image_dims)],
        [_tensor("mean", TensorProto.FLOAT, ["batch", 3])],
        doc="mean = per-channel mean over H and W",
    )


def build_image_nhwc_fp32(out: Path) -> str:
    """Write `image_nhwc_fp32` and its config.pbtxt (no batching)."""
    config = _unbatched_config(
        [("image", "TYPE_FP32", [-1, 224, 224, 3])],
        [("mean", "TYPE_FP32", [-1, 3])],
    )
    return _write_with_config(out, "image_nhwc_fp32", make_image_nhwc_fp32(), config)


def make_image_rgb_fp32() -> onnx.ModelProto:
    """FP32 NHWC model with free height/width that echoes its input (RGB, mean/scale config)."""
    dims: Dims = ["batch", "height", "width", 3]
    return _model(
        "image_rgb_fp32",
        [helper.make_node("Identity", ["image"], ["pixels"], name="pixels")],
        [_tensor("image", TensorProto.FLOAT, dims)],
        [_tensor("pixels", TensorProto.FLOAT, dims)],
        doc="pixels = image",
    )


def build_image_rgb_fp32(out: Path) -> str:
    """Write `image_rgb_fp32` and its config.pbtxt (batch <= 2, RGB, mean 10, scale 2)."""
    return _write_with_config(out, "image_rgb_fp32", make_image_rgb_fp32(), IMAGE_RGB_FP32_CONFIG)


def make_matmul_relu(size: int = MATMUL_SIZE, seed: int = MATMUL_SEED) -> onnx.ModelProto:
    """Compute-bound benchmark model: Relu(INPUT0 @ W) with a fixed seeded [size,size] W."""
    rng = np.random.default_rng(seed)
    # Scaled so activations stay O(1) for unit-variance inputs.
    weight = (rng.standard_normal((size, size), dtype=np.float32) / np.sqrt(size)).astype(
        np.float32
    )
    return _model(
        "matmul_relu",
        [
            helper.make_node("MatMul", ["INPUT0", "W"], ["matmul"], name="matmul"),
            helper.make_node("Relu", ["matmul"], ["OUTPUT0"], name="relu"),
        ],
        [_tensor("INPUT0", TensorProto.FLOAT, ["batch", size])],
        [_tensor("OUTPUT0", TensorProto.FLOAT, ["batch", size])],
        initializers=[numpy_helper.from_array(weight, "W")],
        doc="OUTPUT0 = Relu(INPUT0 @ W)",
    )


def build_matmul_relu(out: Path) -> str:
    """Write `matmul_relu` (4 MiB, so benchmarks build it on demand; not in build_all)."""
    _write(out, "matmul_relu", 1, make_matmul_relu())
    return "matmul_relu"


ENCODER_WIDTH = 64
ENCODER_VOCAB = 100
ENCODER_SEED = 20261128
#: The encoder's padded batching (docs/scheduler.md, "Padded batching"): the client sends
#: input_ids and attention_mask as a Hugging Face tokenizer makes them; both are padded
#: with 0 along the sequence, and `hidden` is cut back to each request's length.
ENCODER_PAD_BATCH = (
    "input input_ids dim 1 pad 0; input attention_mask dim 1 pad 0; output hidden dim 1"
)


def encoder_config(name: str = "encoder", pad_batch: str | None = ENCODER_PAD_BATCH) -> str:
    """The encoder's config.pbtxt; ``pad_batch=None``: batching as Triton does it."""
    parameters = (
        f'parameters {{ key: "pad_batch" value: {{ string_value: "{pad_batch}" }} }}\n'
        if pad_batch
        else ""
    )
    return (
        f'name: "{name}"\n'
        'platform: "onnxruntime_onnx"\n'
        "max_batch_size: 16\n"
        "input [\n"
        '  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },\n'
        '  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }\n'
        "]\n"
        "output [\n"
        f'  {{ name: "hidden" data_type: TYPE_FP32 dims: [ -1, {ENCODER_WIDTH} ] }},\n'
        f'  {{ name: "pooled" data_type: TYPE_FP32 dims: [ {ENCODER_WIDTH} ] }}\n'
        "]\n"
        "dynamic_batching { max_queue_delay_microseconds: 2000 }\n" + parameters
    )


def make_encoder() -> onnx.ModelProto:
    """A small variable-length encoder with an attention mask, for padded batching.

    Embeddings, one masked attention step and a projection, all with weights in {-1, 0, 1}
    and clipped attention scores, so that every value is an integer well under 2^24: float
    sums are then exact in any order, and a request's outputs in a padded batch are
    bit-for-bit its outputs alone (the mask keeps padded keys out; ``pooled`` is a masked
    max over the sequence).
    """
    rng = np.random.default_rng(ENCODER_SEED)
    width = ENCODER_WIDTH

    def weights(*shape: int) -> np.ndarray:
        return rng.integers(-1, 2, shape).astype(np.float32)

    node = helper.make_node
    nodes = [
        node("Gather", ["E", "input_ids"], ["x"], name="embed"),  # [B, L, W]
        node("MatMul", ["x", "W1"], ["xw"], name="project"),
        node("Relu", ["xw"], ["h"], name="relu1"),
        node("Transpose", ["h"], ["ht"], name="keys", perm=[0, 2, 1]),
        node("MatMul", ["h", "ht"], ["raw"], name="scores"),  # [B, L, L]
        node("Clip", ["raw", "zero", "four"], ["clipped"], name="clip"),
        node("Cast", ["attention_mask"], ["m"], name="mask", to=TensorProto.FLOAT),
        node("Unsqueeze", ["m", "axis1"], ["mk"], name="mask_keys"),  # [B, 1, L]
        node("Mul", ["clipped", "mk"], ["scored"], name="mask_scores"),
        node("MatMul", ["scored", "h"], ["ctx"], name="attend"),
        node("MatMul", ["ctx", "W2"], ["cw"], name="ffn"),
        node("Relu", ["cw"], ["hidden"], name="relu2"),
        node("Unsqueeze", ["m", "axis2"], ["mq"], name="mask_rows"),  # [B, L, 1]
        node("Mul", ["hidden", "mq"], ["kept"], name="mask_rows_out"),
        node("ReduceMax", ["kept"], ["pooled"], name="pool", axes=[1], keepdims=0),
    ]
    initializers = [
        numpy_helper.from_array(weights(ENCODER_VOCAB, width), "E"),
        numpy_helper.from_array(weights(width, width), "W1"),
        numpy_helper.from_array(weights(width, width), "W2"),
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
        numpy_helper.from_array(np.array(4, np.float32), "four"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
    ]
    return _model(
        "encoder",
        nodes,
        [
            _tensor("input_ids", TensorProto.INT64, ["batch", "seq"]),
            _tensor("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            _tensor("hidden", TensorProto.FLOAT, ["batch", "seq", width]),
            _tensor("pooled", TensorProto.FLOAT, ["batch", width]),
        ],
        initializers=initializers,
        doc="hidden = Relu(masked clipped attention of Relu(E[ids] @ W1)) @ W2; pooled: masked max",
    )


def build_encoder(
    out: Path, name: str = "encoder", pad_batch: str | None = ENCODER_PAD_BATCH
) -> str:
    """Write the encoder and its config.pbtxt (padded batching; on demand, not in build_all:
    tests and benchmarks/padded_batching.py build it where they need it)."""
    return _write_with_config(out, name, make_encoder(), encoder_config(name, pad_batch))


def _builders() -> list[Callable[[Path], str]]:
    """Builders for every model of the committed sample repository, in output order."""
    builders: list[Callable[[Path], str]] = [build_simple]
    builders += [lambda out, t=t: build_identity(out, t) for t in IDENTITY_TYPES]
    builders += [
        build_string_upper,
        build_versioned,
        build_reshape,
        build_image_nhwc_u8,
        build_image_nchw_fp32,
        build_image_nhwc_fp32,
        build_image_rgb_fp32,
        build_reshape_optional,
        build_batched,
        build_simple_int8,
        build_simple_string,
        build_simple_identity,
        build_simple_autofill,
    ]
    return builders


def build_all(out: Path) -> list[str]:
    """Build the sample repository into `out`; return the model names written."""
    out.mkdir(parents=True, exist_ok=True)
    return [build(out) for build in _builders()]


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="repository folder to write (default: the folder of this script)",
    )
    args = parser.parse_args(argv)
    for name in build_all(args.out):
        print(name)


if __name__ == "__main__":
    main()
