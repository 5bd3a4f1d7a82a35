"""An ``InferResult`` as an HTTP response: JSON, or the binary tensor extension.

The segment holding the worker's outputs is released as soon as nothing needs
it: at once for JSON and small or compressed responses (their bytes are copied
into the body), and only when the transport has dropped the last view for
large binary ones, which go to the socket without a copy.

A large output the client gets as JSON arrives already printed by the worker
(``OutputTensor.text``): its text goes to the socket as a view of the segment,
spliced into the encoded response where a mark stands, so the front's event
loop neither prints nor copies it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterator
from typing import Final

import falcon.asgi
import numpy as np
import orjson

from oipserve.front.rest.accept_encoding import choose_encoding
from oipserve.front.rest.coding import (
    COMPRESS_ON_LOOP_MAX,
    compress,
    compress_stream,
)
from oipserve.front.rest.encode import encode_response
from oipserve.front.rest.media import HEADER_LENGTH, JSON, OCTET_STREAM
from oipserve.request.inference import InferResult, OutputTensor, region_parameters_of
from oipserve.request.tensors import json_values
from oipserve.runtime.off_loop import nothing_to_release
from oipserve.wire.datatypes import bytes_elements_from
from oipserve.wire.json_values import bytes_as_text

#: Below this many binary bytes a response is joined into one buffer: one socket
#: write costs more than copying a few kilobytes.
JOIN_LIMIT: Final = 64 * 1024


#: Elements of an output the front prints at a time, the loop given back in between
#: (about 1.5 ms of orjson for FP32).
PRINT_STEP: Final = 65_536


def outputs_to_print(
    result: InferResult, flags: list[bool] | None, all_binary: bool
) -> list[OutputTensor]:
    """The outputs ``print_in_steps`` prints: large, wanted as JSON, not printed yet."""
    return [
        tensor
        for index, tensor in enumerate(result.outputs)
        # NOTE: the byte size first: one len() is all a small output costs.
        if len(tensor.data) > PRINT_STEP
        and not (flags[index] if flags is not None else all_binary)
        and not tensor.text
        and tensor.region is None
        and tensor.count > PRINT_STEP
    ]


async def print_in_steps(result: InferResult, tensors: list[OutputTensor]) -> None:
    """Print large JSON outputs the worker did not print, ``PRINT_STEP`` elements at a time.

    (Outputs of batched models: the front splits a batch's outputs per request.) Each
    becomes a text output, as if the worker had printed it: ``render_infer`` splices it
    in. orjson prints a flat array without spaces, so the steps' texts joined by commas
    inside one pair of brackets are the text of the whole array. ``tensors`` are some of
    ``result``'s outputs (``outputs_to_print``).
    """
    try:
        for tensor in tensors:
            steps = (
                _bytes_steps(tensor.data)
                if tensor.datatype == "BYTES"
                else _number_steps(json_values(tensor.datatype, tensor.data, tensor.count))
            )
            pieces: list[bytes] = []
            for step in steps:
                await asyncio.sleep(0)  # the loop given back between steps
                # NOTE: "[1,2]" "[3]" become "[1,2" ",3]": the pieces in a row are the
                #   array's text, never joined here (80 MB joined took ~20 ms of the loop).
                pieces.append(step[:-1] if not pieces else b"," + step[1:-1])
            pieces[-1] += b"]"
            tensor.parts = pieces
            tensor.text = True
    except BaseException:
        result.release()
        raise


# NOTE: plain generators, the caller awaiting between steps: mypyc compiles no async
#   generator.
def _number_steps(values: np.ndarray | list[str]) -> Iterator[bytes]:
    """The JSON text of ``PRINT_STEP`` values at a time."""
    for start in range(0, len(values), PRINT_STEP):
        yield orjson.dumps(values[start : start + PRINT_STEP], option=_NUMPY)


def _bytes_steps(data: memoryview) -> Iterator[bytes]:
    """Like ``_number_steps`` for BYTES elements, decoded as ``json_values`` decodes them."""
    pos = 0
    while pos < len(data):
        elements, pos = bytes_elements_from(data, pos, PRINT_STEP)
        yield orjson.dumps(bytes_as_text(elements))


def render_infer(
    req: falcon.asgi.Request,
    resp: falcon.asgi.Response,
    result: InferResult,
    request_id: str | None,
    flags: list[bool] | None,
    all_binary: bool,
) -> None:
    """Write ``result`` into ``resp``; ``flags`` says per output whether it goes binary.

    ``flags`` is None when the request named no outputs; then ``all_binary``
    (the request's ``binary_data_output``) decides for every output. Owns
    ``result`` from the call on: it is released here or by the last view sent.
    """
    try:
        outputs: list[dict[str, object]] = []
        chunks: list[memoryview] = []
        texts: list[list[bytes] | list[memoryview]] = []
        for index in range(len(result.outputs)):  # PERF: (mypyc) indexed: no iterators
            tensor = result.outputs[index]
            as_binary = flags[index] if flags is not None else all_binary
            entry: dict[str, object] = {
                "name": tensor.name,
                "datatype": tensor.datatype,
                "shape": tensor.shape,
            }
            if tensor.region is not None:  # written into the client's shared memory
                entry["parameters"] = region_parameters_of(tensor)
            elif as_binary:
                entry["parameters"] = {"binary_data_size": len(tensor.data)}
                if len(tensor.data):
                    chunks.append(tensor.data)
            elif tensor.text:  # printed already: spliced in below, never read here
                entry["data"] = _TEXT_MARK
                texts.append(tensor.parts if tensor.parts is not None else [tensor.data])
            else:
                entry["data"] = json_values(tensor.datatype, tensor.data, tensor.count)
            outputs.append(entry)
        response: dict[str, object] = {
            "model_name": result.model.name,
            "model_version": result.model.version,
        }
        if request_id is not None:
            response["id"] = request_id
        response["outputs"] = outputs
        header = encode_response(response)
        head: list[bytes | memoryview] = _splice(header, texts) if texts else [header]
    except BaseException:
        result.release()
        raise
    encoding = choose_encoding(req.get_header("Accept-Encoding"))
    if not chunks and not texts:
        result.release()
        resp.content_type = JSON
        if encoding == "identity":
            resp.data = header
        elif len(header) <= COMPRESS_ON_LOOP_MAX:
            resp.data = compress([header], encoding)
        else:
            resp.stream = compress_stream([header], encoding, nothing_to_release)
    else:
        header_size = 0
        for part in head:
            header_size += len(part)
        if chunks:
            resp.content_type = OCTET_STREAM
            resp.set_header(HEADER_LENGTH, str(header_size))
        else:
            resp.content_type = JSON
        parts: list[bytes | memoryview] = [*head, *chunks]
        total = header_size + sum(len(c) for c in chunks)
        if encoding != "identity" and total > COMPRESS_ON_LOOP_MAX:
            # NOTE: compressed a step at a time in a thread; the segment is released
            #   once the last part has been read.
            resp.stream = compress_stream(parts, encoding, result.release)
        elif encoding != "identity" or total <= JOIN_LIMIT:
            try:
                resp.data = compress(parts, encoding) if encoding != "identity" else b"".join(parts)
            finally:
                result.release()
        else:
            # PERF: large outputs go to the socket as views of the worker's segment.
            #   The transport may keep a view until the bytes are written, so the
            #   segment is released only when the last view is collected.
            releaser = _Releaser(result, sum(not isinstance(part, bytes) for part in parts))
            views: list[bytes | memoryview] = []
            for part in parts:
                if isinstance(part, bytes):
                    views.append(part)
                    continue
                # A numpy array can carry a finalizer (a memoryview cannot); the
                #   transport holds the memoryview, which holds the array.
                owner = np.frombuffer(part, dtype=np.uint8)
                weakref.finalize(owner, releaser)
                views.append(owner.data)
                del owner
            resp.content_length = total
            # Falcon types a stream's chunks as bytes; it hands each to ASGI send as it is,
            #   and uvicorn's transport writes a view as it writes bytes.
            resp.stream = _ViewStream(views)  # type: ignore[assignment]
    if encoding != "identity":
        resp.set_header("Content-Encoding", encoding)


_NUMPY: Final = orjson.OPT_SERIALIZE_NUMPY

#: Stands in the encoded header for each output text the worker printed. orjson writes
#: a Fragment as it is, and never writes a NUL byte of its own (it escapes control
#: characters in strings), so each NUL in the header marks one text, in order.
_TEXT_MARK: Final = orjson.Fragment(b"\x00")


def _splice(header: bytes, texts: list[list[bytes] | list[memoryview]]) -> list[bytes | memoryview]:
    """The header's pieces around its marks, with each mark replaced by its text's parts."""
    parts: list[bytes | memoryview] = []
    pos = 0
    for text in texts:
        mark = header.index(b"\x00", pos)
        parts.append(header[pos:mark])
        parts += text
        pos = mark + 1
    parts.append(header[pos:])
    return parts


class _ViewStream:
    """A response's parts for Falcon's ``resp.stream``, each handed over and forgotten (so
    that a sent view can be collected). An iterator class: mypyc compiles no async
    generator."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[bytes | memoryview]) -> None:
        self.parts = parts

    def __aiter__(self) -> _ViewStream:
        return self

    async def __anext__(self) -> bytes | memoryview:
        if not self.parts:
            raise StopAsyncIteration
        return self.parts.pop(0)


class _Releaser:
    """Releases an InferResult once every view handed to the transport is gone."""

    __slots__ = ("result", "remaining")

    def __init__(self, result: InferResult, count: int) -> None:
        self.result = result
        self.remaining = count

    def __call__(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.result.release()
