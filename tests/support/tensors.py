"""Sample tensors shared by the REST and gRPC tests: every datatype, at its extremes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import ml_dtypes
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

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


#: A REST (JSON) request of the sample model ``simple``: 0..15 and sixteen 1s.
SIMPLE_JSON: dict[str, object] = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
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


class SimpleRegion(NamedTuple):
    """A client's shared-memory region for ``simple``: its two inputs at offsets 0 and 64,
    room for its two outputs at 128 and 192."""

    a: np.ndarray
    b: np.ndarray
    name: str
    key: str
    handle: object


@contextmanager
def simple_region() -> Iterator[SimpleRegion]:
    """A new 256-byte POSIX region holding ``simple``'s inputs; destroyed afterwards."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    name, key = f"r{uuid.uuid4().hex[:8]}", f"/oipserve-test-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(name, key, 256)
    try:
        shm.set_shared_memory_region(handle, [a, b])
        yield SimpleRegion(a, b, name, key, handle)
    finally:
        shm.destroy_shared_memory_region(handle)
