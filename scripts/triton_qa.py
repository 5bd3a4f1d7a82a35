#!/usr/bin/env python3
"""Run Triton's own QA test files, unmodified, against oipserve (issue 42).

Usage::

    .venv/bin/python scripts/triton_qa.py /path/to/triton-server-checkout [--suite NAME ...]

The checkout is Triton's ``server`` repository (tag v2.71.0 was used for the numbers in
``benchmarks/results/2026-11-28-triton-qa.md``); only its ``qa/`` and
``docs/examples/model_repository`` directories are read, and nothing of it is copied into this
project: the models, repositories and test runs all live in a temporary directory.

What it does, per suite, the way that suite's ``test.sh`` does it:

1. builds the models with Triton's own generators (``qa/common/gen_qa_models.py --onnx``,
   ``--onnx --variable``, ``gen_qa_identity_models.py --onnx``) run by ``--gen-python`` (a venv
   with numpy, ml_dtypes and onnx==1.20.1, Triton's pin: a newer onnx writes IR versions that
   onnxruntime refuses; by default ``~/.cache/oipserve-triton-qa/gen-venv`` when it exists, so
   the generators' needs never enter this project's dependencies);
2. assembles each repository as ``test.sh`` does (the same copies and ``sed`` edits, written
   here as Python), with two ONNX stand-ins for Python-backend models whose behaviour is
   ONNX-expressible (``simple_identity`` and ``simple_identity_int64``: identities);
3. starts ``oipserve serve`` with the flags ``test.sh`` gives ``tritonserver`` (mapped by
   ``_map_flags``; flags naming Triton's backends directory or logging are dropped); the tests
   hard-code ports 8000/8001, so runs are sequential;
4. runs the test file, unmodified, from the temporary directory with ``qa/common`` on
   ``PYTHONPATH`` and this interpreter's ``tritonclient``, one server per case where ``test.sh``
   restarts the server per case;
5. prints per suite passed / failed / errors / skipped, each failing case with a one-line reason,
   and the "applicable" total, which leaves out the cases in ``NOT_APPLICABLE`` below.

``--json FILE`` writes every case's outcome for a results note. Setup: docs/protocol.md
("Triton's QA tests").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where the generators' venv and the tests' extra packages live, outside the project.
CACHE = Path.home() / ".cache/oipserve-triton-qa"

#: Cases left out of the "applicable" count: what they need is inside Triton, not its protocol.
NOT_APPLICABLE: dict[str, str] = {
    # L0_batcher: test.sh exports TRITONSERVER_DELAY_SCHEDULER=N, a Triton-internal hook that
    #   holds the scheduler until N requests are queued; nothing in the protocol can do that.
    "test_multi_batch_delayed_sum_gt_max_preferred": "TRITONSERVER_DELAY_SCHEDULER",
    "test_multi_batch_use_biggest_preferred": "TRITONSERVER_DELAY_SCHEDULER",
    "test_multi_batch_use_best_preferred": "TRITONSERVER_DELAY_SCHEDULER",
    "test_multi_batch_delayed_use_max_batch": "TRITONSERVER_DELAY_SCHEDULER",
    "test_multi_batch_delayed_preferred_different_shape": "TRITONSERVER_DELAY_SCHEDULER",
    "test_preferred_batch_only_aligned": "TRITONSERVER_DELAY_SCHEDULER",
    "test_preferred_batch_only_unaligned": "TRITONSERVER_DELAY_SCHEDULER",
    "test_preferred_batch_only_use_biggest_preferred": "TRITONSERVER_DELAY_SCHEDULER",
    "test_preferred_batch_only_use_no_preferred_size": "TRITONSERVER_DELAY_SCHEDULER",
    # L0_batcher: Triton's custom test backend (custom_zero_1_float32, execute_delay_ms),
    #   and the preserve_ordering runs also need TRITONSERVER_DELAY_SCHEDULER.
    "test_max_queue_delay_only_default": "custom test backend (execute_delay_ms)",
    "test_max_queue_delay_only_non_default": "custom test backend (execute_delay_ms)",
    "test_multi_batch_preserve_ordering": "custom test backend + TRITONSERVER_DELAY_SCHEDULER",
    "test_multi_batch_not_preserve_ordering": "custom test backend + TRITONSERVER_DELAY_SCHEDULER",
    # L0_shared_memory: "simple" is python_models/execute_delayed_model (sleeps 15 s in
    #   Python); the cases time their unregister calls against that sleep.
    "test_unregister_shm_during_inference_single_req_http": "Python backend (15 s delay model)",
    "test_unregister_shm_during_inference_multiple_req_http": "Python backend (15 s delay model)",
    "test_unregister_shm_after_inference_http": "Python backend (15 s delay model)",
    "test_unregister_shm_during_inference_single_req_grpc": "Python backend (15 s delay model)",
    "test_unregister_shm_during_inference_multiple_req_grpc": "Python backend (15 s delay model)",
    "test_unregister_shm_after_inference_grpc": "Python backend (15 s delay model)",
}

#: Triton flags that name its own installation or logging: no oipserve equivalent is needed.
#: (``--backend-config`` too: the suites give the python backend's settings, which oipserve,
#: taking only ``onnxruntime,default-max-batch-size``, would refuse.)
DROPPED_FLAGS = ("--backend-directory", "--backend-config", "--log-verbose", "--trace-")
#: Triton flag -> oipserve flag, where the names differ.
RENAMED_FLAGS = {"--exit-timeout-secs": "--shutdown-timeout"}

SHM_CASES = (
    "test_invalid_create_shm test_valid_create_set_register test_unregister_before_register "
    "test_unregister_after_register test_reregister_after_register "
    "test_unregister_after_inference test_register_after_inference test_too_big_shm "
    "test_mixed_raw_shm test_unregisterall test_infer_offset_out_of_bound "
    "test_infer_byte_size_out_of_bound test_infer_integer_overflow test_register_out_of_bound "
    "test_register_reserved_names test_register_invalid_shm_key test_python_client_leak"
).split()
SHM_UNREGISTER_CASES = (
    "test_unregister_shm_during_inference_single_req "
    "test_unregister_shm_during_inference_multiple_req test_unregister_shm_after_inference"
).split()
BATCHER_NO_DELAY = (
    "test_static_batch_preferred test_static_batch_lt_any_preferred "
    "test_static_batch_not_preferred test_static_batch_gt_max_preferred "
    "test_multi_batch_not_preferred test_multi_batch_gt_max_preferred "
    "test_multi_batch_sum_gt_max_preferred test_multi_same_output0 test_multi_same_output1 "
    "test_multi_different_outputs test_multi_different_output_order"
).split()
BATCHER_DIFFERENT_SHAPE = (
    "test_multi_batch_not_preferred_different_shape test_multi_batch_preferred_different_shape "
    "test_multi_batch_different_shape_allow_ragged test_multi_batch_different_shape"
).split()
BATCHER_NOT_RUN = (
    "test_multi_batch_delayed_sum_gt_max_preferred test_multi_batch_use_biggest_preferred "
    "test_multi_batch_use_best_preferred test_multi_batch_delayed_use_max_batch "
    "test_multi_batch_delayed_preferred_different_shape test_preferred_batch_only_aligned "
    "test_preferred_batch_only_unaligned test_preferred_batch_only_use_biggest_preferred "
    "test_preferred_batch_only_use_no_preferred_size test_max_queue_delay_only_default "
    "test_max_queue_delay_only_non_default test_multi_batch_preserve_ordering "
    "test_multi_batch_not_preserve_ordering"
).split()

#: Loads one unmodified test file as a module and runs the named cases; writes JSON outcomes.
BOOTSTRAP = r"""
import importlib.util, json, os, sys, traceback, unittest
path, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
# Packages the tests need that this venv lacks (requests), after site-packages: no shadowing.
sys.path += [p for p in os.environ.get("TRITON_QA_EXTRA_PATH", "").split(os.pathsep) if p]
sys.argv = [path]
spec = importlib.util.spec_from_file_location("qa_suite", path)
mod = importlib.util.module_from_spec(spec)
sys.modules["qa_suite"] = mod
spec.loader.exec_module(mod)
loader = unittest.TestLoader()
suite = loader.loadTestsFromNames(names, mod) if names else loader.loadTestsFromModule(mod)
rows = {}
def key(test):
    return getattr(test, "test_case", test).id().split(".")[-1]
def note(test, outcome, err=None):
    name = key(test)
    row = rows.setdefault(name, {"case": name, "outcome": "passed", "reason": ""})
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    if rank[outcome] >= rank[row["outcome"]]:
        row["outcome"] = outcome
        if err is not None:
            text = err if isinstance(err, str) else "".join(
                traceback.format_exception_only(err[0], err[1]))
            lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
            row["reason"] = " | ".join(lines[-2:])[:300] if lines else ""
class Result(unittest.TextTestResult):
    def addSuccess(self, test):
        super().addSuccess(test); note(test, "passed")
    def addFailure(self, test, err):
        super().addFailure(test, err); note(test, "failed", err)
    def addError(self, test, err):
        super().addError(test, err); note(test, "error", err)
    def addSkip(self, test, reason):
        super().addSkip(test, reason); note(test, "skipped", reason)
    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err); note(test, "passed")
    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test); note(test, "failed", "unexpected success")
    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            note(test, "failed" if failed else "error", err)
unittest.TextTestRunner(resultclass=Result, verbosity=2).run(suite)
with open(out, "w") as f:
    json.dump(list(rows.values()), f)
"""


@dataclass
class Run:
    """One server start and the cases run against it (``test.sh``'s unit of work)."""

    suite: str
    test_file: str
    repo: str
    triton_args: list[str]
    cases: list[str]
    env: dict[str, str] = field(default_factory=dict)
    #: A start that must fail, with this phrase in the server's output (test.sh greps its log).
    expect_start_failure: str | None = None


@dataclass
class Outcome:
    """One case's result."""

    suite: str
    case: str
    outcome: str
    reason: str = ""


class Workspace:
    """The temporary directory: generated models, assembled repositories, test runs."""

    def __init__(self, triton: Path, root: Path, gen_python: str, extra: str) -> None:
        self.triton = triton
        self.extra = extra
        self.qa = triton / "qa"
        self.root = root
        self.data = root / "data"
        self.gen_python = gen_python

    def generate(self) -> None:
        """Triton's generators, as qa/common/gen_qa_model_repository runs them for ONNX."""
        common = self.qa / "common"
        jobs = [
            ("gen_qa_models.py", ["--onnx"], "qa_model_repository"),
            ("gen_qa_models.py", ["--onnx", "--variable"], "qa_variable_model_repository"),
            ("gen_qa_identity_models.py", ["--onnx"], "qa_identity_model_repository"),
        ]
        for script, flags, out in jobs:
            cmd = [self.gen_python, str(common / script), *flags, f"--models_dir={self.data / out}"]
            subprocess.run(cmd, cwd=common, check=True, stdout=subprocess.DEVNULL)
        self._stand_ins()

    def _stand_ins(self) -> None:
        """ONNX identities with the configs of three identities that Triton serves with
        other backends: simple_identity (a Python model.py; test.sh makes the int64 one by
        sed) and custom_zero_1_float32 (Triton's "identity" backend). The last is used only
        as L0_batcher's ragged model: its input comes flat, as a ragged input does to an
        ONNX model, so its graph is one-dimensional (``repo_batcher_var`` scatters it)."""
        simple = self.triton / "docs/examples/model_repository/simple_identity/config.pbtxt"
        custom = self.qa / "custom_models/custom_zero_1_float32/config.pbtxt"
        for name, src, dtype, onnx_type, dims in (
            ("simple_identity", simple, "TYPE_STRING", "STRING", "['b', 'n']"),
            ("simple_identity_int64", simple, "TYPE_INT64", "INT64", "['b', 'n']"),
            ("custom_zero_1_float32", custom, "TYPE_FP32", "FLOAT", "['n']"),
        ):
            config = re.sub(r"(?m)^backend:.*$", 'platform: "onnxruntime_onnx"', src.read_text())
            model = self.data / "stand_ins" / name
            (model / "1").mkdir(parents=True, exist_ok=True)
            text = config.replace("TYPE_STRING", dtype).replace("simple_identity", name)
            (model / "config.pbtxt").write_text(text)
            code = (
                "import onnx, sys; from onnx import helper as h, TensorProto as T\n"
                f"t = T.{onnx_type}\n"
                "g = h.make_graph([h.make_node('Identity', ['INPUT0'], ['OUTPUT0'])], 'id',"
                f" [h.make_tensor_value_info('INPUT0', t, {dims})],"
                f" [h.make_tensor_value_info('OUTPUT0', t, {dims})])\n"
                "onnx.save(h.make_model(g, opset_imports=[h.make_opsetid('', 13)]), sys.argv[1])\n"
            )
            cmd = [self.gen_python, "-c", code, str(model / "1" / "model.onnx")]
            subprocess.run(cmd, check=True)

    def repo(self, name: str) -> Path:
        """A fresh, empty repository directory."""
        path = self.root / "repos" / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def copy(self, src: Path, dst: Path) -> Path:
        """``cp -r``."""
        shutil.copytree(src, dst)
        return dst


def _sed(config: Path, pattern: str, repl: str, count: int = 0) -> None:
    """``sed -i s/pattern/repl/[g]`` on one file (multi-line mode: ``^`` is a line start)."""
    config.write_text(re.sub(pattern, repl, config.read_text(), count=count, flags=re.M))


def _append(config: Path, text: str) -> None:
    with config.open("a") as f:
        f.write("\n" + text + "\n")


# ------------------------------------------------------------------ repositories per suite


def repo_http_examples(ws: Workspace) -> Path:
    """qa/L0_http/models: Dockerfile.QA copies these from docs/examples/model_repository.

    densenet_onnx (its model is downloaded by a fetch script) and simple_string_dyna_sequence
    (Triton's custom dyna_sequence backend) are left out; simple_identity is the ONNX stand-in.
    """
    repo = ws.repo("L0_http_models")
    examples = ws.triton / "docs/examples/model_repository"
    for name in ("simple", "simple_dyna_sequence", "simple_sequence", "simple_string"):
        ws.copy(examples / name, repo / name)
    ws.copy(ws.data / "stand_ins/simple_identity", repo / "simple_identity")
    return repo


def repo_http_unit(ws: Workspace) -> Path:
    """L0_http/test.sh's python_unit_test_models (for http_test.py)."""
    repo = ws.repo("python_unit_test_models")
    ident = ws.data / "qa_identity_model_repository"
    for name in (
        "onnx_zero_1_float32",
        "onnx_zero_1_object",
        "onnx_zero_1_float16",
        "onnx_zero_3_float32",
    ):
        ws.copy(ident / name, repo / name)
    one = ws.copy(repo / "onnx_zero_1_object", repo / "onnx_zero_1_object_1_element")
    _sed(one / "config.pbtxt", "onnx_zero_1_object", "onnx_zero_1_object_1_element")
    _sed(one / "config.pbtxt", "-1", "1", count=1)  # sed "0,/-1/{s/-1/1/}"
    queue = ws.copy(repo / "onnx_zero_1_float32", repo / "onnx_zero_1_float32_queue")
    _sed(queue / "config.pbtxt", "onnx_zero_1_float32", "onnx_zero_1_float32_queue")
    _append(
        queue / "config.pbtxt",
        "dynamic_batching { \n    max_queue_delay_microseconds: "
        "1000000\n    preferred_batch_size: [ 8 ]\n    default_queue_policy {\n"
        "        max_queue_size: 1\n    }\n}",
    )
    ws.copy(ws.data / "stand_ins/simple_identity", repo / "simple_identity")
    ws.copy(ws.data / "stand_ins/simple_identity_int64", repo / "simple_identity_int64")
    return repo


def repo_shm(ws: Workspace) -> Path:
    """qa/L0_shared_memory/models: docs/examples' simple (Dockerfile.QA)."""
    repo = ws.repo("L0_shared_memory_models")
    ws.copy(ws.triton / "docs/examples/model_repository/simple", repo / "simple")
    return repo


def repo_shm_large_offset(ws: Workspace) -> Path:
    """The second half of L0_shared_memory/test.sh: BACKENDS=onnx's onnx_int32_int32_int32."""
    repo = ws.repo("L0_shared_memory_models_offset")
    src, dst = (
        ws.data / "qa_model_repository/onnx_int32_int32_int32",
        repo / "onnx_int32_int32_int32",
    )
    ws.copy(src / "1", dst / "1")  # version 1 only (versions 2 and 3 swap the outputs)
    for name in ("config.pbtxt", "output0_labels.txt"):
        shutil.copy(src / name, dst / name)
    return repo


def repo_infer(ws: Workspace, gpu: bool) -> Path:
    """L0_infer/test.sh's generate_model_repository for BACKENDS=onnx ENSEMBLES=0."""
    repo = ws.repo("L0_infer_models_gpu" if gpu else "L0_infer_models_cpu")
    for model in sorted((ws.data / "qa_model_repository").glob("onnx*")):
        if not gpu and "bf16" in model.name:
            continue  # test.sh: rm -rf models/onnx_*bf16* for the cpu target
        ws.copy(model, repo / model.name)
        kind = "KIND_GPU" if gpu else "KIND_CPU"
        _append(repo / model.name / "config.pbtxt", f"instance_group [ {{ kind: {kind} }}]")
    return repo


_BATCHING = (
    "dynamic_batching { preferred_batch_size: [ 2, 6 ], max_queue_delay_microseconds: 10000000 }"
)


def _batching_model(config: Path) -> None:
    _sed(config, r"^max_batch_size:.*", "max_batch_size: 8")
    _sed(config, r"^version_policy:.*", "version_policy: { specific { versions: [1] }}")
    _append(config, _BATCHING)


def repo_batcher(ws: Workspace) -> Path:
    """L0_batcher/test.sh's models (the FIXED runs)."""
    repo = ws.repo("L0_batcher_models")
    model = ws.copy(
        ws.data / "qa_model_repository/onnx_float32_float32_float32",
        repo / "onnx_float32_float32_float32",
    )
    _batching_model(model / "config.pbtxt")
    return repo


def repo_batcher_var(ws: Workspace, gpu: bool) -> Path:
    """L0_batcher/test.sh's var_models (the VARIABLE and different-shape runs)."""
    repo = ws.repo("L0_batcher_var_models")
    model = ws.copy(
        ws.data / "qa_variable_model_repository/onnx_float32_float32_float32",
        repo / "onnx_float32_float32_float32",
    )
    _batching_model(model / "config.pbtxt")
    _sed(model / "config.pbtxt", "16", "-1")
    ragged = ws.copy(
        ws.data / "qa_identity_model_repository/onnx_nobatch_zero_1_float32",
        repo / "onnx_zero_1_float32",
    )
    config = ragged / "config.pbtxt"
    _sed(config, "nobatch_", "", count=1)
    _sed(config, r"^max_batch_size:.*", "max_batch_size: 8")
    _sed(config, 'name: "INPUT0"', 'name: "INPUT0"\nallow_ragged_batch: true')
    _append(
        config,
        'batch_output [{target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
        'source_input: "INPUT0" }] ' + _BATCHING,
    )
    # test.sh: cp -r ../custom_models/custom_zero_1_float32 var_models/. and its sed edits
    #   (Triton's identity backend: the ONNX stand-in; KIND_GPU only where there is one).
    custom = ws.copy(ws.data / "stand_ins/custom_zero_1_float32", repo / "custom_zero_1_float32")
    config = custom / "config.pbtxt"
    _append(config, f"instance_group [ {{ kind: {'KIND_GPU' if gpu else 'KIND_CPU'} count: 1 }}]")
    _sed(config, r"^max_batch_size:.*", "max_batch_size: 8")
    _sed(config, r"dims:.*\[.*\]", "dims: [ -1 ]")
    _sed(config, r'name:.*"INPUT0"', 'name: "INPUT0"\nallow_ragged_batch: true', count=1)
    _sed(config, r"^version_policy:.*", "version_policy: { specific { versions: [1] }}")
    # NOTE: Triton's identity backend answers each request of a ragged batch with its own
    #   input's shape; for the ONNX stand-in that is this batch_output (not in test.sh).
    _append(
        config,
        'batch_output [{target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
        'source_input: "INPUT0" }] ' + _BATCHING,
    )
    return repo


# ------------------------------------------------------------------ the plan


def plan(ws: Workspace, suites: set[str], gpu: bool) -> list[Run]:
    """Every server start, in test.sh's order, for the chosen suites."""
    runs: list[Run] = []
    if "L0_http" in suites:
        runs += _plan_http(ws)
    if "L0_shared_memory" in suites:
        runs += _plan_shm(ws)
    for name, shm in (("L0_infer", "0"), ("L0_infer_shm", "1")):
        if name in suites:
            runs += _plan_infer(ws, name, shm, gpu)
    if "L0_batcher" in suites:
        runs += _plan_batcher(ws, gpu)
    return runs


def _plan_http(ws: Workspace) -> list[Run]:
    unit = str(repo_http_unit(ws))
    models = str(repo_http_examples(ws))
    test = "L0_http/http_test.py"
    restricted = "L0_http/http_restricted_api_test.py"
    bad = [
        (
            "--http-restricted-api=model-repository,health:k1=v1",
            "api 'health' can not be specified in multiple config groups",
        ),
        (
            "--http-restricted-api=model-reposit,health:k1=v1",
            "unknown restricted api 'model-reposit'",
        ),
    ]
    runs = [Run("L0_http", test, unit, ["--model-control-mode=explicit", "--load-model=*"], [])]
    for first, phrase in bad:
        args = [first, "--http-restricted-api=metadata,health:k2=v2"]
        runs.append(Run("L0_http", restricted, models, args, [], expect_start_failure=phrase))
    args = [
        "--http-restricted-api=model-repository:admin-key=admin-value",
        "--http-restricted-api=inference,metadata:infer-key=infer-value",
    ]
    runs.append(Run("L0_http", restricted, models, args, ["RestrictedAPITest"]))
    return runs


def _plan_shm(ws: Workspace) -> list[Run]:
    test, repo = "L0_shared_memory/shared_memory_test.py", str(repo_shm(ws))
    runs = []
    for client in ("http", "grpc"):
        env = {"CLIENT_TYPE": client}
        runs.append(
            Run(
                "L0_shared_memory",
                test,
                repo,
                [],
                ["SharedMemoryTest.test_client_shm_disabled_by_default"],
                env,
            )
        )
        for case in SHM_CASES:
            runs.append(
                Run(
                    "L0_shared_memory",
                    test,
                    repo,
                    ["--allow-client-shm=true"],
                    [f"SharedMemoryTest.{case}"],
                    env,
                )
            )
    offset = str(repo_shm_large_offset(ws))
    for client in ("http", "grpc"):
        runs.append(
            Run(
                "L0_shared_memory",
                test,
                offset,
                ["--allow-client-shm=true"],
                ["SharedMemoryTest.test_large_shm_register_offset"],
                {"CLIENT_TYPE": client, "BACKENDS": "onnx"},
            )
        )
    return runs


def _plan_infer(ws: Workspace, name: str, shm: str, gpu: bool) -> list[Run]:
    runs = []
    for target_gpu in (False, True) if gpu else (False,):
        repo = str(repo_infer(ws, target_gpu))
        args = ["--exit-timeout-secs=120"]
        if shm == "1":
            args.append("--allow-client-shm=true")
        env = {"BACKENDS": "onnx", "ENSEMBLES": "0", "TEST_SYSTEM_SHARED_MEMORY": shm}
        if not gpu:
            env["TRITON_SERVER_CPU_ONLY"] = "1"
        runs.append(Run(name, "L0_infer/infer_test.py", repo, args, [], env))
    return runs


def _plan_batcher(ws: Workspace, gpu: bool) -> list[Run]:
    test = "L0_batcher/batcher_test.py"
    fixed, var = str(repo_batcher(ws)), str(repo_batcher_var(ws, gpu))
    runs = []
    for kind, repo in (("FIXED", fixed), ("VARIABLE", var)):
        for case in BATCHER_NO_DELAY:
            env = {"BACKENDS": "onnx", "BATCHER_TYPE": kind}
            runs.append(Run("L0_batcher", test, repo, [], [f"BatcherTest.{case}"], env))
    for case in BATCHER_DIFFERENT_SHAPE:
        env = {"BACKENDS": "onnx", "BATCHER_TYPE": "VARIABLE"}
        runs.append(Run("L0_batcher", test, var, [], [f"BatcherTest.{case}"], env))
    return runs


# ------------------------------------------------------------------ running


def _map_flags(triton_args: list[str]) -> list[str]:
    """tritonserver's flags as oipserve's (most share their names)."""
    out = []
    for arg in triton_args:
        flag, _, value = arg.partition("=")
        if flag.startswith(DROPPED_FLAGS):
            continue
        out.append(f"{RENAMED_FLAGS.get(flag, flag)}={value}" if value else flag)
    return out


class Server:
    """``oipserve serve`` on Triton's ports 8000/8001 for one run."""

    def __init__(self, run: Run, workdir: Path, log: Path) -> None:
        self.ready = workdir / "ready.json"
        self.ready.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "oipserve.app.cli",
            "serve",
            f"--model-repository={run.repo}",
            *_map_flags(run.triton_args),
            "--http-port=8000",
            "--grpc-port=8001",
            "--metrics-port=8002",
            f"--ready-file={self.ready}",
        ]
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            cmd, stdout=self._out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )

    def wait(self, timeout: float = 180) -> bool:
        """True once the ready file exists; False if the server exited first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready.exists():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()


def _run_cases(ws: Workspace, run: Run, workdir: Path, timeout: float) -> list[Outcome]:
    """The unmodified test file, from a temporary directory, against the running server."""
    src = ws.qa / run.test_file
    local = workdir / src.name
    if not local.exists():
        shutil.copy(src, local)
    bootstrap = workdir / "_bootstrap.py"
    bootstrap.write_text(BOOTSTRAP)
    out = workdir / "outcome.json"
    out.unlink(missing_ok=True)
    env = dict(
        os.environ, PYTHONPATH=str(ws.qa / "common"), TRITON_QA_EXTRA_PATH=ws.extra, **run.env
    )
    cmd = [sys.executable, str(bootstrap), str(local), str(out), *run.cases]
    log = workdir / f"client-{len(list(workdir.glob('client-*')))}.log"
    with log.open("w") as f:
        try:
            subprocess.run(
                cmd, cwd=workdir, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return [
                Outcome(run.suite, c.split(".")[-1], "error", f"timed out after {timeout}s")
                for c in run.cases or [run.test_file]
            ]
    if not out.exists():
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        return [
            Outcome(run.suite, c.split(".")[-1], "error", tail[0][:300])
            for c in run.cases or [run.test_file]
        ]
    return [
        Outcome(run.suite, r["case"], r["outcome"], r["reason"])
        for r in json.loads(out.read_text())
    ]


def execute(ws: Workspace, run: Run, index: int, timeout: float) -> list[Outcome]:
    """Start the server, run the cases (or check the refusal), stop the server."""
    workdir = ws.root / "runs" / run.suite
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"server-{index}.log"
    server = Server(run, workdir, log)
    try:
        started = server.wait()
        if run.expect_start_failure is not None:
            return [_start_failure_outcome(run, server, started)]
        if not started:
            tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
            why = f"server did not start: {tail[0]}"
            return [
                Outcome(run.suite, c.split(".")[-1], "error", why)
                for c in run.cases or [run.test_file]
            ]
        return _run_cases(ws, run, workdir, timeout)
    finally:
        server.stop()


def _start_failure_outcome(run: Run, server: Server, started: bool) -> Outcome:
    """test.sh's own check: the server must refuse to start and log the phrase."""
    phrase = run.expect_start_failure or ""
    name = f"start refused: {phrase}"
    if started:
        return Outcome(run.suite, name, "failed", "server started")
    lines = server.log.read_text().strip().splitlines()
    if sum(phrase in line for line in lines) != 1:  # test.sh: grep -c "$EXPECTED_MSG" == 1
        last = lines[-1:] or [""]
        return Outcome(run.suite, name, "failed", f"phrase not once in the log: {last[0][:200]}")
    return Outcome(run.suite, name, "passed")


# ------------------------------------------------------------------ report


def report(outcomes: list[Outcome], write: Callable[[str], None] = print) -> None:
    """Per suite: counts, the applicable count, and each failing case with its reason."""
    suites = list(dict.fromkeys(o.suite for o in outcomes))
    total_app = total_pass = 0
    for suite in suites:
        rows = [o for o in outcomes if o.suite == suite]
        count = {
            k: sum(o.outcome == k for o in rows) for k in ("passed", "failed", "error", "skipped")
        }
        applicable = [o for o in rows if o.case not in NOT_APPLICABLE and o.outcome != "skipped"]
        passed = sum(o.outcome == "passed" for o in applicable)
        total_app += len(applicable)
        total_pass += passed
        write(
            f"{suite}: {count['passed']} passed, {count['failed']} failed, "
            f"{count['error']} errors, {count['skipped']} skipped; "
            f"applicable {passed}/{len(applicable)}"
        )
        for o in rows:
            if o.outcome in ("failed", "error"):
                flag = "" if o.case not in NOT_APPLICABLE else f" [n/a: {NOT_APPLICABLE[o.case]}]"
                write(f"  {o.outcome.upper()} {o.case}{flag}: {o.reason}")
    write(f"TOTAL applicable: {total_pass} passed of {total_app}")
    write("Not run (need Triton internals): " + ", ".join(BATCHER_NOT_RUN))
    write(
        "Not run (Python backend): "
        + ", ".join(f"{c}_{p}" for c in SHM_UNREGISTER_CASES for p in ("http", "grpc"))
    )


def _default_gen_python() -> str:
    venv = CACHE / "gen-venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("triton", type=Path, help="a checkout of triton-inference-server/server")
    parser.add_argument(
        "--suite",
        action="append",
        choices=["L0_http", "L0_shared_memory", "L0_infer", "L0_infer_shm", "L0_batcher"],
        help="run only these (repeatable)",
    )
    parser.add_argument(
        "--gen-python",
        default=_default_gen_python(),
        help="the interpreter for Triton's model generators (numpy, onnx)",
    )
    parser.add_argument(
        "--client-extra",
        default=str(CACHE / "client-extra"),
        help="a `pip install --target` directory with what the test files need "
        "beyond this venv (requests); appended to their sys.path",
    )
    parser.add_argument("--gpu", action="store_true", help="also L0_infer's gpu target")
    parser.add_argument("--timeout", type=float, default=1200, help="per test-file run, s")
    parser.add_argument("--json", type=Path, help="write every case's outcome here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if not (args.triton / "qa/common/gen_qa_models.py").exists():
        parser.error(f"{args.triton}: no qa/common/gen_qa_models.py (not a Triton checkout?)")
    suites = set(
        args.suite or ["L0_http", "L0_shared_memory", "L0_infer", "L0_infer_shm", "L0_batcher"]
    )
    root = Path(tempfile.mkdtemp(prefix="triton-qa-"))
    ws = Workspace(args.triton.resolve(), root, args.gen_python, args.client_extra)
    outcomes: list[Outcome] = []
    try:
        ws.generate()
        runs = plan(ws, suites, args.gpu)
        for index, run in enumerate(runs):
            outcomes += execute(ws, run, index, args.timeout)
    finally:
        if args.json:
            args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
        report(outcomes)
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
