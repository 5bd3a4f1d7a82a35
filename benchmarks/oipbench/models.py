"""Benchmark models, their example inputs and expected outputs, and each server's repository.

The .onnx files come from model-repository/build.py (loaded by path, so the harness uses the
exact graphs the project ships) and are written to benchmarks/.work/models. Every server then
gets its own repository layout pointing at, or copying, the same files.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

from . import REPO_DIR

BUILD_PY = REPO_DIR / "model-repository" / "build.py"

NP_TO_OIP = {
    np.dtype(np.int32): "INT32",
    np.dtype(np.float32): "FP32",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.int64): "INT64",
}
OIP_TO_NP = {v: k for k, v in NP_TO_OIP.items()}
TRITON_TYPES = {"INT32": "TYPE_INT32", "FP32": "TYPE_FP32", "UINT8": "TYPE_UINT8"}


@dataclass
class ModelCase:
    """One model as the benchmark uses it: where it is, what to send, what must come back."""

    name: str
    onnx_path: Path
    inputs: dict[str, np.ndarray]
    output_names: list[str]
    expected: dict[str, np.ndarray] = field(default_factory=dict)
    max_batch_size: int = 0
    dims: dict[str, list[int]] = field(default_factory=dict)  # config dims (no batch dim)
    tolerance: float = 0.0
    #: A ``dynamic_batching { ... }`` block for every server's config.pbtxt ('' for none).
    dynamic_batching: str = ""

    def tensor_bytes(self) -> int:
        """Input plus output tensor bytes of one request (the payload that MB/s counts)."""
        return sum(a.nbytes for a in self.inputs.values()) + sum(
            a.nbytes for a in self.expected.values()
        )


def load_build_module(path: Path = BUILD_PY) -> ModuleType:
    """Import model-repository/build.py from its path (it is a script, not a package)."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the benchmark models are built by it")
    spec = importlib.util.spec_from_file_location("oipserve_model_build", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_models(out: Path) -> dict[str, ModelCase]:
    """Build simple, identity_fp32 and matmul_relu into `out` and describe them."""
    build = load_build_module()
    out.mkdir(parents=True, exist_ok=True)
    build.build_simple(out)
    build.build_identity(out, "fp32")
    build.build_matmul_relu(out)
    rng = np.random.default_rng(7)
    cases = {
        "simple": ModelCase(
            name="simple",
            onnx_path=out / "simple" / "1" / "model.onnx",
            inputs={
                "INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
                "INPUT1": np.full((1, 16), 3, dtype=np.int32),
            },
            output_names=["OUTPUT0", "OUTPUT1"],
            max_batch_size=8,
            dims={"INPUT0": [16], "INPUT1": [16], "OUTPUT0": [16], "OUTPUT1": [16]},
        ),
        # 1 MiB of FP32: 262,144 elements.
        "identity_fp32": ModelCase(
            name="identity_fp32",
            onnx_path=out / "identity_fp32" / "1" / "model.onnx",
            inputs={"INPUT0": rng.standard_normal((1, 262144), dtype=np.float32)},
            output_names=["OUTPUT0"],
            dims={"INPUT0": [-1, -1], "OUTPUT0": [-1, -1]},
        ),
        "matmul_relu": ModelCase(
            name="matmul_relu",
            onnx_path=out / "matmul_relu" / "1" / "model.onnx",
            inputs={"INPUT0": rng.standard_normal((8, 1024), dtype=np.float32)},
            output_names=["OUTPUT0"],
            dims={"INPUT0": [-1, 1024], "OUTPUT0": [-1, 1024]},
            tolerance=1e-3,
        ),
    }
    # Issue 13: the same MatMul, one row per request, batched by the server (or not).
    one_row = {"INPUT0": rng.standard_normal((1, 1024), dtype=np.float32)}
    for name, batching in (
        ("matmul_batched", "dynamic_batching { max_queue_delay_microseconds: 500 }"),
        ("matmul_unbatched", ""),
    ):
        cases[name] = ModelCase(
            name=name,
            onnx_path=out / "matmul_relu" / "1" / "model.onnx",
            inputs=one_row,
            output_names=["OUTPUT0"],
            max_batch_size=16,
            dims={"INPUT0": [1024], "OUTPUT0": [1024]},
            tolerance=1e-3,
            dynamic_batching=batching,
        )
    for case in cases.values():
        case.expected = reference_outputs(case)
    if hasattr(build, "build_image_nhwc_u8"):
        build.build_image_nhwc_u8(out)
    return cases


def reference_outputs(case: ModelCase) -> dict[str, np.ndarray]:
    """Outputs of the model run in-process by ONNX Runtime: the answer every server must give."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(case.onnx_path), providers=["CPUExecutionProvider"])
    results = session.run(case.output_names, case.inputs)
    return dict(zip(case.output_names, results, strict=True))


def outputs_match(case: ModelCase, got: dict[str, np.ndarray]) -> str | None:
    """None when `got` holds every expected output with the right values, else why not."""
    for name, want in case.expected.items():
        if name not in got:
            return f"output {name} missing (got {sorted(got)})"
        arr = np.asarray(got[name])
        if arr.size != want.size:
            return f"output {name}: {arr.size} elements, expected {want.size}"
        arr = arr.reshape(want.shape).astype(want.dtype, copy=False)
        if case.tolerance:
            if not np.allclose(arr, want, rtol=case.tolerance, atol=case.tolerance):
                return f"output {name}: values differ from in-process ORT"
        elif not np.array_equal(arr, want):
            return f"output {name}: values differ from in-process ORT"
    return None


# --- per-server repositories -------------------------------------------------------------


def _params_pbtxt(params: dict[str, str]) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )


def _io_pbtxt(case: ModelCase) -> str:
    def block(kind: str, names: list[str], arrays: dict[str, np.ndarray]) -> str:
        items = []
        for name in names:
            dtype = TRITON_TYPES[NP_TO_OIP[arrays[name].dtype]]
            dims = ", ".join(str(d) for d in case.dims[name])
            items.append(f'  {{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }}')
        return f"{kind} [\n" + ",\n".join(items) + "\n]\n"

    return block("input", list(case.inputs), case.inputs) + block(
        "output", case.output_names, case.expected
    )


def write_triton_repo(
    cases: dict[str, ModelCase], root: Path, model_py: Path, instances: int, ort: dict[str, str]
) -> Path:
    """Triton python-backend repository: config.pbtxt + model.py + the same model.onnx."""
    if root.exists():
        shutil.rmtree(root)
    for case in cases.values():
        version = root / case.name / "1"
        version.mkdir(parents=True)
        shutil.copy(model_py, version / "model.py")
        (version / "model.onnx").symlink_to(case.onnx_path.resolve())
        config = (
            f'name: "{case.name}"\nbackend: "python"\nmax_batch_size: {case.max_batch_size}\n'
            + _io_pbtxt(case)
            + f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
            + _params_pbtxt(ort)
            + (case.dynamic_batching + "\n" if case.dynamic_batching else "")
        )
        (root / case.name / "config.pbtxt").write_text(config)
    return root


def write_oipserve_repo(
    cases: dict[str, ModelCase], root: Path, instances: int, ort: dict[str, str]
) -> Path:
    """oipserve repository in the Triton layout (platform onnxruntime_onnx), with the ORT
    thread settings in the parameters Triton's own onnxruntime backend reads."""
    if root.exists():
        shutil.rmtree(root)
    for case in cases.values():
        version = root / case.name / "1"
        version.mkdir(parents=True)
        shutil.copy(case.onnx_path, version / "model.onnx")
        config = (
            f'name: "{case.name}"\nplatform: "onnxruntime_onnx"\n'
            f"max_batch_size: {case.max_batch_size}\n"
            # NOTE: the inputs and outputs always: without them auto-complete made
            #   identity_fp32 ([-1, -1]) a batching model of 4 rows (Triton's rule).
            + _io_pbtxt(case)
            + f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
            + _params_pbtxt(ort)
            + (case.dynamic_batching + "\n" if case.dynamic_batching else "")
        )
        (root / case.name / "config.pbtxt").write_text(config)
    # NOTE: any case's .onnx lies in <models>/<name>/1/; a subset of the cases may be given.
    image = next(iter(cases.values())).onnx_path.parent.parent.parent / "image_nhwc_u8"
    if image.exists():
        shutil.copytree(image, root / "image_nhwc_u8")
    return root


def write_mlserver_repo(
    cases: dict[str, ModelCase], root: Path, settings: dict[str, object], ort: dict[str, int]
) -> Path:
    """MLServer repository: settings.json + one model-settings.json per model."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps(settings, indent=2))
    for case in cases.values():
        folder = root / case.name
        folder.mkdir()
        model_settings = {
            "name": case.name,
            "implementation": "mlserver_onnx.OnnxRuntimeModel",
            "parameters": {"uri": str(case.onnx_path.resolve()), "extra": ort},
        }
        (folder / "model-settings.json").write_text(json.dumps(model_settings, indent=2))
    return root
