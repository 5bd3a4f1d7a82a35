"""KServe Python model server wrapping ONNX Runtime, bound to 127.0.0.1 only.

Run by the harness with the kserve venv's interpreter:

    python kserve_onnx.py --bench-http-port P --bench-grpc-port G --bench-workers N \
        --bench-model NAME=PATH [--bench-model ...] [--bench-intra 1 --bench-inter 1]

KServe hard-codes 0.0.0.0 (REST) and [::] (gRPC); both listeners are patched to 127.0.0.1
before KServe starts, because the harness must never expose a port beyond loopback. KServe
parses sys.argv at import time, so the harness's own options use a `--bench-` prefix and are
removed before kserve is imported.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-http-port", type=int, required=True)
    parser.add_argument("--bench-grpc-port", type=int, required=True)
    parser.add_argument("--bench-workers", type=int, default=1)
    parser.add_argument("--bench-intra", type=int, default=1)
    parser.add_argument("--bench-inter", type=int, default=1)
    parser.add_argument("--bench-model", action="append", default=[], metavar="NAME=PATH")
    args = parser.parse_args()
    sys.argv = sys.argv[:1]  # kserve's own argparse runs at import time
    return args


def _force_loopback() -> None:
    """Rebind KServe's REST and gRPC listeners from all interfaces to 127.0.0.1."""
    import uvicorn
    from grpc.aio._server import Server as AioServer

    original_config_init = uvicorn.Config.__init__

    def config_init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["host"] = "127.0.0.1"
        original_config_init(self, *args, **kwargs)

    uvicorn.Config.__init__ = config_init  # type: ignore[method-assign]

    original_add_port = AioServer.add_insecure_port

    def add_insecure_port(self: Any, address: str) -> int:
        port = address.rsplit(":", 1)[1]
        return original_add_port(self, f"127.0.0.1:{port}")

    AioServer.add_insecure_port = add_insecure_port  # type: ignore[method-assign]


def main() -> None:
    """Build one OnnxModel per --bench-model and start KServe's ModelServer."""
    args = _parse()
    _force_loopback()

    import kserve
    import onnxruntime as ort
    from kserve import InferOutput, InferRequest, InferResponse
    from kserve.utils.utils import from_np_dtype, generate_uuid

    class OnnxModel(kserve.Model):
        """ONNX Runtime session behind KServe's v2 data plane; sync predict, as KServe's own
        sklearn/xgboost servers do."""

        def __init__(self, name: str, path: str) -> None:
            super().__init__(name)
            self.path = path
            self.load()

        def load(self) -> bool:
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.bench_intra
            options.inter_op_num_threads = args.bench_inter
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            self.session = ort.InferenceSession(
                self.path, options, providers=["CPUExecutionProvider"]
            )
            self.input_names = [i.name for i in self.session.get_inputs()]
            self.output_names = [o.name for o in self.session.get_outputs()]
            self.ready = True
            return self.ready

        def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> Any:
            by_name = {inp.name: inp for inp in payload.inputs}
            feeds = {name: by_name[name].as_numpy() for name in self.input_names}
            results = self.session.run(self.output_names, feeds)
            outputs = []
            for name, array in zip(self.output_names, results, strict=True):
                out = InferOutput(
                    name=name, shape=list(array.shape), datatype=from_np_dtype(array.dtype)
                )
                out.set_data_from_numpy(array, binary_data=payload.use_binary_outputs)
                outputs.append(out)
            return InferResponse(
                response_id=payload.id or generate_uuid(),
                model_name=self.name,
                infer_outputs=outputs,
                use_binary_outputs=payload.use_binary_outputs,
                requested_outputs=payload.request_outputs,
            )

    models = []
    for spec in args.bench_model:
        name, path = spec.split("=", 1)
        models.append(OnnxModel(name, path))
    server = kserve.ModelServer(
        http_port=args.bench_http_port,
        grpc_port=args.bench_grpc_port,
        workers=args.bench_workers,
        enable_latency_logging=False,
    )
    # KServe logs every request twice (uvicorn access log + kserve.trace timings); the other
    # servers log none, so those loggers are quietened (after ModelServer configured logging).
    for logger_name in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(logger_name).setLevel(logging.WARNING)
    server.start(models)


if __name__ == "__main__":
    main()
