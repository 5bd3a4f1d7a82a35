"""Messages between the front and a worker process.

Small frozen msgspec Structs, msgpack-encoded, one tagged union each way.
They describe tensors (segment name, offset, size, dtype, shape) and never
carry tensor bytes. Frames on the socket are a 4-byte little-endian length
followed by the msgpack body (``oipserve.wire.framing``: ``frame`` writes them on both
sides and ``FrameSplitter`` reads them on both sides).

A failure crosses the boundary as an ``ErrorKind`` and a message: the worker
says what went wrong, never which HTTP status or gRPC code it becomes (that
mapping lives in ``oipserve.errors`` alone).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, Literal

import msgspec

from oipserve.wire.datatypes import DATATYPES
from oipserve.wire.images import ImageSpec

if TYPE_CHECKING:
    DatatypeName = str
else:
    #: A tensor's datatype as ``TensorDesc`` carries it: to msgspec one of ``DATATYPES``.
    #: PERF: msgspec decodes a Literal as its own str, where a ``str`` field is a new str
    #:   per tensor each way. mypy sees ``str``; a name not in ``DATATYPES`` is refused by
    #:   the decoder, and neither side sends one (a model with another type does not load).
    DatatypeName = Literal[tuple(DATATYPES)]


class ErrorKind(enum.StrEnum):
    """What kind of failure a request met, independent of any wire protocol."""

    #: The request (its values, its images, the model file it names) cannot be served.
    INVALID_INPUT = "invalid_input"
    NOT_FOUND = "not_found"
    #: A name that is already taken (a shared-memory region registered twice).
    ALREADY_EXISTS = "already_exists"
    #: A restricted API asked for without its header (``oipserve.config.access``); front only.
    FORBIDDEN = "forbidden"
    TOO_LARGE = "too_large"
    UNSUPPORTED = "unsupported"
    #: Retryable: not ready, overloaded, out of shared memory, a worker stopped.
    UNAVAILABLE = "unavailable"
    #: The request did not finish within its deadline.
    DEADLINE_EXCEEDED = "deadline_exceeded"
    #: A fault of the server or the model; clients get a generic message.
    INTERNAL = "internal"
    #: INVALID_INPUT in Triton's core words, which put the request's id first: a worker
    #: does not know it, the front that does adds it (``errors.RequestRefusal``).
    REFUSED = "refused"


class TensorMeta(msgspec.Struct, frozen=True, array_like=True):
    name: str
    datatype: str
    shape: list[int]


class ObjectRef(msgspec.Struct, frozen=True, array_like=True):
    """A client's own POSIX shared-memory object (the system shared-memory extension).

    ``name`` is its name in /dev/shm; ``dev`` and ``ino`` are what the front found when
    the region was registered: a worker uses the object only while its name still
    leads to that same file.
    """

    name: str
    dev: int
    ino: int


class TensorDesc(msgspec.Struct, frozen=True, array_like=True):
    """Where one tensor's bytes lie in shared memory.

    In one of the server's segments (``segment``), or, when ``region`` is set, in a
    client's object (``segment`` is empty; ``offset`` is from the object's start).
    """

    name: str
    datatype: DatatypeName
    shape: list[int]
    segment: str
    offset: int
    nbytes: int
    #: Set for an image input: the bytes are length-prefixed encoded images to decode.
    image: ImageSpec | None = None
    region: ObjectRef | None = None
    #: Set on an output the worker printed as the JSON text of its ``data`` (a flat
    #: array), for a response the front writes as JSON (``Infer.text_outputs``).
    text: bool = False


class OutputTarget(msgspec.Struct, frozen=True, array_like=True):
    """An output the worker writes into a client's object instead of its own segment."""

    name: str
    region: ObjectRef
    #: From the object's start; ``nbytes`` is the room the client gave.
    offset: int
    nbytes: int
    #: The output's shape as the model makes it, when the front knows it before the
    #: run (ONNX Runtime then writes straight into the region); None otherwise.
    shape: list[int] | None = None


# ---- front -> worker -------------------------------------------------------

#: Outputs of this many bytes or more that a client gets as JSON are printed by the
#: worker (about 1.5 ms of orjson's time in the front at this size, growing with it).
TEXT_OUTPUT_MIN: Final = 256 * 1024


class LoadModel(msgspec.Struct, frozen=True, tag=True, array_like=True):
    rid: int
    key: str
    path: str
    intra_op_threads: int
    #: ONNX Runtime providers in order of preference, each with its options.
    providers: list[tuple[str, dict[str, str]]]
    #: Triton's session parameters from config.pbtxt (oipserve/models/config/session_options.py),
    #: by the keys of oipserve/wire/session_keys.py.
    session_options: dict[str, str] = {}


class UnloadModel(msgspec.Struct, frozen=True, tag=True, array_like=True):
    rid: int
    key: str


class SequenceState(msgspec.Struct, frozen=True, array_like=True):
    """One implicit state of a sequence model (config.pbtxt ``sequence_batching.state``)."""

    input_name: str
    output_name: str
    datatype: str
    #: The state's shape at a sequence's start, without the batch dimension.
    shape: list[int]
    #: Its data at a sequence's start (``initial_state`` data_file); empty: zeros.
    initial: bytes = b""


class SequenceRows(msgspec.Struct, frozen=True, array_like=True):
    """The sequences of a sequence model's batch, one per row (``Infer.sequence``).

    The worker keeps each sequence's implicit state (``workers.sequence_state``): fed
    to the row's state inputs, replaced by its state outputs, reset on ``starts``,
    freed on ``ends`` (``EndSequences`` frees those that went idle).
    """

    states: list[SequenceState]
    #: Per row: the front's handle of its sequence; 0 for an empty slot (READY false).
    handles: list[int]
    starts: list[bool]
    ends: list[bool]
    #: The model has a batch dimension (a state is [1, *shape] per row).
    batched: bool = True


class ChainStep(msgspec.Struct, frozen=True, array_like=True):
    """One step of an ensemble chain the worker runs alone (``Infer.chain``, workers.chains).

    Tensors are named by the ensemble's tensor names: the first step reads ``Infer.inputs``
    (``inputs`` is empty for it), each later one reads outputs of earlier steps, kept
    in the worker's memory.
    """

    key: str
    #: Model input name -> ensemble tensor an earlier step of the chain made.
    inputs: dict[str, str]
    #: Model output name -> ensemble tensor, for every output the step computes.
    outputs: dict[str, str]
    #: Ensemble tensors of this step written into the output segment (the front needs them).
    written: list[str]


class Infer(msgspec.Struct, frozen=True, tag=True, array_like=True):
    rid: int
    key: str
    inputs: list[TensorDesc]
    #: Output names to compute, in the order wanted; empty means all.
    outputs: list[str]
    #: Outputs to write into clients' shared memory (system shared-memory extension).
    targets: list[OutputTarget] = []
    #: Outputs the client gets as JSON: the worker prints those of ``TEXT_OUTPUT_MIN``
    #: bytes or more as JSON text (``TensorDesc.text``), so the front does not.
    text_outputs: list[str] = []
    #: A sequence model's batch: the sequences of its rows (implicit state).
    sequence: SequenceRows | None = None
    #: An ensemble chain (workers.chains): every step, the first one ``key``'s; empty: none.
    chain: list[ChainStep] = []
    #: The front had no other request in flight when it sent this one: light load, when
    #: the worker does not poll for its next request (``workers.busy_poll``) and may run
    #: on the front's CPU (``workers.colocation``).
    light: bool = False
    #: When the front stops waiting for the answer, on the clock every process of the
    #: machine shares (``time.monotonic_ns``): a worker that comes to the request too late
    #: to end a run by then answers DEADLINE_EXCEEDED without running it (``workers.late``).
    #: 0: no deadline (a batch, whose
    #: requests fail one by one in the front; a sequence's step, which must run).
    expires: int = 0


class ParseJson(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Check a large JSON inference request body and say where its ``data`` texts lie.

    The body is ``nbytes`` at ``offset`` in the front's ``segment``; the reply is
    ``JsonParsed`` (``oipserve.request.json_offload``).
    """

    rid: int
    segment: str
    offset: int
    nbytes: int


class JsonText(msgspec.Struct, frozen=True, array_like=True):
    """One input's JSON ``data`` text, to decode into a tensor the front placed."""

    name: str
    datatype: str
    #: Elements the input's shape holds: the decoded data must have exactly these.
    count: int
    segment: str
    offset: int
    nbytes: int
    #: Where the decoded tensor goes: ``count`` elements at ``target_offset`` of
    #: the front's segment ``target``.
    target: str
    target_offset: int


class DecodeJson(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Decode JSON ``data`` texts into tensors; the reply is ``JsonDecoded`` or ``Failed``."""

    rid: int
    texts: list[JsonText]


class Release(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """The front no longer reads these output segments; the worker may reuse them."""

    segments: list[str]


class Forget(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """The front unlinked these input segments; the worker should unmap them."""

    segments: list[str]


class ForgetRegions(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Clients unregistered regions of these objects; the worker should unmap them."""

    objects: list[ObjectRef]


class EndSequences(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """These sequences of model ``key`` ended without an END request (idle, restarted):
    the worker frees their implicit state."""

    key: str
    handles: list[int]


class Stop(msgspec.Struct, frozen=True, tag=True, array_like=True):
    pass


ToWorker = (
    LoadModel
    | UnloadModel
    | Infer
    | ParseJson
    | DecodeJson
    | Release
    | Forget
    | ForgetRegions
    | EndSequences
    | Stop
)


# ---- worker -> front -------------------------------------------------------


class WorkerReady(msgspec.Struct, frozen=True, tag=True, array_like=True):
    pid: int
    onnxruntime_version: str


class Loaded(msgspec.Struct, frozen=True, tag=True, array_like=True):
    rid: int
    key: str
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]
    #: Providers the session really uses, first is the one that runs the graph.
    providers: list[str]
    #: Graph inputs with an initializer (a default value): a request may omit them.
    optional_inputs: list[TensorMeta] = []
    #: The session's graph optimization level, as ONNX Runtime names it
    #: (``ORT_ENABLE_ALL``, its default; config.pbtxt ``optimization.graph.level``).
    graph_optimization_level: str = ""


class Unloaded(msgspec.Struct, frozen=True, tag=True, array_like=True):
    rid: int
    key: str


class StepTimes(msgspec.Struct, frozen=True, array_like=True):
    """One step of an ensemble chain as it ran in the worker (``InferDone.steps``)."""

    started_ns: int
    input_ns: int
    infer_ns: int
    output_ns: int
    #: The leading dim of its first input (its batch size when its model batches).
    rows: int


class InferDone(msgspec.Struct, frozen=True, tag=True, array_like=True):
    rid: int
    #: The output segment lent to the front until it sends Release.
    segment: str
    outputs: list[TensorDesc]
    #: Output segments the worker unlinked since its last reply.
    dropped: list[str]
    #: ``time.monotonic_ns()`` when the worker began this request (the clock is
    #: system-wide on Linux, so the front subtracts its own send time: queue time).
    started_ns: int = 0
    #: Phase times: building the feeds from shared memory (image decoding included),
    #: ``session.run``, and copying the outputs into the output segment.
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    #: An ensemble chain's steps (``Infer.chain``), in order; empty otherwise.
    steps: list[StepTimes] = []
    #: The CPU the worker runs on, pinned there beside its front at light load
    #: (``workers.colocation``); -1 when not pinned. The front's loop thread then pins
    #: itself there too (``oipserve.runtime.colocation``).
    colocated_cpu: int = -1


class JsonParsed(msgspec.Struct, frozen=True, tag=True, array_like=True):
    rid: int
    #: Per input, in the request's order: (offset from the body's start, length) of
    #: its ``data`` text; (0, 0) when it has none.
    spans: list[tuple[int, int]]


class JsonDecoded(msgspec.Struct, frozen=True, tag=True, array_like=True):
    rid: int


class Failed(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """A request failed; ``message`` is for the client (generic for INTERNAL)."""

    rid: int
    kind: ErrorKind
    message: str
    #: An ensemble chain: the steps that ran before the one that failed (``Infer.chain``).
    steps: list[StepTimes] = []
    #: As ``InferDone.dropped``: output segments unlinked since the last reply. A failure
    #: for want of shared memory drops the worker's idle ones, and the front's mappings of
    #: them must go for the memory to be freed (found by fuzzing).
    dropped: list[str] = []


FromWorker = WorkerReady | Loaded | Unloaded | InferDone | JsonParsed | JsonDecoded | Failed
#: The replies that answer a request the front made with ``WorkerHandle.call``, InferDone
#: first. PERF: a tuple, not a union: isinstance of a union, or of a msgspec Struct class
#: that is not the object's own type, looks up ``__instancecheck__`` (a bound method a
#: call); an object of a tuple's first class matches on its type alone.
REPLIES: Final = (InferDone, Failed, JsonParsed, JsonDecoded, Loaded, Unloaded)
