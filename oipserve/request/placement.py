"""Putting checked inputs into shared memory, where the worker reads them.

``payload`` checks an input's data against its shape and gives its byte size and its
host-side data (None when it already lies in a pooled segment); ``place`` writes the
host-side data of a request into one pooled segment (a large one created and filled
off the loop) and describes every input to the worker (no copy for data that is already in a
segment).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from oipserve.errors import InternalError, InvalidInput, RequestRefusal
from oipserve.request import json_offload
from oipserve.request.images import image_payload
from oipserve.request.inference import InputTensor
from oipserve.request.tensors import (
    Deferred,
    bytes_from_values,
    packed_from_values,
    string_count_words,
)
from oipserve.runtime.off_loop import copy_into, in_thread
from oipserve.wire.datatypes import (
    ELEMENT_SIZES,
    bytes_count_fault,
    element_count,
    encode_bytes_elements,
)
from oipserve.wire.json_values import count_words
from oipserve.wire.messages import TensorDesc
from oipserve.wire.shm import CREATE_IN_THREAD, BufferPool, Lease, align

__all__ = [
    "HostData",
    "Payload",
    "Placement",
    "check_size",
    "image_payload_of",
    "payload",
    "place",
    "values_of",
]

#: An input's data in this process: encoded BYTES elements or images (bytearray), a view of
#: the request body (memoryview), decoded JSON or typed values (an array; a few JSON values
#: packed: bytes).
HostData = bytes | bytearray | memoryview | np.ndarray
#: Where ``payload`` leaves an input's data: host data; JSON text a worker decodes later
#: (``Deferred``, json_offload); None when it already lies in shared memory.
Payload = HostData | Deferred | None
#: One checked input: the tensor, the shape the model gets, its byte size, its data.
Placement = tuple[InputTensor, list[int], int, Payload]


async def place(
    placements: list[Placement], pool: BufferPool
) -> tuple[list[TensorDesc], Lease | None]:
    """Descriptors for every input, host-side data copied into one new pooled segment.

    A large new segment is created off the event loop (``BufferPool.acquire_async``).
    """
    size = _hosted_size(placements)
    if size is None:
        return _place_into(placements, None), None
    if size < CREATE_IN_THREAD:
        lease = pool.acquire(size)
        try:
            return _place_into(placements, lease), lease
        except BaseException:
            lease.release()
            raise
    # NOTE: large copies go to a thread (numpy's copies let go of the GIL): a 122 MiB
    #   gRPC input copied on the loop held it for ~0.5 s here, page faults included.
    lease = await pool.acquire_async(size)
    placing = partial(_place_into, placements, lease)
    return await in_thread(placing, lease.release, after_success=False), lease


def _hosted_size(placements: list[Placement]) -> int | None:
    """Bytes of one segment for the inputs' host-side data; None when no input has any.

    (Zero-element tensors, [0, 16], have no bytes but still need a segment to name in
    their descriptor: the smallest size class serves.)
    """
    total = 0
    hosted = False
    for tensor, _, nbytes, _ in placements:
        if tensor.located is None and tensor.region is None:
            total = align(total + nbytes)
            hosted = True
    return max(total, 1) if hosted else None


def _place_into(placements: list[Placement], lease: Lease | None) -> list[TensorDesc]:
    """Descriptors for every input, copying host-side data into ``lease``
    (of ``_hosted_size`` bytes at least; None when that is None)."""
    descs = []
    offset = 0
    for tensor, shape, nbytes, data in placements:
        if tensor.region is not None:  # in a client's object: the worker reads it there
            use = tensor.region
            descs.append(
                TensorDesc(
                    tensor.name,
                    tensor.datatype,
                    shape,
                    "",
                    use.offset,
                    use.nbytes,
                    tensor.image,
                    use.region.ref,
                )
            )
            continue
        if tensor.located is not None:
            held, start, size = tensor.located
            descs.append(
                TensorDesc(
                    tensor.name,
                    tensor.datatype,
                    shape,
                    held.name,
                    start,
                    size,
                    tensor.image,
                )
            )
            continue
        if lease is None:
            raise InternalError(f"input '{tensor.name}' has host-side data but no segment")
        if data is None or isinstance(data, Deferred):
            raise InternalError(f"input '{tensor.name}' has no host-side data to place")
        copy_into(lease.buf, offset, nbytes, data)
        descs.append(
            TensorDesc(
                tensor.name,
                tensor.datatype,
                shape,
                lease.name,
                offset,
                nbytes,
                tensor.image,
            )
        )
        offset = align(offset + nbytes)
    return descs


def values_of(tensor: InputTensor, count: int, model: str = "") -> object:
    """An input's values, decoded now if they were deferred (``tensors.Deferred``).

    A declared element count the sent data cannot hold is refused before decoding.
    """
    values = tensor.values
    if not isinstance(values, Deferred):
        return values
    _check_most(tensor, values, count, model)
    return values.load()


def _check_most(tensor: InputTensor, values: Deferred, count: int, model: str) -> None:
    """InvalidInput if the deferred values cannot hold ``count`` elements: a gRPC tensor's
    contents of another count (``Deferred.exact``) in the words Triton's core gives them
    (its gRPC front hands it their bytes), JSON text too short in those its HTTP front
    gives for fewer elements than the shape (BYTES: its core's, once counted)."""
    if values.exact:
        if values.most != count:
            raise _contents_count(tensor, values.most, count, model)
        return
    if count > values.most:
        # NOTE: the text is short (fewer than 2 characters an element): decoding it costs
        #   little and names what is wrong with it when that is more than its length.
        loaded = values.load()
        if tensor.datatype == "BYTES":
            bytes_from_values(tensor.name, loaded, count, model)  # (refuses it)
        raise InvalidInput(
            f"{count_words(0, count)}: input '{tensor.name}': its shape {list(tensor.shape)} "
            f"holds {count} elements but 'data' can hold at most {values.most}"
        )


def _contents_count(tensor: InputTensor, found: int, count: int, model: str) -> RequestRefusal:
    """Triton's words for a gRPC tensor's typed contents of ``found`` elements where its
    shape holds ``count`` (core's byte size check; BYTES: its element count), then ours."""
    name, datatype = tensor.name, tensor.datatype
    ours = f"input '{name}': its shape holds {count} elements but its contents have {found}"
    if datatype == "BYTES":
        return RequestRefusal(f"{string_count_words(name, model, count, found)}: {ours}")
    size = ELEMENT_SIZES[datatype]
    return RequestRefusal(
        f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
        f"{size * count}, got {size * found}: {ours}"
    )


def payload(tensor: InputTensor, model: str = "") -> tuple[int, Payload]:
    """Byte size of an input and its host-side data (None when already in shared memory);
    ``model`` names the model in Triton's words for a region of the wrong size."""
    count = element_count(tensor.shape)
    datatype = tensor.datatype
    if tensor.values is not None:
        deferred = tensor.values
        if isinstance(deferred, Deferred) and json_offload.wants_worker(tensor, deferred):
            # NOTE: decoded by a worker before placement (oipserve.request.json_offload); the
            #   Deferred stands for the data until then.
            _check_most(tensor, deferred, count, model)
            return ELEMENT_SIZES[datatype] * count, deferred
        values = values_of(tensor, count, model)
        if datatype == "BYTES":
            blob = encode_bytes_elements(bytes_from_values(tensor.name, values, count, model))
            return len(blob), blob
        packed = packed_from_values(tensor.name, datatype, values, count)
        return (len(packed) if isinstance(packed, bytes) else packed.nbytes), packed
    if tensor.located is not None:
        held, start, size = tensor.located
        check_size(tensor, held.buf[start : start + size], count, model)
        return size, None
    if tensor.region is not None:
        # NOTE: the front never maps a client's region; BYTES length prefixes there are
        #   checked by the worker that reads them (workers.regions).
        nbytes = tensor.region.nbytes
        if datatype != "BYTES":
            expected = ELEMENT_SIZES[datatype] * count
            if nbytes != expected:
                raise RequestRefusal(
                    f"input byte size mismatch for input '{tensor.name}' for model '{model}'. "
                    f"Expected {expected}, got {nbytes}: input '{tensor.name}' should have "
                    f"{expected} bytes of data for shape {tensor.shape} and datatype "
                    f"{datatype}, but its shared_memory_byte_size is {nbytes}"
                )
        return nbytes, None
    if tensor.raw is not None:
        raw = memoryview(tensor.raw).cast("B")
        check_size(tensor, raw, count, model)
        return len(raw), raw
    raise InvalidInput(f"input '{tensor.name}' carries no data")


def image_payload_of(tensor: InputTensor, model: str = "") -> tuple[int, Payload]:
    """Like _payload for encoded images: JSON strings are base64 (oipserve.request.images)."""
    if tensor.values is not None:
        count = element_count(tensor.shape)
        blob = image_payload(tensor.name, values_of(tensor, count, model), count)
        return len(blob), blob
    return payload(tensor, model)


def check_size(tensor: InputTensor, data: memoryview, count: int, model: str = "") -> None:
    """InvalidInput unless ``data`` holds the ``count`` elements of ``tensor`` (a BYTES
    tensor: as many length-prefixed elements), in Triton's words first (core's Normalize
    and ValidateBytesInputs; qa/L0_input_validation matches them) for model ``model``."""
    name = tensor.name
    if tensor.datatype == "BYTES":
        _check_bytes(name, data, count, model)
        return
    expected = ELEMENT_SIZES[tensor.datatype] * count
    if len(data) != expected:
        raise RequestRefusal(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
            f"{expected}, got {len(data)}: input '{name}' should have {expected} bytes of data "
            f"for shape {tensor.shape} and datatype {tensor.datatype}, but has {len(data)}"
        )


def _check_bytes(name: str, data: memoryview, count: int, model: str) -> None:
    """``data``'s elements against ``count`` (``bytes_count_fault``): RequestRefusal in
    Triton's words (the caller puts the request id first), InvalidInput in ours."""
    fault, tritons = bytes_count_fault(name, model, data, count)
    if fault:
        raise RequestRefusal(fault) if tritons else InvalidInput(fault)
