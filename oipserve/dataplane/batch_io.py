"""The tensors of a dynamic batch: joined once into shared memory, split back as views.

``assemble`` writes each input of every request of a batch, one request after another
along dimension 0, straight into one pooled segment: one copy of each request's bytes,
wherever they were (a JSON array, a gRPC message, a segment the body was received
into), and no intermediate concatenation. ``split`` cuts each output of the batch's
reply back into one piece per request, as views of the worker's output segment (no
copy). BYTES tensors join and split the same way: their length-prefixed elements are
simply consecutive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from oipserve.errors import InferenceFailed, InternalError
from oipserve.request.inference import InputTensor, Located, scalar_split_refusal
from oipserve.request.placement import Placement
from oipserve.wire.datatypes import split_bytes_elements
from oipserve.wire.messages import TensorDesc
from oipserve.wire.shm import align

__all__ = [
    "Made",
    "Placer",
    "SharedRelease",
    "assemble",
    "join",
    "joined",
    "payload_bytes",
    "split",
    "split_rows",
]


def payload_bytes(placement: Placement) -> memoryview:
    """The bytes of one placed input, wherever they lie."""
    tensor, _, nbytes, data = placement
    if data is None:
        if tensor.located is None:  # a client's region is read into a segment first
            raise InternalError(f"batched input '{tensor.name}' is in no front segment")
        held, start, size = tensor.located
        return held.buf[start : start + size]
    if isinstance(data, np.ndarray):
        return data.view(np.uint8).reshape(-1).data
    if isinstance(data, bytes | bytearray | memoryview):
        return memoryview(data).cast("B")
    raise InternalError(f"batched input '{tensor.name}' holds {type(data).__name__} data")


def batch_size(requests: list[list[Placement]]) -> int:
    """Bytes of the one segment that ``assemble`` fills for these requests."""
    by_name = [{p[0].name: p for p in request} for request in requests]
    total = 0
    for tensor, _, _, _ in requests[0]:
        total = align(total + sum(r[tensor.name][2] for r in by_name))
    return max(total, 1)


#: Writes one input of every request of a batch into ``target`` from ``offset``: where
#: the writes end and the batch's dims of that input (``joined``: one request after
#: another along dimension 0; ragged and padded batches have their own).
Placer = Callable[
    [InputTensor, list[int], list[dict[str, Placement]], memoryview, int], tuple[int, list[int]]
]

#: A tensor the server makes for a batch (batch inputs, masks, lengths): the input names
#: it is given as, its datatype, its values.
Made = tuple[Sequence[str], str, np.ndarray]


def joined(
    tensor: InputTensor,
    shape: list[int],
    by_name: list[dict[str, Placement]],
    target: memoryview,
    offset: int,
) -> tuple[int, list[int]]:
    """The ordinary batch's input: the requests' rows one after another."""
    end, rows = join(by_name, tensor.name, target, offset)
    return end, [rows, *shape[1:]]


def assemble(
    requests: list[list[Placement]],
    lease: Located,
    place: Placer = joined,
    made: Sequence[Made] = (),
) -> list[TensorDesc]:
    """Every input of the batch copied into ``lease`` (of ``batch_size`` bytes at least,
    or the layout's size), each by ``place``, then the tensors the server ``made``;
    descriptors with the batch's shapes.

    Each request's placements were checked against the model; requests of one batch
    have the same inputs with the same dims past the first (their signature), but for
    the dims a ragged or padded layout lets differ. The caller may release the
    requests' own leases once this returns.
    """
    by_name = [{p[0].name: p for p in request} for request in requests]
    target = lease.buf
    descs = []
    offset = 0
    for tensor, shape, _, _ in requests[0]:
        start = offset
        offset, dims = place(tensor, shape, by_name, target, offset)
        descs.append(
            TensorDesc(
                tensor.name,
                tensor.datatype,
                dims,
                lease.name,
                start,
                offset - start,
                tensor.image,
            )
        )
        offset = align(offset)
    for names, datatype, values in made:
        data = values.view(np.uint8).reshape(-1).data
        target[offset : offset + len(data)] = data
        for name in names:
            descs.append(
                TensorDesc(name, datatype, list(values.shape), lease.name, offset, len(data))
            )
        offset = align(offset + len(data))
    return descs


def join(
    by_name: list[dict[str, Placement]], name: str, target: memoryview, offset: int
) -> tuple[int, int]:
    """Input ``name`` of every request copied into ``target`` one after another from
    ``offset``; where the copies end, and the rows (first dimensions) they hold."""
    rows = 0
    for request in by_name:
        placement = request[name]
        data = payload_bytes(placement)
        target[offset : offset + len(data)] = data
        offset += len(data)
        rows += placement[1][0]
    return offset, rows


def split(
    outputs: list[TensorDesc], segment: memoryview, batches: list[int], left_out: bool = False
) -> list[list[tuple[TensorDesc, memoryview]]]:
    """Per request, each output's descriptor (its own shape) and a view of its rows.

    ``left_out``: the batch's requests leave out an optional input, which the graph's
    default (an initializer) stands for. An output of other rows than the batch's came
    from such a default alone (one row, where the batch has more): each request gets it
    whole, as it would running alone, where it could not be cut (a 500 until 2026-11-30).
    """
    parts: list[list[tuple[TensorDesc, memoryview]]] = [[] for _ in batches]
    total = sum(batches)
    for desc in outputs:
        if left_out and desc.shape and desc.shape[0] != total:
            whole = segment[desc.offset : desc.offset + desc.nbytes]
            for part in parts:
                part.append((desc, whole))
            continue
        for part, piece in zip(parts, split_rows(desc, segment, batches), strict=True):
            part.append(piece)
    return parts


def split_rows(
    desc: TensorDesc, segment: memoryview, batches: list[int]
) -> list[tuple[TensorDesc, memoryview]]:
    """One output cut into each request's rows (``batches``: its first dimensions)."""
    total = sum(batches)
    if not desc.shape and len(batches) > 1:
        # NOTE: a scalar output of a model that batches: Triton's ONNX Runtime backend
        #   answers the value to a first request of one row and fails the others
        #   (inference.scalar_rows); here the whole batch fails, in its words for the
        #   first request it fails.
        first = batches[0]
        raise scalar_split_refusal(desc.name, first if first > 1 else first + batches[1])
    if not desc.shape or desc.shape[0] != total:
        raise InferenceFailed(
            f"output '{desc.name}' has shape {desc.shape}, whose first dimension is not "
            f"the batch size {total}: the model cannot be batched"
        )
    whole = segment[desc.offset : desc.offset + desc.nbytes]
    bounds = _row_bounds(desc, whole, total)
    pieces = []
    row = 0
    for batch in batches:
        start, end = bounds(row), bounds(row + batch)
        shape = [batch, *desc.shape[1:]]
        piece = TensorDesc(
            desc.name, desc.datatype, shape, desc.segment, desc.offset + start, end - start
        )
        pieces.append((piece, whole[start:end]))
        row += batch
    return pieces


def _row_bounds(desc: TensorDesc, whole: memoryview, rows: int) -> Callable[[int], int]:
    """Byte offset (within the output) where a given row starts."""
    if desc.datatype != "BYTES":
        row_bytes = desc.nbytes // rows if rows else 0
        return lambda row: row * row_bytes
    elements = split_bytes_elements(whole)
    per_row = len(elements) // rows if rows else 0
    starts = [0]
    for element in elements:
        starts.append(starts[-1] + 4 + len(element))
    del elements  # the views pin the segment's mapping
    return lambda row: starts[row * per_row]


class SharedRelease:
    """Gives a batch's output segment back once every request has released its part."""

    __slots__ = ("_left", "_release")

    def __init__(self, count: int, release: Callable[[], None]) -> None:
        self._left = count
        self._release = release

    def part(self) -> Callable[[], None]:
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            self._left -= 1
            if self._left == 0:
                self._release()

        return release
