"""Receiving a request body: into pooled shared memory when a worker will read it, else bytes.

Binary requests (``Inference-Header-Content-Length``) and large JSON ones are
received straight into a ``BufferPool`` lease, with one copy, so that the data
plane can hand the worker the segment itself. A compressed or chunked JSON body
of ``json_offload.PARSE_MIN`` or more is copied into a lease once read (in a
thread from ``COPY_IN_THREAD``), so that a worker can parse it too. Everything else
is read into bytes. ``read_all`` is also the body reader of the management routes.
"""

from __future__ import annotations

from functools import partial
from typing import Final

import falcon.asgi

from oipserve.errors import InvalidInput, PayloadTooLarge, Unsupported
from oipserve.front.http.extensions import (
    BODY_REFUSED,
    NO_EXTENSIONS,
    RECEIVE_INTO,
    TOO_LARGE,
    ClientDisconnected,
)
from oipserve.front.http.lane import LaneRequest
from oipserve.front.rest.coding import Inflater, release_blocks
from oipserve.request.json_offload import PARSE_MIN
from oipserve.runtime.off_loop import copy_into, releasing_on_failure
from oipserve.wire.shm import ALIGNMENT, BufferPool, Lease

#: JSON bodies of this many bytes or more are received like binary ones: straight
#: into a pooled segment (``app._App`` leaves their first body event to us).
DIRECT_BODY_MIN: Final = 64 * 1024


class Body:
    """A request body: in a shared-memory lease (binary requests) or in plain bytes."""

    __slots__ = ("data", "lease", "start")

    def __init__(self, data: memoryview | bytes, lease: Lease | None = None, start: int = 0):
        self.data = data
        self.lease = lease
        #: Offset of ``data[0]`` inside the lease's segment.
        self.start = start


async def read_all(req: falcon.asgi.Request, limit: int) -> bytes:
    """The whole body as bytes; 413 as soon as it grows past ``limit`` (small bodies:
    management requests; an inference body is read by ``read_body``)."""
    return b"".join(await read_parts(req, limit))


async def read_parts(req: falcon.asgi.Request, limit: int) -> Parts:
    """The whole body in the parts it arrived in; 413 as soon as it grows past ``limit``.

    Not joined here: joining 64 MB of parts took ~50 ms of the event loop (a chunked
    body of unknown length); a large body's parts are copied into a lease in a thread
    instead (``_into_lease``).
    """
    parts: Parts = []
    size = 0
    if isinstance(req, LaneRequest):
        # PERF: ``LaneRequest.next_part``: no StopAsyncIteration at the end.
        chunk = await req.next_part()
        while chunk:
            size = _counted(size, chunk, limit)
            parts.append(chunk)
            chunk = await req.next_part()
        return parts  # (a lane request is never chunked: nothing refused by chunk sizes)
    async for chunk in req.stream:
        size = _counted(size, chunk, limit)
        parts.append(chunk)
    _check_refused(req)
    return parts


def _counted(size: int, chunk: bytes, limit: int) -> int:
    """The body's size with ``chunk``; 413 past ``limit``."""
    size += len(chunk)
    if size > limit:
        raise PayloadTooLarge(TOO_LARGE.format(limit))
    return size


#: A body inflated or read whole: its bytes in order, in one part or more.
Parts = list[bytes | bytearray | memoryview]


async def read_decompressed(req: falcon.asgi.Request, encoding: str, limit: int) -> Parts:
    """The body inflated as it arrives, in parts; 413 as soon as either size passes ``limit``.

    Chunks are inflated as they come rather than after the whole body, so the
    compressed body is never held whole and a bomb is refused at the limit
    (``Inflater`` does not hold the loop: a large body inflates in a thread).
    """
    inflater = Inflater(encoding, limit)
    size = 0
    try:
        async for chunk in req.stream:
            size = _counted(size, chunk, limit)
            await inflater.feed(chunk)
        _check_refused(req)
        return inflater.finish()
    except BaseException:
        inflater.discard()  # NOTE: a refused body's memory goes back at once (issue #35)
        raise


def _check_refused(req: falcon.asgi.Request) -> None:
    """413 if the server refused the body by its declared chunk sizes (the stream just ends)."""
    message = req.scope.get(BODY_REFUSED)
    if message is not None:
        raise PayloadTooLarge(message)


async def read_body(
    req: falcon.asgi.Request, limit: int, pool: BufferPool, header_length: str | None
) -> Body:
    """Receive the body; binary and large bodies land in a shared-memory lease, one copy."""
    # NOTE: a Content-Length above ``limit`` was answered 413 by ``_App`` already;
    #   ``limit`` here bounds bodies of unknown length and decompressed ones.
    length = req.content_length
    given = req.get_header("Content-Encoding")
    # PERF: (lower() makes a new string even of "identity": only a given one is read)
    encoding = given.strip().lower() if given else "identity"
    if encoding not in ("identity", "gzip", "deflate"):
        raise Unsupported(f"unsupported Content-Encoding '{encoding}' (use gzip or deflate)")
    if header_length is None:
        if length is not None and length >= DIRECT_BODY_MIN and encoding == "identity":
            # PERF: a large JSON body lands in pooled memory whose pages are mapped
            #   already, without uvicorn's copies and the join (~5 ms at 5 MB).
            return await _receive_leased(req, pool, length, 0)
        parts = await _read_whole(req, encoding, limit)
        if _size(parts) < PARSE_MIN:
            return Body(_joined(parts))
        # NOTE: a large compressed or chunked JSON body goes into a lease too, so that a
        #   worker can parse it (json_offload).
        return await _into_lease(pool, parts, 0)
    # NOTE: place the body so the first binary chunk starts on a 64-byte boundary;
    #   numpy and ONNX Runtime then read it in place instead of copying.
    text = header_length.strip()
    # NOTE: at most 18 digits: int() refuses more than 4,300 (a 500); a longer value is
    #   refused by binary.parse_header_length.
    header = int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None
    pad = 0 if header is None else (-header) % ALIGNMENT
    if header == 0:
        # NOTE: a raw request (no JSON header): room before the data for the 4-byte length
        #   a BYTES input gets (resources._raw_input), the data still on a boundary.
        pad = ALIGNMENT
    if length is None or encoding != "identity":
        return await _into_lease(pool, await _read_whole(req, encoding, limit), pad)
    return await _receive_leased(req, pool, length, pad)


async def _read_whole(req: falcon.asgi.Request, encoding: str, limit: int) -> Parts:
    """A body of unknown length (chunked) or compressed, read whole, inflated."""
    if encoding != "identity":
        return await read_decompressed(req, encoding, limit)
    return await read_parts(req, limit)


def _size(parts: Parts) -> int:
    """Bytes in ``parts`` (PERF: (mypyc) a loop: ``sum`` of a generator made two objects)."""
    size = 0
    for part in parts:
        size += len(part)
    return size


def _joined(parts: Parts) -> memoryview | bytes:
    """A small body's parts as one buffer (one part is not copied; none is empty)."""
    if len(parts) != 1:
        return b"".join(parts)
    return memoryview(parts[0]) if isinstance(parts[0], bytearray) else parts[0]


#: Bodies of this many bytes or more are copied into their lease in a thread (numpy's
#: copies let go of the GIL): 8 MiB copied on the loop took up to ~5 ms here. Smaller
#: ones are copied on the loop (about 0.1 ms per MiB).
COPY_IN_THREAD: Final = 1024 * 1024


async def _into_lease(pool: BufferPool, parts: Parts, pad: int) -> Body:
    """``parts`` copied one after the other into a new lease, ``pad`` bytes in."""
    size = _size(parts)
    lease = await pool.acquire_async(pad + size)
    copying = partial(_copy_parts, lease.buf, pad, parts)
    await releasing_on_failure(copying, lease.release, in_a_thread=size >= COPY_IN_THREAD)
    return Body(lease.buf[pad : pad + size], lease, pad)


def _copy_parts(target: memoryview, offset: int, parts: Parts) -> None:
    """Copy ``parts`` in order, then unmap an inflated body's blocks (this runs in a
    thread whenever there are any: they exist only past ``COPY_IN_THREAD``)."""
    for part in parts:
        copy_into(target, offset, len(part), part)
        offset += len(part)
    release_blocks(parts)


async def _receive_leased(
    req: falcon.asgi.Request, pool: BufferPool, length: int, pad: int
) -> Body:
    """Receive a body of ``length`` bytes into a new lease, ``pad`` bytes in."""
    lease = await pool.acquire_async(pad + length)
    end = pad + length
    receive_into = req.scope.get("extensions", NO_EXTENSIONS).get(RECEIVE_INTO)
    try:
        if receive_into is not None:
            # PERF: the server copies body bytes straight from its parser into the
            #   segment (see front/http/protocol.py), skipping three copies in uvicorn.
            received = await receive_into(lease.buf[pad:end])
        else:
            received = await _stream_into(req, lease.buf, pad, end)
        if received != length:
            raise InvalidInput(
                f"the request body ended after {received} of {length} bytes (Content-Length)"
            )
    except ClientDisconnected:
        lease.release()
        raise InvalidInput("the client went away before its request body was complete") from None
    except BaseException:
        lease.release()
        raise
    return Body(lease.buf[pad:end], lease, pad)


async def _stream_into(req: falcon.asgi.Request, target: memoryview, pos: int, end: int) -> int:
    """Copy the body into ``target[pos:end]`` chunk by chunk, as any ASGI server delivers it."""
    start = pos
    async for chunk in req.stream:
        size = len(chunk)
        if pos + size > end:
            raise InvalidInput("the request body is longer than its Content-Length")
        target[pos : pos + size] = chunk
        pos += size
    return pos - start
