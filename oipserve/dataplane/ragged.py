"""The batches of a model with ragged batching, laid out as Triton's backends lay them out.

A model whose config.pbtxt has ``allow_ragged_batch`` on an input, a ``batch_input`` or a
``batch_output`` (``oipserve.models.config.batch_io_config``) gets a ``RaggedLayout``
when its batcher is made; every other model keeps the ordinary layout of ``batch_io``,
untouched. The layout decides three things:

- ``signature``: which requests may share a batch. As Triton's ``enforce_equal_shape``,
  the dims of a ragged input need not agree; those of every other input must.
- ``assemble``: the batch's tensors, in one pooled segment, one copy of each request's
  bytes. A ragged input is given flat: shape ``[elements of all requests]``, the requests
  one after another (Triton's ONNX Runtime backend does the same); the others join along
  dimension 0 as usual. Then each ``batch_input`` is made from the requests' shapes of its
  source input (``batch_input_values``, Triton's ``BackendInputCollector``) and written
  once, each target given the same bytes. A batch of one request is laid out the same
  way: the model always gets its ragged inputs flat and its batch inputs.
- ``split``: a ``BATCH_SCATTER_WITH_INPUT_SHAPE`` output is cut into consecutive pieces,
  one per request, each as many elements as its source input has and shaped like it; the
  other outputs are cut by rows as usual. Pieces are views of the worker's segment.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np

from oipserve.dataplane.batch_io import Made, assemble, join, split_rows
from oipserve.errors import InferenceFailed
from oipserve.models.config.batch_io_config import BatchInputSpec, BatchIO
from oipserve.request.inference import InputTensor
from oipserve.request.placement import Placement
from oipserve.wire.datatypes import DATATYPES
from oipserve.wire.messages import TensorDesc
from oipserve.wire.shm import Lease, align

__all__ = ["RaggedLayout", "batch_input_values"]

_NUMPY = {"INT32": np.int32, "FP32": np.float32}


def batch_input_values(kind: str, datatype: str, shapes: list[list[int]]) -> np.ndarray:
    """The tensor of one ``batch_input`` for requests whose source input has ``shapes``.

    Triton's kinds (model_config.proto; shapes as its backends make them):
    ``BATCH_ELEMENT_COUNT`` [requests]: each request's element count (all dims, the batch
    dim too); ``BATCH_ACCUMULATED_ELEMENT_COUNT`` [requests]: their running sum;
    ``..._WITH_ZERO`` [requests + 1]: the same after a 0; ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``
    [largest count]: only the shape says something (zeros); ``BATCH_ITEM_SHAPE``
    [batch items, rank - 1]: each batch item's shape without the batch dim, a row per
    item (a request of 2 rows gives 2); ``BATCH_ITEM_SHAPE_FLATTEN``: the same, flat.
    """
    dtype = _NUMPY[datatype]
    counts = np.array([math.prod(shape) for shape in shapes], dtype=np.int64)
    if kind == "BATCH_ELEMENT_COUNT":
        return counts.astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate(([0], np.cumsum(counts))).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(int(counts.max()), dtype=dtype)
    rank = len(shapes[0]) - 1
    items = [shape[1:] for shape in shapes for _ in range(shape[0])]
    table = np.array(items, dtype=dtype).reshape(len(items), rank)
    if kind == "BATCH_ITEM_SHAPE":
        return table
    return table.reshape(-1)  # BATCH_ITEM_SHAPE_FLATTEN


class RaggedLayout:
    """Signature, assembly and splitting of one ragged-batching model's batches."""

    __slots__ = ("ragged", "made", "scatter")

    def __init__(self, io: BatchIO) -> None:
        self.ragged = frozenset(io.ragged)
        self.made: tuple[BatchInputSpec, ...] = io.inputs
        #: Scattered output -> its source input.
        self.scatter = {target: spec.source for spec in io.outputs for target in spec.targets}

    def signature(self, placements: list[Placement]) -> Hashable:
        """What requests must agree on to share a batch: the ordinary signature (every
        input's name, datatype and dims past the first), except a ragged input's dims."""
        ragged = self.ragged
        return tuple(
            sorted(
                (t.name, t.datatype, () if t.name in ragged else tuple(shape[1:]), t.image)
                for t, shape, _, _ in placements
            )
        )

    def _made(self, requests: list[list[Placement]]) -> list[Made]:
        """The batch inputs: (their targets, datatype, values)."""
        made: list[Made] = []
        for spec in self.made:
            shapes = [_shape_of(request, spec.source) for request in requests]
            values = batch_input_values(spec.kind, spec.datatype, shapes)
            made.append((spec.targets, spec.datatype, values))
        return made

    def size(self, requests: list[list[Placement]]) -> int:
        """Bytes of the segment ``assemble`` fills."""
        total = 0
        for tensor, _, _, _ in requests[0]:
            total = align(total + sum(_nbytes_of(r, tensor.name) for r in requests))
        for _, _, values in self._made(requests):
            total = align(total + values.nbytes)
        return max(total, 1)

    def assemble(self, requests: list[list[Placement]], lease: Lease) -> list[TensorDesc]:
        """Every input of the batch copied into ``lease`` (``size`` bytes at least), the
        ragged ones flat, then the batch inputs; their descriptors."""
        return assemble(requests, lease, self._place, self._made(requests))

    def _place(
        self,
        tensor: InputTensor,
        shape: list[int],
        by_name: list[dict[str, Placement]],
        target: memoryview,
        offset: int,
    ) -> tuple[int, list[int]]:
        """A ragged input flat (its requests' elements one after another), others joined."""
        end, rows = join(by_name, tensor.name, target, offset)
        if tensor.name in self.ragged:
            return end, [sum(math.prod(r[tensor.name][1]) for r in by_name)]
        return end, [rows, *shape[1:]]

    def split(
        self,
        outputs: list[TensorDesc],
        segment: memoryview,
        requests: list[list[Placement]],
        rows: list[int],
    ) -> list[list[tuple[TensorDesc, memoryview]]]:
        """Per request, each output's descriptor and a view of its part: scattered
        outputs by the shapes of their source input, the others by rows."""
        parts: list[list[tuple[TensorDesc, memoryview]]] = [[] for _ in rows]
        for desc in outputs:
            source = self.scatter.get(desc.name)
            if source is None:
                pieces = split_rows(desc, segment, rows)
            else:
                pieces = _scatter(desc, segment, [_shape_of(r, source) for r in requests])
            for part, piece in zip(parts, pieces, strict=True):
                part.append(piece)
        return parts


def _shape_of(request: list[Placement], name: str) -> list[int]:
    for tensor, shape, _, _ in request:
        if tensor.name == name:
            return shape
    raise InferenceFailed(f"a request of the batch has no input '{name}'")


def _nbytes_of(request: list[Placement], name: str) -> int:
    for tensor, _, nbytes, _ in request:
        if tensor.name == name:
            return nbytes
    raise InferenceFailed(f"a request of the batch has no input '{name}'")


def _scatter(
    desc: TensorDesc, segment: memoryview, shapes: list[list[int]]
) -> list[tuple[TensorDesc, memoryview]]:
    """``desc`` cut into consecutive pieces shaped as ``shapes`` (Triton's
    ``BATCH_SCATTER_WITH_INPUT_SHAPE``)."""
    size = DATATYPES[desc.datatype].numpy.itemsize
    wanted = sum(math.prod(shape) for shape in shapes) * size
    if wanted > desc.nbytes:
        raise InferenceFailed(
            f"output '{desc.name}' holds {desc.nbytes // size} elements, fewer than the "
            f"{wanted // size} its source input has in the batch: it cannot be scattered"
        )
    pieces = []
    start = 0
    for shape in shapes:
        end = start + math.prod(shape) * size
        piece = TensorDesc(
            desc.name, desc.datatype, list(shape), desc.segment, desc.offset + start, end - start
        )
        pieces.append((piece, segment[desc.offset + start : desc.offset + end]))
        start = end
    return pieces
