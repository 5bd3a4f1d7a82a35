"""MLServer runtime that runs an .onnx file in ONNX Runtime (MLServer ships no ONNX runtime).

Referenced from each model-settings.json as `mlserver_onnx.OnnxRuntimeModel`; the harness puts
this folder on PYTHONPATH. It decodes and encodes with MLServer's own `NumpyCodec`, the path an
MLServer user would take, so the figures include MLServer's real codec costs. ORT thread counts
come from `parameters.extra` so they are written down next to the other servers' settings.
"""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntimeModel(MLModel):
    """One ORT session per MLServer model (per worker process when parallel_workers > 0)."""

    async def load(self) -> bool:
        """Open the session named by `parameters.uri`."""
        params = self.settings.parameters
        extra = (params.extra if params else None) or {}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(extra.get("intra_op_threads", 1))
        options.inter_op_num_threads = int(extra.get("inter_op_threads", 1))
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        uri = params.uri if params else None
        if not uri:
            raise ValueError(f"model {self.name}: parameters.uri (the .onnx path) is required")
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        self._input_names = [i.name for i in self._session.get_inputs()]
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        """Decode every input with NumpyCodec, run, and encode every output the same way."""
        by_name = {inp.name: inp for inp in payload.inputs}
        feeds = {name: NumpyCodec.decode_input(by_name[name]) for name in self._input_names}
        results = self._session.run(self._output_names, feeds)
        outputs = [
            NumpyCodec.encode_output(name=name, payload=array)
            for name, array in zip(self._output_names, results, strict=True)
        ]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
