"""Padded batching: requests that differ only in declared dimensions padded into one batch.

A model with the ``pad_batch`` parameter (``oipserve.models.config.padding_config``) gets a
``PaddedLayout`` when its batcher is made; every other model keeps the ordinary layout.
The layout decides:

- ``signature``: requests share a batch when they agree on everything but the padded
  dimensions of the padded inputs;
- ``WasteGate`` (the batcher's admission): a request joins only while the batch's padded
  elements stay within ``waste`` times the elements the requests really hold;
- ``assemble``: each padded input written once into the batch's segment at the batch's
  largest extent, each request's values in place and the pad value around them (one copy
  of each request's bytes, as for any batch); the other inputs joined as usual; then the
  masks ([batch, length], 1 on data) and lengths ([batch]) the parameter asks for;
- ``split``: outputs cut by rows, then each declared output cut back along its dimension
  to the request's true length (a view when that part is contiguous, as it is for a
  request of one row; a copy otherwise).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable

import numpy as np

from oipserve.dataplane.batch_io import Made, assemble, join, payload_bytes, split_rows
from oipserve.errors import InferenceFailed
from oipserve.models.config.padding_config import CutOutput, PadBatch, PaddedInput
from oipserve.request.inference import InputTensor
from oipserve.request.placement import Placement
from oipserve.wire.datatypes import DATATYPES
from oipserve.wire.messages import TensorDesc
from oipserve.wire.shm import Lease, align

__all__ = ["PaddedLayout", "WasteGate"]


def _shape(request: list[Placement], name: str) -> list[int]:
    for tensor, shape, _, _ in request:
        if tensor.name == name:
            return shape
    raise InferenceFailed(f"a request of the batch has no input '{name}'")


def _padded_shape(requests: list[list[Placement]], spec: PaddedInput) -> list[int]:
    """The batch's shape of a padded input: rows summed, the padded dim at its largest."""
    shapes = [_shape(r, spec.name) for r in requests]
    shape = list(shapes[0])
    shape[0] = sum(s[0] for s in shapes)
    shape[spec.dim] = max(s[spec.dim] for s in shapes)
    return shape


class WasteGate:
    """The batcher's admission for a padded model: the waste bound, kept as a batch grows.

    ``first`` starts a batch with a request, ``admit`` adds one if the batch then holds
    at most ``waste`` times its requests' real elements (and changes nothing if not).
    """

    __slots__ = ("_specs", "_waste", "_rows", "_longest", "_other", "_real")

    def __init__(self, spec: PadBatch) -> None:
        self._specs = spec.inputs
        self._waste = spec.waste
        self._rows = 0
        self._longest: list[int] = [0] * len(spec.inputs)
        self._other: list[int] = [0] * len(spec.inputs)
        self._real = 0

    def _extents(self, request: object) -> tuple[int, list[int], list[int], int]:
        placements: list[Placement] = request.placements  # type: ignore[attr-defined]
        rows = 0
        lengths, others = [], []
        real = 0
        for spec in self._specs:
            shape = _shape(placements, spec.name)
            rows = shape[0]
            length = shape[spec.dim]
            other = math.prod(d for i, d in enumerate(shape) if i not in (0, spec.dim))
            lengths.append(length)
            others.append(other)
            real += rows * length * other
        return rows, lengths, others, real

    def first(self, request: object) -> None:
        self._rows, self._longest, self._other, self._real = self._extents(request)

    def admit(self, request: object) -> bool:
        rows, lengths, others, real = self._extents(request)
        total_rows = self._rows + rows
        longest = [max(a, b) for a, b in zip(self._longest, lengths, strict=True)]
        padded = sum(total_rows * n * o for n, o in zip(longest, others, strict=True))
        total_real = self._real + real
        if padded > self._waste * max(total_real, 1):
            return False
        self._rows, self._longest, self._real = total_rows, longest, total_real
        return True


class PaddedLayout:
    """Signature, admission, assembly and splitting of one padded model's batches."""

    __slots__ = ("spec", "padded", "cut")

    def __init__(self, spec: PadBatch) -> None:
        self.spec = spec
        self.padded = {p.name: p for p in spec.inputs}
        self.cut: dict[str, CutOutput] = {c.name: c for c in spec.outputs}

    def gate(self) -> WasteGate:
        return WasteGate(self.spec)

    def signature(self, placements: list[Placement]) -> Hashable:
        """The ordinary signature, with each padded input's padded dimension left out."""
        padded = self.padded
        keys = []
        for tensor, shape, _, _ in placements:
            spec = padded.get(tensor.name)
            dims = tuple(shape[1:])
            if spec is not None:
                dims = tuple(-1 if i == spec.dim else d for i, d in enumerate(shape) if i)
            keys.append((tensor.name, tensor.datatype, dims, tensor.image))
        return tuple(sorted(keys))

    def elements(self, requests: list[list[Placement]]) -> tuple[int, int]:
        """The padded inputs' elements in the batch, and those the requests really hold."""
        padded = real = 0
        for spec in self.spec.inputs:
            padded += math.prod(_padded_shape(requests, spec))
            real += sum(math.prod(_shape(r, spec.name)) for r in requests)
        return padded, real

    def _made(self, requests: list[list[Placement]]) -> list[Made]:
        """The masks and lengths: ((target,), datatype, values)."""
        made: list[Made] = []
        for spec in self.spec.inputs:
            if spec.mask is None and spec.lengths is None:
                continue
            lengths = np.array(
                [_shape(r, spec.name)[spec.dim] for r in requests for _ in range(r[0][1][0])],
                dtype=np.int64,
            )
            if spec.lengths is not None:
                dtype = DATATYPES[spec.lengths_type].numpy
                made.append(((spec.lengths,), spec.lengths_type, lengths.astype(dtype)))
            if spec.mask is not None:
                longest = int(lengths.max()) if lengths.size else 0
                mask = np.arange(longest)[None, :] < lengths[:, None]
                dtype = DATATYPES[spec.mask_type].numpy
                made.append(((spec.mask,), spec.mask_type, mask.astype(dtype)))
        return made

    def size(self, requests: list[list[Placement]]) -> int:
        """Bytes of the segment ``assemble`` fills."""
        total = 0
        for tensor, _, _, _ in requests[0]:
            spec = self.padded.get(tensor.name)
            if spec is None:
                nbytes = sum(p[2] for r in requests for p in r if p[0].name == tensor.name)
            else:
                itemsize = DATATYPES[spec.datatype].numpy.itemsize
                nbytes = math.prod(_padded_shape(requests, spec)) * itemsize
            total = align(total + nbytes)
        for _, _, values in self._made(requests):
            total = align(total + values.nbytes)
        return max(total, 1)

    def assemble(self, requests: list[list[Placement]], lease: Lease) -> list[TensorDesc]:
        """Every input of the batch in ``lease`` (``size`` bytes at least), the padded ones
        at the batch's extent; then the masks and lengths. Their descriptors."""
        return assemble(
            requests, lease, functools.partial(self._place, requests), self._made(requests)
        )

    def _place(
        self,
        requests: list[list[Placement]],
        tensor: InputTensor,
        shape: list[int],
        by_name: list[dict[str, Placement]],
        target: memoryview,
        offset: int,
    ) -> tuple[int, list[int]]:
        """A padded input at the batch's extent, the others joined."""
        spec = self.padded.get(tensor.name)
        if spec is None:
            end, rows = join(by_name, tensor.name, target, offset)
            return end, [rows, *shape[1:]]
        dims = _padded_shape(requests, spec)
        return _pad_into(target, offset, dims, spec, [r[tensor.name] for r in by_name]), dims

    def split(
        self,
        outputs: list[TensorDesc],
        segment: memoryview,
        requests: list[list[Placement]],
        rows: list[int],
    ) -> list[list[tuple[TensorDesc, memoryview]]]:
        """Per request, each output's descriptor and its part: cut by rows, then the
        declared outputs cut back to the request's true length."""
        parts: list[list[tuple[TensorDesc, memoryview]]] = [[] for _ in rows]
        for desc in outputs:
            pieces = split_rows(desc, segment, rows)
            cut = self.cut.get(desc.name)
            if cut is not None:
                spec = self.padded[cut.follows]
                longest = _padded_shape(requests, spec)[spec.dim]
                pieces = [
                    _cut_back(piece, view, cut, _shape(r, cut.follows)[spec.dim], longest)
                    for (piece, view), r in zip(pieces, requests, strict=True)
                ]
            for part, piece in zip(parts, pieces, strict=True):
                part.append(piece)
        return parts


def _pad_into(
    target: memoryview, offset: int, dims: list[int], spec: PaddedInput, placements: list[Placement]
) -> int:
    """The padded input of the batch written at ``offset``: filled with the pad value, each
    request's values in its rows; where it ends."""
    dtype = DATATYPES[spec.datatype].numpy
    count = math.prod(dims)
    whole = np.frombuffer(target, dtype=dtype, count=count, offset=offset).reshape(dims)
    whole.fill(spec.pad)
    row = 0
    for placement in placements:
        shape = placement[1]
        values = np.frombuffer(payload_bytes(placement), dtype=dtype).reshape(shape)
        index = (slice(row, row + shape[0]), *(slice(0, d) for d in shape[1:]))
        whole[index] = values
        row += shape[0]
    return offset + count * dtype.itemsize


def _cut_back(
    piece: TensorDesc, view: memoryview, cut: CutOutput, length: int, longest: int
) -> tuple[TensorDesc, memoryview]:
    """One request's part of an output, cut back along ``cut.dim`` to ``length``."""
    shape = piece.shape
    if len(shape) <= cut.dim or shape[cut.dim] != longest:
        raise InferenceFailed(
            f"output '{piece.name}' has shape {shape}, whose dimension {cut.dim} is not the "
            f"batch's padded length {longest}: it cannot be cut back (pad_batch)"
        )
    if length == longest:
        return piece, view
    dtype = DATATYPES[piece.datatype].numpy
    whole = np.frombuffer(view, dtype=dtype).reshape(shape)
    part = whole[(slice(None),) * cut.dim + (slice(0, length),)]
    new_shape = list(part.shape)
    if part.flags.c_contiguous:  # a prefix of the piece: a view, no copy
        data = view[: part.nbytes]
    else:
        data = np.ascontiguousarray(part).reshape(-1).view(np.uint8).data
    cut_desc = TensorDesc(
        piece.name, piece.datatype, new_shape, piece.segment, piece.offset, len(data)
    )
    return cut_desc, data
