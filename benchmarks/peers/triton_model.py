"""Triton python-backend model that runs `model.onnx` from its version folder in ONNX Runtime.

Copied as `model.py` into each model version of the Triton repository the harness writes.
The Triton wheel inside `nvidia-pytriton` ships only the python backend (no onnxruntime
backend), so this is how stock Triton serves the same .onnx file as the other servers. ORT
thread counts come from the model config's `parameters` (the keys Triton's own onnxruntime
backend uses), so every server's settings live in one place in the harness. The stub's embedded
interpreter finds the peer venv (numpy<2 and onnxruntime) only because the harness puts the
venv's bin/ first on PATH, as PyTriton itself does.
"""

from __future__ import annotations

import json
import os
from typing import Any

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """One ORT session per Triton model instance (instance_group count = worker processes)."""

    def initialize(self, args: dict[str, Any]) -> None:
        """Open the session with the thread settings from config.pbtxt."""
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_thread_count", "1"))
        options.inter_op_num_threads = int(params.get("inter_op_thread_count", "1"))
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def execute(self, requests: list[Any]) -> list[Any]:
        """Run the requests Triton's dynamic batcher gave as one batch, else each alone."""
        if len(requests) > 1:
            return self._execute_batch(requests)
        responses = []
        for request in requests:
            feeds = {
                name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                for name in self.input_names
            }
            results = self.session.run(self.output_names, feeds)
            pairs = zip(self.output_names, results, strict=True)
            tensors = [pb_utils.Tensor(n, r) for n, r in pairs]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _execute_batch(self, requests: list[Any]) -> list[Any]:
        """Concatenate every input along dim 0, run once, slice each output back."""
        import numpy as np

        parts = {
            name: [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
            for name in self.input_names
        }
        rows = [len(a) for a in parts[self.input_names[0]]]
        feeds = {name: np.concatenate(arrays) for name, arrays in parts.items()}
        results = self.session.run(self.output_names, feeds)
        responses = []
        start = 0
        for count in rows:
            tensors = [
                pb_utils.Tensor(n, r[start : start + count])
                for n, r in zip(self.output_names, results, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += count
        return responses
