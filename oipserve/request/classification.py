"""Triton's classification extension: an output answered as its top-k classes.

A request asks for it per output (REST ``parameters.classification``, gRPC
``int64_param``); each adapter parses its wire format into ``{output name: k}`` and
the data plane calls ``check_classification`` before the run and ``classify`` on its
result. For that output the client gets a BYTES tensor, shape ``[batch, k']`` for a
batching model or ``[k']`` otherwise (``k' = min(k, elements per batch item)``),
each element ``"<value>:<index>"`` or ``"<value>:<index>:<label>"`` when the output
has a label for that index (config.pbtxt ``label_filename``). Values are printed
as C++ ``std::to_string`` prints them, as Triton does: floats with 6 decimals,
integers plain. Equal values keep the lower index first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Final

import numpy as np

from oipserve.errors import InvalidInput
from oipserve.request.inference import InferResult, OutputTensor
from oipserve.runtime.off_loop import releasing_on_failure
from oipserve.wire.datatypes import DATATYPES, encode_bytes_elements

if TYPE_CHECKING:
    from oipserve.models.registry import ModelVersion
    from oipserve.request.client_regions import RegionUse

__all__ = [
    "CLASSIFY_ON_LOOP_MAX",
    "MAX_CLASS_COUNT",
    "MAX_CLASS_STRINGS",
    "check_classification",
    "class_strings",
    "classified_outputs",
    "classify",
    "top_k",
]

#: Datatypes an output cannot be classified in (as Triton refuses them).
UNSUPPORTED: Final = frozenset({"BOOL", "FP16", "BF16", "BYTES"})

#: Most classes one output may be asked for (ImageNet-21k has 21,841): the strings are
#: made in Python, so their number bounds what a request costs (issue #18).
MAX_CLASS_COUNT: Final = 65536
#: Most class strings one request may get back, over all its rows and outputs.
MAX_CLASS_STRINGS: Final = 1024 * 1024
#: Outputs of more elements than this (over all classified outputs of a request) are
#: sorted in a thread: numpy sorts without the GIL, and a sort of a few hundred thousand
#: values would otherwise hold the event loop for milliseconds.
CLASSIFY_ON_LOOP_MAX: Final = 65536


def check_classification(
    model: ModelVersion, counts: dict[str, int], into: dict[str, RegionUse]
) -> None:
    """InvalidInput if an output asked for as classes cannot be: run before the model runs.

    ``counts`` names outputs the request asked for (``check_request`` has checked them).
    """
    for name, k in counts.items():
        if k > MAX_CLASS_COUNT:
            raise InvalidInput(
                f"output '{name}' asks for {k} classes; at most {MAX_CLASS_COUNT} may be asked"
            )
        if name in into:
            raise InvalidInput(
                f"output '{name}' cannot be both in shared memory and a classification"
            )
        spec = model.output_map.get(name)
        if spec is not None and spec.datatype in UNSUPPORTED:
            raise InvalidInput(
                f"output '{name}' has datatype {spec.datatype}, which the classification "
                "extension does not support"
            )


async def classify(result: InferResult, counts: dict[str, int]) -> InferResult:
    """``result`` with each output named in ``counts`` replaced by its top-k class strings.

    Outputs of more than ``CLASSIFY_ON_LOOP_MAX`` elements in all are sorted in a thread
    (numpy lets go of the GIL). The worker's segment stays ``result``'s to release; if the
    classification fails, or the request is abandoned meanwhile, it is released here.
    """
    work = partial(classified_outputs, result, counts)
    elements = sum(tensor.count for tensor in result.outputs if tensor.name in counts)
    result.outputs = await releasing_on_failure(
        work, result.release, in_a_thread=elements > CLASSIFY_ON_LOOP_MAX
    )
    return result


def classified_outputs(result: InferResult, counts: dict[str, int]) -> list[OutputTensor]:
    """``result``'s outputs, those named in ``counts`` as their top-k class strings; 400
    past ``MAX_CLASS_STRINGS`` strings in all. Reads ``result``, changes nothing (so it
    may run in a thread)."""
    batched = result.model.max_batch_size > 0
    strings = 0
    for tensor in result.outputs:
        if tensor.name in counts:
            rows = _rows(tensor, batched)
            per_row = tensor.count // rows if rows else 0
            strings += rows * min(counts[tensor.name], per_row)
    if strings > MAX_CLASS_STRINGS:
        raise InvalidInput(
            f"the classification asked for would return {strings} class strings; at most "
            f"{MAX_CLASS_STRINGS} may be returned for one request"
        )
    return [
        _classified(tensor, counts[tensor.name], batched, _labels_of(result.model, tensor))
        if tensor.name in counts
        else tensor
        for tensor in result.outputs
    ]


def _rows(tensor: OutputTensor, batched: bool) -> int:
    """Rows classified separately: the batch dim of a batching model's output, else one."""
    return tensor.shape[0] if batched and tensor.shape else 1


def _labels_of(model: ModelVersion, tensor: OutputTensor) -> tuple[str, ...]:
    spec = model.output_map.get(tensor.name)
    return spec.labels if spec is not None else ()


def _classified(tensor: OutputTensor, k: int, batched: bool, labels: Sequence[str]) -> OutputTensor:
    dtype = DATATYPES[tensor.datatype].numpy
    values = np.frombuffer(tensor.data, dtype=dtype, count=tensor.count)
    rows = _rows(tensor, batched)
    per_row = values.reshape(rows, -1) if rows else values.reshape(0, 0)
    strings = class_strings(per_row, k, tensor.datatype, labels)
    classes = math.prod(tensor.shape[1:]) if batched and tensor.shape else tensor.count
    width = min(k, classes)  # (a batch of no rows still has its width: [0, k])
    shape = [rows, width] if batched else [width]
    flat = [text.encode() for row in strings for text in row]
    return OutputTensor(tensor.name, "BYTES", shape, memoryview(encode_bytes_elements(flat)))


def top_k(row: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest values of a 1-D array, highest first; ties lower index
    first; NaN below every number (numpy's sort puts NaN last, which would rank it first)."""
    backwards = row[::-1]
    if backwards.dtype.kind == "f":
        numbers = ~np.isnan(backwards)
        order = np.lexsort((backwards, numbers))  # (stable; the last key sorts first)
    else:
        order = np.argsort(backwards, kind="stable")
    return len(row) - 1 - order[::-1][:k]


def class_strings(
    rows: np.ndarray, k: int, datatype: str, labels: Sequence[str] = ()
) -> list[list[str]]:
    """Each row's top-``k`` classes as ``"<value>:<index>[:<label>]"``."""
    floating = datatype in ("FP32", "FP64")
    out = []
    for row in rows:
        texts = []
        for index in top_k(row, k).tolist():
            value = row[index]
            text = f"{float(value):f}:{index}" if floating else f"{int(value)}:{index}"
            label = labels[index] if index < len(labels) else ""
            texts.append(f"{text}:{label}" if label else text)
        out.append(texts)
    return out
