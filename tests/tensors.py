"""Sample tensors shared by the REST and gRPC tests: every datatype, at its extremes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tritonclient.grpc as grpcclient

ROUND_TRIP = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 255, 7]], dtype=np.uint8),
    "UINT16": np.array([[0, 65535, 7]], dtype=np.uint16),
    "UINT32": np.array([[0, 2**32 - 1, 7]], dtype=np.uint32),
    "UINT64": np.array([[0, 2**64 - 1, 7]], dtype=np.uint64),
    "INT8": np.array([[-128, 127, 0]], dtype=np.int8),
    "INT16": np.array([[-32768, 32767, 0]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 2**31 - 1, 0]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 2**63 - 1, 0]], dtype=np.int64),
    "FP16": np.array([[0.5, -2.0, 65504.0]], dtype=np.float16),
    "FP32": np.array([[0.25, -1.5e30, 3.0]], dtype=np.float32),
    "FP64": np.array([[0.1, -1e300, 3.0]], dtype=np.float64),
    "BF16": np.array([[1.0, -2.5, 0.5]], dtype=ml_dtypes.bfloat16),
    "BYTES": np.array([["héllo", "", "x" * 300]], dtype=object),
}


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    """The sample model ``simple``'s two INT32 inputs, for tritonclient.grpc."""
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs
