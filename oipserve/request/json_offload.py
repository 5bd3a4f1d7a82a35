"""Large JSON request bodies parsed and decoded by a worker, not on the front's event loop.

Reading 40 MB of JSON numbers takes the front about 35 ms to check the body and
130 ms to decode the numbers, and the event loop serves nobody meanwhile (simdjson
and msgspec hold the GIL, so a thread would not help). A body of ``PARSE_MIN``
bytes or more that already lies in a pooled segment goes two extra steps instead,
each a round trip to one of the model's workers:

1. ``parse``: the worker checks the whole body with the front's own request decoder
   (``wire.json_request``) and answers where each input's ``data`` text lies. The
   front then decodes the header alone, with every ``data`` cut out: the same
   Structs and the same checks as for a small body, on a few hundred bytes.
2. ``decode``: once the data plane has checked names, datatypes and shapes against
   the model, the worker decodes each large ``data`` text (``wire.json_values``) into
   a segment the front placed, where the input then lies like a binary one. Batched
   and unbatched models take it from there alike.

Errors are the worker's ``Failed`` with the same words the front would use, since
both sides run the same code. A model answered by the front (echo) has no worker:
its bodies are decoded in the front as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from oipserve.errors import InternalError, InvalidInput, WorkerProtocolError, from_kind
from oipserve.request.inference import InputTensor
from oipserve.request.tensors import Deferred
from oipserve.wire.datatypes import ELEMENT_SIZES
from oipserve.wire.json_request import InferRequest, decode_request
from oipserve.wire.messages import DecodeJson, Failed, JsonParsed, JsonText, ParseJson
from oipserve.wire.shm import BufferPool, Lease, layout

if TYPE_CHECKING:
    from oipserve.pool.link import WorkerLink

#: Bodies this large or larger are parsed by a worker (a body in a pooled segment of
#: 1 MiB costs the front about 1 ms to check and 3 ms to decode).
PARSE_MIN = 1024 * 1024
#: ``data`` texts this large or larger (in a body a worker parsed) are decoded by a
#: worker; smaller ones cost the front less than the round trip.
DECODE_MIN = 64 * 1024

__all__ = ["DECODE_MIN", "PARSE_MIN", "decode", "parse", "wants_worker"]


async def parse(
    worker: WorkerLink,
    lease: Lease,
    start: int,
    body: memoryview,
    deadline: float,
    answered: Callable[[], None] | None = None,
) -> tuple[InferRequest, list[tuple[int, int] | None]]:
    """The request's header, and where each input's ``data`` text lies in ``body``.

    ``body`` lies at ``start`` in ``lease``. A body that is not a valid inference
    request is InvalidInput, with the words ``decode_request`` uses. ``answered`` is
    called once the worker answers (or dies), or here if the job cannot be sent.
    """
    try:
        waiting = worker.call(
            lambda rid: ParseJson(rid, lease.name, start, len(body)), answered, deadline
        )
    except BaseException:
        if answered is not None:
            answered()
        raise
    worker.loading += 1  # NOTE: the parse holds the GIL: heartbeats may wait (worker_handle)
    try:
        reply = await waiting
    finally:
        worker.loading -= 1
    if isinstance(reply, Failed):
        raise from_kind(reply.kind, reply.message)
    if not isinstance(reply, JsonParsed):
        raise WorkerProtocolError(
            f"worker {worker.worker_id} answered {type(reply).__name__} to ParseJson"
        )
    pieces: list[bytes | memoryview] = []
    texts: list[tuple[int, int] | None] = []
    pos = 0
    for offset, length in reply.spans:
        if not length:
            texts.append(None)
            continue
        if offset < pos or offset + length > len(body):
            raise WorkerProtocolError(f"worker {worker.worker_id} answered a span outside the body")
        # NOTE: an empty array keeps the header valid JSON of the same shape; the data
        #   plane reads the real text where ``texts`` says.
        pieces += (body[pos:offset], b"[]")
        texts.append((offset, length))
        pos = offset + length
    pieces.append(body[pos:])
    try:
        request = decode_request(b"".join(pieces))
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if len(request.inputs) != len(texts):
        raise WorkerProtocolError(f"worker {worker.worker_id} answered {len(texts)} spans")
    return request, texts


def wants_worker(tensor: InputTensor, data: Deferred) -> bool:
    """Whether a checked input's deferred data is JSON text a worker should decode."""
    return data.text is not None and tensor.datatype != "BYTES" and data.text[2] >= DECODE_MIN


async def decode(
    worker: WorkerLink,
    tensors: list[tuple[InputTensor, int]],
    pool: BufferPool,
    deadline: float,
    done: Callable[[], None] | None = None,
) -> Lease:
    """Have ``worker`` decode each tensor's deferred text into one new lease.

    ``tensors`` pairs each input with its element count. Afterwards each input is
    ``located`` in the returned lease, which the caller owns (and releases). ``done`` is
    called once the worker answers (or dies), or here if the job is not sent.
    """
    sizes = [count * ELEMENT_SIZES[tensor.datatype] for tensor, count in tensors]
    offsets, total = layout(sizes)
    try:
        lease = await pool.acquire_async(total)
    except BaseException:
        if done is not None:
            done()
        raise
    texts = []
    for (tensor, count), offset in zip(tensors, offsets, strict=True):
        deferred = tensor.values
        if not isinstance(deferred, Deferred) or deferred.text is None:
            lease.release()
            if done is not None:
                done()
            raise InternalError(f"input '{tensor.name}' has no JSON text for a worker to decode")
        held, start, size = deferred.text
        texts.append(
            JsonText(
                tensor.name, tensor.datatype, count, held.name, start, size, lease.name, offset
            )
        )
    replied = abandoned = False

    def answered() -> None:
        # NOTE: a caller gone before the reply (deadline, client left) must not give
        #   the lease back while the worker may still write into it: the reply (or the
        #   worker's death) does.
        nonlocal replied
        replied = True
        if abandoned:
            lease.release()
        if done is not None:
            done()

    try:
        waiting = worker.call(lambda rid: DecodeJson(rid, texts), answered, deadline)
    except BaseException:
        lease.release()
        if done is not None:
            done()
        raise
    worker.loading += 1  # NOTE: as in parse
    try:
        reply = await waiting
    except BaseException:
        if replied:  # the worker died: it writes nothing more
            lease.release()
        else:
            abandoned = True
        raise
    finally:
        worker.loading -= 1
    if isinstance(reply, Failed):
        lease.release()
        raise from_kind(reply.kind, reply.message)
    for (tensor, _), offset, size in zip(tensors, offsets, sizes, strict=True):
        tensor.values = None
        tensor.located = (lease, offset, size)
    return lease
