"""Tests for model-repository/build.py: every sample model loads in ONNX Runtime, has the
documented signature, computes what its name promises, and the committed copies are current."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from oipserve.models.config.parse import read_model_config

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = REPO_ROOT / "model-repository"

# (name, ORT type, shape) with -1 for symbolic dims.
Signature = list[tuple[str, str, list[int]]]


def _load_build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "model_repository_build", MODEL_REPOSITORY / "build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build_module()

IDENTITY_ORT_TYPES = {
    "bool": "tensor(bool)",
    "uint8": "tensor(uint8)",
    "uint16": "tensor(uint16)",
    "uint32": "tensor(uint32)",
    "uint64": "tensor(uint64)",
    "int8": "tensor(int8)",
    "int16": "tensor(int16)",
    "int32": "tensor(int32)",
    "int64": "tensor(int64)",
    "fp16": "tensor(float16)",
    "fp32": "tensor(float)",
    "fp64": "tensor(double)",
    "bf16": "tensor(bfloat16)",
    "bytes": "tensor(string)",
}

EXPECTED: dict[str, tuple[Signature, Signature]] = {
    "simple": (
        [("INPUT0", "tensor(int32)", [-1, 16]), ("INPUT1", "tensor(int32)", [-1, 16])],
        [("OUTPUT0", "tensor(int32)", [-1, 16]), ("OUTPUT1", "tensor(int32)", [-1, 16])],
    ),
    **{
        f"identity_{name}": (
            [("INPUT0", ort_type, [-1, -1])],
            [("OUTPUT0", ort_type, [-1, -1])],
        )
        for name, ort_type in IDENTITY_ORT_TYPES.items()
    },
    "string_upper": (
        [("INPUT0", "tensor(string)", [-1])],
        [("OUTPUT0", "tensor(string)", [-1])],
    ),
    "versioned": (
        [("INPUT0", "tensor(float)", [-1])],
        [("OUTPUT0", "tensor(float)", [-1])],
    ),
    "reshape": (
        [("DATA", "tensor(float)", [-1]), ("SHAPE", "tensor(int64)", [-1])],
        [("OUTPUT0", "tensor(float)", [-1, -1])],
    ),
    "image_nhwc_u8": (
        [("image", "tensor(uint8)", [-1, 224, 224, 3])],
        [("mean", "tensor(float)", [-1, 3]), ("pixels", "tensor(uint8)", [-1, 224, 224, 3])],
    ),
    "image_nchw_fp32": (
        [("image", "tensor(float)", [-1, 3, 32, 32])],
        [("pixels", "tensor(float)", [-1, 3, 32, 32])],
    ),
    "image_nhwc_fp32": (
        [("image", "tensor(float)", [-1, 224, 224, 3])],
        [("mean", "tensor(float)", [-1, 3])],
    ),
    "image_rgb_fp32": (
        [("image", "tensor(float)", [-1, -1, -1, 3])],
        [("pixels", "tensor(float)", [-1, -1, -1, 3])],
    ),
    # BIAS has an initializer, so ORT does not list it among the (required) inputs.
    "reshape_optional": (
        [("X", "tensor(float)", [-1, 2, 2])],
        [("Y", "tensor(float)", [-1, 2, 2])],
    ),
    "batched": (
        [("INPUT0", "tensor(float)", [-1, 4]), ("TEXT", "tensor(string)", [-1, 1])],
        [
            ("OUTPUT0", "tensor(float)", [-1, 4]),
            ("TEXT_OUT", "tensor(string)", [-1, 1]),
            ("ROWS", "tensor(int64)", [-1, 1]),
        ],
    ),
    "simple_int8": (
        [("INPUT0", "tensor(int8)", [-1, 16]), ("INPUT1", "tensor(int8)", [-1, 16])],
        [("OUTPUT0", "tensor(int8)", [-1, 16]), ("OUTPUT1", "tensor(int8)", [-1, 16])],
    ),
    "simple_string": (
        [("INPUT0", "tensor(string)", [-1, 16]), ("INPUT1", "tensor(string)", [-1, 16])],
        [("OUTPUT0", "tensor(string)", [-1, 16]), ("OUTPUT1", "tensor(string)", [-1, 16])],
    ),
    "simple_identity": (
        [("INPUT0", "tensor(string)", [-1, -1])],
        [("OUTPUT0", "tensor(string)", [-1, -1])],
    ),
    "simple_autofill": (
        [("INPUT0", "tensor(int32)", [-1, 16]), ("INPUT1", "tensor(int32)", [-1, 16])],
        [("OUTPUT0", "tensor(int32)", [-1, 16]), ("OUTPUT1", "tensor(int32)", [-1, 16])],
    ),
}

# Models with a config.pbtxt: all but simple_autofill, whose configuration is completed from
# its graph (docs/model-config.md, "Auto-complete").
CONFIGURED = tuple(name for name in EXPECTED if name != "simple_autofill")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model-repository")
    names = build.build_all(out)
    assert names == list(EXPECTED)
    return out


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the reshape model's rank-mismatch warnings are expected
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _signature(args: list[Any]) -> Signature:
    """ORT's view of inputs/outputs; symbolic dims must be named (str) and are mapped to -1."""
    result: Signature = []
    for arg in args:
        for dim in arg.shape:
            assert isinstance(dim, str | int) and dim != -1, f"{arg.name}: dim {dim!r} not symbolic"
        shape = [dim if isinstance(dim, int) else -1 for dim in arg.shape]
        result.append((arg.name, arg.type, shape))
    return result


def _model_files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.name in ("model.onnx", "config.pbtxt")
    )


@pytest.mark.parametrize("name", list(EXPECTED))
def test_signature_and_metadata(built: Path, name: str) -> None:
    versions = sorted(p.name for p in (built / name).iterdir() if p.is_dir())
    assert versions == (["1", "2"] if name == "versioned" else ["1"])
    for version in versions:
        path = built / name / version / "model.onnx"
        model = onnx.load(str(path))
        assert model.ir_version == 8
        assert {(o.domain, o.version) for o in model.opset_import} == {("", 17)}
        assert model.producer_name == "oipserve-model-repository"
        session = _session(path)
        assert (_signature(session.get_inputs()), _signature(session.get_outputs())) == (
            EXPECTED[name]
        )


def test_files_and_size(built: Path) -> None:
    expected = [f"{n}/1/model.onnx" for n in EXPECTED]
    expected += [f"{n}/config.pbtxt" for n in CONFIGURED]
    expected.append("versioned/2/model.onnx")
    assert _model_files(built) == sorted(expected)
    total = sum((built / f).stat().st_size for f in expected)
    assert total < 64 * 1024, f"sample repository grew to {total} bytes"


def test_build_is_deterministic(built: Path, tmp_path: Path) -> None:
    build.main(["--out", str(tmp_path)])
    for relative in _model_files(built):
        assert (tmp_path / relative).read_bytes() == (built / relative).read_bytes(), relative


def test_committed_repository_is_current(built: Path) -> None:
    """Fails when build.py changed but model-repository/ was not regenerated (or vice versa)."""
    hint = "run: python model-repository/build.py"
    for relative in _model_files(built):
        committed = MODEL_REPOSITORY / relative
        assert committed.is_file(), f"{relative} missing from model-repository/; {hint}"
        assert committed.read_bytes() == (built / relative).read_bytes(), f"{relative}: {hint}"
    stale = [
        p.relative_to(MODEL_REPOSITORY).as_posix()
        for p in MODEL_REPOSITORY.rglob("model.onnx")
        if not (built / p.relative_to(MODEL_REPOSITORY)).exists()
    ]
    assert not stale, f"not produced by build.py: {stale}"


def test_simple_computes_sum_and_difference(built: Path) -> None:
    session = _session(built / "simple" / "1" / "model.onnx")
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 7, dtype=np.int32) - a[::-1]
    out0, out1 = session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    assert out0.dtype == out1.dtype == np.int32


def test_simple_int8_wraps_as_int8(built: Path) -> None:
    session = _session(built / "simple_int8" / "1" / "model.onnx")
    a = np.array([list(range(15)) + [127]], dtype=np.int8)
    b = np.ones((1, 16), dtype=np.int8)
    out0, out1 = session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert out0.dtype == out1.dtype == np.int8
    assert out0.tolist() == [list(range(1, 16)) + [-128]]
    assert out1.tolist() == [list(range(-1, 14)) + [126]]


def test_simple_string_adds_decimal_strings(built: Path) -> None:
    """Triton's simple_string: decimal integers in, their sum and difference out as text."""
    session = _session(built / "simple_string" / "1" / "model.onnx")
    a = np.array([[str(i) for i in range(16)], ["-7"] * 16], dtype=object)
    b = np.array([["1"] * 16, ["10"] * 16], dtype=object)
    out0, out1 = session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert out0.tolist() == [[str(i + 1) for i in range(16)], ["3"] * 16]
    assert out1.tolist() == [[str(i - 1) for i in range(16)], ["-17"] * 16]


def test_simple_identity_keeps_bytes(built: Path) -> None:
    session = _session(built / "simple_identity" / "1" / "model.onnx")
    x = np.array([["he\x00llo", ""], ["ü", "\x00\x01\x02\x03"]], dtype=object)
    (out,) = session.run(None, {"INPUT0": x})
    assert out.tolist() == x.tolist()


@pytest.mark.parametrize(
    "name, data_type, ort_type",
    [
        ("simple", "INT32", "tensor(int32)"),
        ("simple_int8", "INT8", "tensor(int8)"),
        ("simple_string", "BYTES", "tensor(string)"),
    ],
)
def test_simple_config_matches_model(built: Path, name: str, data_type: str, ort_type: str) -> None:
    config = read_model_config(built / name / "config.pbtxt")
    session = _session(built / name / "1" / "model.onnx")
    assert config.name == name and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8
    assert config.instance_groups[0].kind == "KIND_CPU" and config.instance_groups[0].count == 1
    for tensors, args in (
        (config.inputs, session.get_inputs()),
        (config.outputs, session.get_outputs()),
    ):
        assert [t.name for t in tensors] == [a.name for a in args]
        for tensor, arg in zip(tensors, args, strict=True):
            assert tensor.data_type == data_type and arg.type == ort_type
            assert list(tensor.dims) == arg.shape[1:]  # batch dim implied by max_batch_size


UNBATCHED = (
    *(f"identity_{name}" for name in IDENTITY_ORT_TYPES),
    "string_upper",
    "versioned",
    "reshape",
    "image_nhwc_u8",
    "image_nchw_fp32",
    "image_nhwc_fp32",
)


@pytest.mark.parametrize("name", UNBATCHED)
def test_unbatched_configs_list_the_graph(built: Path, name: str) -> None:
    """The models served without batching list every input and output as the graph has
    them: a configuration without them would be completed, and batched (auto-complete)."""
    text = (built / name / "config.pbtxt").read_text()
    config = read_model_config(built / name / "config.pbtxt")
    assert text.startswith(build.UNBATCHED_NOTE) and config.max_batch_size == 0
    for tensors, signature in zip((config.inputs, config.outputs), EXPECTED[name], strict=True):
        assert [(t.name, list(t.dims)) for t in tensors] == [(n, s) for n, _, s in signature]


@pytest.mark.parametrize("version, addend", [(1, 1.0), (2, 2.0)])
def test_versioned_adds_version(built: Path, version: int, addend: float) -> None:
    session = _session(built / "versioned" / str(version) / "model.onnx")
    x = np.array([0.0, 1.5, -3.0], dtype=np.float32)
    (out,) = session.run(None, {"INPUT0": x})
    np.testing.assert_array_equal(out, x + addend)


def test_string_upper(built: Path) -> None:
    session = _session(built / "string_upper" / "1" / "model.onnx")
    x = np.array(["hello", "Mixed Case 123", "", "héllo"], dtype=object)
    (out,) = session.run(None, {"INPUT0": x})
    # locale "C": only ASCII letters change case.
    assert out.tolist() == ["HELLO", "MIXED CASE 123", "", "HéLLO"]


@pytest.mark.parametrize(
    "type_name, values",
    [
        ("bool", np.array([[True, False, True]])),
        ("uint8", np.array([[0, 255], [1, 2]], dtype=np.uint8)),
        ("uint16", np.array([[0, 65535]], dtype=np.uint16)),
        ("uint32", np.array([[0, 2**32 - 1]], dtype=np.uint32)),
        ("uint64", np.array([[0, 2**64 - 1]], dtype=np.uint64)),
        ("int8", np.array([[-128, 127]], dtype=np.int8)),
        ("int16", np.array([[-32768, 32767]], dtype=np.int16)),
        ("int32", np.array([[-(2**31), 2**31 - 1]], dtype=np.int32)),
        ("int64", np.array([[-(2**63), 2**63 - 1]], dtype=np.int64)),
        ("fp16", np.array([[0.5, -65504.0, np.inf]], dtype=np.float16)),
        ("fp32", np.array([[1.25, -3.0e38]], dtype=np.float32)),
        ("fp64", np.array([[1e-300, -2.5]], dtype=np.float64)),
        ("bytes", np.array([["a", ""], ["ü", "xyz"]], dtype=object)),
    ],
)
def test_identity_round_trip(built: Path, type_name: str, values: np.ndarray) -> None:
    session = _session(built / f"identity_{type_name}" / "1" / "model.onnx")
    (out,) = session.run(None, {"INPUT0": values})
    assert out.dtype == values.dtype and out.shape == values.shape
    assert out.tolist() == values.tolist()


def test_identity_bf16_via_ortvalue(built: Path) -> None:
    """ORT's run() rejects numpy input for bfloat16 (numpy has no bf16), so feed raw bf16 bits
    as an OrtValue and bind a uint16 output buffer."""
    session = _session(built / "identity_bf16" / "1" / "model.onnx")
    # bf16 bit patterns of 1.0, -2.0, 0.5, inf
    bits = np.array([[0x3F80, 0xC000], [0x3F00, 0x7F80]], dtype=np.uint16)
    with pytest.raises(Exception, match="bfloat16"):
        session.run(None, {"INPUT0": bits})
    feed = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx.TensorProto.BFLOAT16)
    result = np.zeros_like(bits)
    fetch = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(result, onnx.TensorProto.BFLOAT16)
    binding = session.io_binding()
    binding.bind_ortvalue_input("INPUT0", feed)
    binding.bind_ortvalue_output("OUTPUT0", fetch)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(result, bits)


def test_reshape_succeeds_then_fails_at_run_time(built: Path) -> None:
    session = _session(built / "reshape" / "1" / "model.onnx")
    data = np.arange(6, dtype=np.float32)
    (out,) = session.run(None, {"DATA": data, "SHAPE": np.array([2, 3], dtype=np.int64)})
    np.testing.assert_array_equal(out, data.reshape(2, 3))
    with pytest.raises(Exception, match="cannot be reshaped"):
        session.run(None, {"DATA": data, "SHAPE": np.array([4, 4], dtype=np.int64)})
    # The session stays usable after the failure.
    (out,) = session.run(None, {"DATA": data, "SHAPE": np.array([3, -1], dtype=np.int64)})
    assert out.shape == (3, 2)


def test_image_nhwc_u8(built: Path) -> None:
    session = _session(built / "image_nhwc_u8" / "1" / "model.onnx")
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, size=(2, 224, 224, 3), dtype=np.uint8)
    mean, pixels = session.run(["mean", "pixels"], {"image": image})
    assert mean.shape == (2, 3) and mean.dtype == np.float32
    np.testing.assert_allclose(mean, image.astype(np.float64).mean(axis=(1, 2)), rtol=1e-5)
    np.testing.assert_array_equal(pixels, image)
    assert pixels.dtype == np.uint8


def test_image_nchw_fp32(built: Path) -> None:
    session = _session(built / "image_nchw_fp32" / "1" / "model.onnx")
    image = np.random.default_rng(2).random((1, 3, 32, 32), dtype=np.float32)
    (pixels,) = session.run(None, {"image": image})
    np.testing.assert_array_equal(pixels, image)


def test_matmul_relu(tmp_path: Path) -> None:
    assert build.build_matmul_relu(tmp_path) == "matmul_relu"
    path = tmp_path / "matmul_relu" / "1" / "model.onnx"
    model = onnx.load(str(path))
    (weight,) = (numpy_helper.to_array(t) for t in model.graph.initializer)
    assert weight.shape == (1024, 1024) and weight.dtype == np.float32
    session = _session(path)
    assert _signature(session.get_inputs()) == [("INPUT0", "tensor(float)", [-1, 1024])]
    assert _signature(session.get_outputs()) == [("OUTPUT0", "tensor(float)", [-1, 1024])]
    x = np.random.default_rng(3).standard_normal((4, 1024), dtype=np.float32)
    (out,) = session.run(None, {"INPUT0": x})
    expected = np.maximum(x @ weight, 0)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert (out == 0).any() and (out > 0).any()
    # Seeded: a second build gives the same weights.
    assert build.make_matmul_relu().SerializeToString() == path.read_bytes()


def test_batched_reports_the_rows_of_its_execution(built: Path) -> None:
    session = _session(built / "batched" / "1" / "model.onnx")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    text = np.array([["a"], ["b"], ["c"]], dtype=object)
    out, text_out, rows = session.run(None, {"INPUT0": x, "TEXT": text})
    np.testing.assert_array_equal(out, x + 1)
    assert text_out.tolist() == text.tolist()
    assert rows.tolist() == [[3], [3], [3]]
