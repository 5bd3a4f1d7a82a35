"""The ModelInfer wire format, read and written without protobuf's copies of tensor bytes.

``ModelInferRequest.raw_input_contents`` is the fast path: the request is not
handed whole to protobuf (which would copy every raw entry into a new
``bytes``); ``split_infer_request`` walks its top-level fields, keeps each raw
entry as a view of the received message and lets protobuf parse only the
rest. The data plane then copies each view once, into shared memory.

``InferReply`` writes a ModelInferResponse by hand for the same reason: each
output is copied once, from the worker's segment into the wire bytes.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from functools import partial
from typing import Any, Final, TypeVar

from google.protobuf.message import DecodeError

from oipserve.errors import InvalidInput
from oipserve.front.grpc.varint import varint_bytes
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.request.inference import InferResult, Parked, region_parameters_of
from oipserve.runtime.off_loop import copy_into, in_thread
from oipserve.wire.shm import Lease

_RAW_KEY: Final = (7 << 3) | 2  # ModelInferRequest.raw_input_contents, length-delimited
#: ModelInferResponse.raw_output_contents, length-delimited.
_RAW_OUTPUT_TAG: Final = bytes([(6 << 3) | 2])


# ---- requests: raw_input_contents without a copy ---------------------------------


class InferCall:
    """A parsed ModelInferRequest plus its raw input entries (views of the wire bytes,
    or copies for a small message).

    A message received straight into a pooled segment (``oipserve.front.grpc.call``) also
    carries that ``lease`` and where each raw entry lies in it (``spans``): its inputs
    are then read by the worker where they are, and whoever answers the call owns the
    lease.
    """

    __slots__ = ("message", "raw", "spans", "lease", "deadline", "parked")

    def __init__(
        self,
        message: pb.ModelInferRequest,
        raw: list[memoryview] | list[bytes],
        spans: list[tuple[int, int]] | None = None,
    ) -> None:
        self.message = message
        self.raw = raw
        self.spans = spans
        self.lease: Lease | None = None
        #: The call's deadline (loop time; ``grpc-timeout``), if it has one.
        self.deadline: float | None = None
        #: A stream's request: told while it waits for a sequence slot (``Inference.parked``).
        self.parked: Parked | None = None

    def located(self) -> list[tuple[Lease, int, int]] | None:
        """Each raw entry as (lease, offset, size), when the message lies in a lease."""
        if self.lease is None or self.spans is None:
            return None
        return [(self.lease, start, size) for start, size in self.spans]


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


#: ModelInferRequest.model_name (field 1) and model_version (field 2), length-delimited.
_NAME_KEY: Final = (1 << 3) | 2
_VERSION_KEY: Final = (2 << 3) | 2


def model_named(data: bytes | memoryview) -> tuple[str, str]:
    """The model_name and model_version of a serialized ModelInferRequest, without parsing
    the rest: its top-level fields are walked, and of a field given twice the last counts,
    as protobuf reads it (the first routed a stream's request to a front, and the front
    answered for the last). A message that does not parse names no model ("", "")."""
    view = memoryview(data)
    name = version = ""
    pos = 0
    end = len(view)
    try:
        while pos < end:
            key, pos = _varint(view, pos)
            if key == _NAME_KEY:
                name, pos = _string(view, pos)
            elif key == _VERSION_KEY:
                version, pos = _string(view, pos)
            else:
                pos = _skipped(view, pos, key & 7)
                if pos < 0:  # (a group, or no wire type: protobuf decides)
                    message = pb.ModelInferRequest.FromString(bytes(view))
                    return message.model_name, message.model_version
        if pos > end:
            raise DecodeError("truncated message")
    except (DecodeError, UnicodeDecodeError):
        return "", ""
    return name, version


def _skipped(view: memoryview, pos: int, wire: int) -> int:
    """Where a field whose key ends at ``pos`` ends (its value, of ``wire`` type, skipped);
    -1 for a group (wire type 3: valid, an unknown field) or an invalid wire type."""
    if wire == 0:
        return _varint(view, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 5:
        return pos + 4
    if wire == 2:
        length, pos = _varint(view, pos)
        return pos + length
    return -1


def request_id(data: bytes | memoryview) -> str:
    """The ``id`` of a serialized ModelInferRequest ("" when it does not parse): for a
    failure's in-band answer on a stream, so parsed whole only then."""
    try:
        return str(pb.ModelInferRequest.FromString(bytes(data)).id)
    except (DecodeError, UnicodeDecodeError):
        return ""


def _string(view: memoryview, pos: int) -> tuple[str, int]:
    length, pos = _varint(view, pos)
    if pos + length > len(view):
        raise DecodeError("truncated string")
    return str(view[pos : pos + length], "utf-8"), pos + length


#: Messages up to this size are parsed whole by protobuf: copying their raw entries
#: costs less than walking the fields in Python (0.3 us against 3 us for two 64-byte inputs).
SMALL_MESSAGE: Final = 64 * 1024


def split_infer_request(data: bytes | memoryview) -> InferCall:
    """Parse a serialized ModelInferRequest, keeping ``raw_input_contents`` as views.

    Only the message's top-level fields are walked (a handful); everything but
    field 7 is re-joined and parsed by protobuf, field 7's entries stay views of
    ``data`` (which the views keep alive). A small message is parsed whole.
    """
    # NOTE: protobuf reads any buffer, a view of the received bytes too; its stub says bytes
    #   (Any, not a cast to bytes: compiled, that cast is checked).
    whole: Any = data
    if len(data) <= SMALL_MESSAGE:
        return _parsed_whole(whole)
    view = memoryview(data)
    raw: list[memoryview] = []
    spans: list[tuple[int, int]] = []
    rest: list[memoryview] = []
    pos = 0
    end = len(view)
    kept_from = 0
    while pos < end:
        start = pos
        key, pos = _varint(view, pos)
        if key == _RAW_KEY:
            length, pos = _varint(view, pos)
            if pos + length > end:
                raise DecodeError("truncated raw_input_contents entry")
            if kept_from < start:
                rest.append(view[kept_from:start])
            raw.append(view[pos : pos + length])
            spans.append((pos, length))
            kept_from = pos = pos + length
            continue
        pos = _skipped(view, pos, key & 7)
        if pos < 0:
            # NOTE: a group or an invalid wire type: protobuf reads the whole message, as a
            #   small one's (a group made only a large message a 400, found by fuzzing).
            return _parsed_whole(whole)
        if pos > end:
            raise DecodeError("truncated message")
    if not raw:
        return InferCall(pb.ModelInferRequest.FromString(whole), raw, spans)
    if kept_from < end:
        rest.append(view[kept_from:end])
    return InferCall(pb.ModelInferRequest.FromString(b"".join(rest)), raw, spans)


def _parsed_whole(data: Any) -> InferCall:
    """The message parsed whole by protobuf, its raw entries copied out of it."""
    message = pb.ModelInferRequest.FromString(data)
    return InferCall(message, list(message.raw_input_contents))


def parsing(message_type: Any, parse: Callable[[bytes], Any] | None = None) -> Callable[[Any], Any]:
    """``parse`` (protobuf's own by default) for one request message type, with a message
    that does not parse refused as the client's error: ``InvalidInput``, which gRPC answers
    INVALID_ARGUMENT, as REST answers 400 to a body that does not parse.

    NOTE: grpcio answers INTERNAL ("Exception deserializing request!") and logs it as a
    failure of its own; the bytes came from the client, so the status says so here.
    """
    read = parse or message_type.FromString
    name = message_type.DESCRIPTOR.full_name

    def parsed(data: Any) -> Any:
        try:
            return read(data)
        except DecodeError as exc:
            raise InvalidInput(f"the request message is not a valid {name}: {exc}") from None

    return parsed


#: A ModelInferRequest, unary or in a stream, read by ``split_infer_request``.
parse_infer_request = parsing(pb.ModelInferRequest, split_infer_request)


# ---- responses: raw_output_contents written once --------------------------------


class InferReply:
    """A ModelInferResponse whose raw outputs are still views of the worker's segment.

    ``serialize`` writes the wire bytes with one copy of each output (protobuf
    would take two: into a ``bytes`` entry, then into the serialized message)
    and releases the segment. If gRPC never serializes the reply (the call was
    cancelled), the segment is released when the reply is collected.
    """

    __slots__ = ("head", "result")

    def __init__(self, result: InferResult, request_id: str) -> None:
        self.result = result
        self.head = pb.ModelInferResponse(
            model_name=result.model.name, model_version=result.model.version, id=request_id
        )
        for tensor in result.outputs:
            entry = self.head.outputs.add(
                name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
            )
            if tensor.region is not None:
                # NOTE: its raw_output_contents entry stays (empty): tritonclient finds
                #   each output's entry by the output's position.
                for key, value in region_parameters_of(tensor).items():
                    if isinstance(value, str):
                        entry.parameters[key].string_param = value
                    else:
                        entry.parameters[key].int64_param = value

    def __del__(self) -> None:
        # PERF: a __del__ rather than weakref.finalize (0.8 us a reply); release is idempotent.
        self.result.release()

    @property
    def nbytes(self) -> int:
        """The outputs' bytes: what ``serialize`` copies."""
        return sum(len(tensor.data) for tensor in self.result.outputs)

    def serialize(self) -> bytes:
        try:
            return self.join()
        finally:
            self.result.release()

    def join(self) -> bytes:
        """The wire bytes, leaving the segment to the caller (``serialize`` releases it)."""
        return b"".join(self.parts())

    def parts(self) -> list[bytes | memoryview]:
        """The wire bytes in order, outputs as views of the worker's segment.

        Safe in another thread: it only reads the outputs. The release must happen on
        the event loop (it queues a message to the worker).
        """
        parts: list[bytes | memoryview] = [self.head.SerializeToString()]
        for tensor in self.result.outputs:
            parts += (_RAW_OUTPUT_TAG, varint_bytes(len(tensor.data)), tensor.data)
        return parts


#: Replies with this many output bytes or more are written out in a thread.
WRITE_IN_THREAD: Final = 4 * 1024 * 1024

Written = TypeVar("Written")


async def written_in_thread(reply: InferReply, write: Callable[[InferReply], Written]) -> Written:
    """``write(reply)`` in a thread; the reply's segment released on the loop afterwards.

    Copying a large reply's outputs holds the loop for as long as the copy takes when
    it runs there (~36 ms for 128 MB).
    """
    return await in_thread(partial(write, reply), reply.result.release, after_success=True)


def gathered(reply: InferReply) -> memoryview:
    """A large reply's wire bytes in memory of their own, copied without the GIL.

    The copies (numpy's, which let go of the GIL) leave the loop free to run while they
    go on in a thread; the memory (anonymous mmap) goes back to the system once the
    socket has taken it. The caller releases the reply's segment.
    """
    parts = [memoryview(part).cast("B") for part in reply.parts()]
    memory = memoryview(mmap.mmap(-1, sum(part.nbytes for part in parts)))
    offset = 0
    for part in parts:
        copy_into(memory, offset, part.nbytes, part)
        offset += part.nbytes
    return memory


async def wire_bytes(response: object, serialize: Callable[[Any], bytes]) -> bytes | memoryview:
    """A response's wire bytes: an ``InferReply`` of ``WRITE_IN_THREAD`` or more gathered
    in a thread into memory of its own (the caller unmaps it once it is sent:
    ``http_io.CorkedTransport.sent``, ``off_loop.unmap_off_loop``), anything else
    ``serialize``d."""
    if type(response) is InferReply and response.nbytes >= WRITE_IN_THREAD:
        return await written_in_thread(response, gathered)
    return serialize(response)


def serialize_infer(reply: InferReply | pb.ModelInferResponse | bytes) -> bytes:
    """The response serializer of ModelInfer: hand-written for ``InferReply``s; bytes are a
    reply serialized already (a large one, in a thread)."""
    if isinstance(reply, InferReply):
        return reply.serialize()
    if isinstance(reply, bytes):
        return reply
    return reply.SerializeToString()
