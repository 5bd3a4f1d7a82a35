"""The ``echo`` worker kind: every input back as an output, answered by the front.

It exists for orchestration tests (load, naming, share, unload): it needs no worker
process and no ONNX Runtime session, so the front answers it by copying the inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from oipserve.errors import InternalError, InvalidInput
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import InferResult, InputTensor, OutputTensor
from oipserve.request.placement import payload
from oipserve.request.tensors import Deferred
from oipserve.wire.shm import Lease

if TYPE_CHECKING:
    from oipserve.models.registry import ModelVersion

__all__ = ["answer_echo"]


def answer_echo(
    model: ModelVersion,
    inputs: list[InputTensor],
    output_names: list[str],
    owned: list[Lease | RegionUse],
) -> InferResult:
    """Every input back as an output (same name, datatype, shape, data).

    The ``echo`` worker kind exists for orchestration tests (load, naming, share,
    unload): it needs no worker process and no ONNX Runtime session, so the
    front answers it by copying the inputs.
    """
    try:
        if not inputs:
            raise InvalidInput("'inputs' must list at least one input")
        by_name: dict[str, OutputTensor] = {}
        for tensor in inputs:
            if tensor.name in by_name:
                raise InvalidInput(f"input '{tensor.name}' is given more than once")
            if any(d < 0 for d in tensor.shape):
                raise InvalidInput(
                    f"input '{tensor.name}' has a negative dimension in {list(tensor.shape)}"
                )
            _, data = payload(tensor)
            if data is None:
                if tensor.located is None:  # in a client's region: the data plane refuses it
                    raise InternalError(f"echo input '{tensor.name}' is in no front segment")
                held, start, size = tensor.located
                blob = bytes(held.buf[start : start + size])
            elif isinstance(data, np.ndarray):
                blob = data.tobytes()
            elif isinstance(data, Deferred):  # (json_offload: never for a model without workers)
                raise InternalError(f"echo input '{tensor.name}' was left for a worker to decode")
            else:
                blob = bytes(data)
            by_name[tensor.name] = OutputTensor(
                tensor.name, tensor.datatype, list(tensor.shape), memoryview(blob)
            )
        for name in output_names:
            if name not in by_name:
                raise InvalidInput(
                    f"unexpected requested output '{name}' for echo endpoint '{model.name}' "
                    f"(it returns its inputs: {', '.join(by_name)})"
                )
        names = output_names or list(by_name)
        return InferResult(model, [by_name[n] for n in names], lambda: None)
    finally:
        for holding in owned:
            holding.release()
