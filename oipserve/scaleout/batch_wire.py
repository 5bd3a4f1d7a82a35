"""What crosses the batch socket between a front and the primary (``batch_desk``, ``batch_link``).

With ``--http-workers N`` a model's batcher lives in the primary front alone, so that its
batches, queue limits and priorities (a sequence model's sequences and slots) form over
every client's connection, as in Triton's one process. Each other front (a replica)
checks a request of a batching model as it checks any, then sends it to the primary on a
socket of its own (a pair made when the replica starts; framed as the control socket is)
as an ``Enqueue``; the primary answers each with ``Answered`` or ``Refusal`` carrying its
``id``. A replica whose client went away sends ``Withdraw``. A request of a stream
(``Enqueue.parked``) is also told, ``SlotWait``, while it waits for a sequence slot.

The tensors cross as bytes in the messages, both ways: a replica's segments and the
worker's output segments stay private to the process that owns them, so nothing here
ties the lifetime of one process's memory to another's (docs/scaling.md, "Batches formed
across fronts", has the measurements and the cost for large tensors).
"""

from __future__ import annotations

import msgspec

from oipserve.wire.images import ImageSpec
from oipserve.wire.messages import ErrorKind

__all__ = [
    "Answered",
    "CrossingInput",
    "CrossingOutput",
    "Enqueue",
    "FromPrimary",
    "Refusal",
    "SlotWait",
    "ToPrimary",
    "Withdraw",
]


class CrossingInput(msgspec.Struct, frozen=True, array_like=True):
    """One checked input: its name, datatype and shape as the client sent them, the
    shape the model gets, its image spec (encoded images a worker decodes), its bytes."""

    name: str
    datatype: str
    shape: list[int]
    model_shape: list[int]
    image: ImageSpec | None
    data: memoryview


class Enqueue(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """A checked request of a batching model version for the primary's batcher (its
    dynamic batcher, or its sequence batcher: ``sequence_id`` set).

    ``serial`` is the version the replica checked it against (the primary refuses it,
    retryably, when its own version of that name and number is another). ``start_ns`` is
    ``monotonic_ns()`` at its arrival in the replica (the clock is the system's, the same
    in every process): its statistics count from there. ``seconds_left`` is what remains
    of its deadline.
    """

    id: int
    name: str
    version: str
    serial: int
    inputs: list[CrossingInput]
    outputs: list[str]
    priority: int
    timeout_us: int
    start_ns: int
    seconds_left: float
    #: A sequence model's request: its sequence (``SequenceTag``), None otherwise.
    sequence_id: int | str | None = None
    sequence_start: bool = False
    sequence_end: bool = False
    #: The replica wants ``SlotWait`` for it (``Inference.parked``: a stream's request).
    parked: bool = False


class Withdraw(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """The client of request ``id`` went away: leave the queue (or drop its answer)."""

    id: int


class CrossingOutput(msgspec.Struct, frozen=True, array_like=True):
    name: str
    datatype: str
    shape: list[int]
    data: memoryview


class Answered(msgspec.Struct, frozen=True, tag=True, array_like=True):
    id: int
    outputs: list[CrossingOutput]


class Refusal(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Request ``id`` failed: the kind and the message its client gets."""

    id: int
    kind: ErrorKind
    message: str


class SlotWait(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Request ``id`` started (``waiting``) or stopped waiting in the primary's backlog for
    a sequence slot, its inputs ``nbytes`` (``Inference.parked``; the stop comes before its
    answer)."""

    id: int
    waiting: bool
    nbytes: int


ToPrimary = Enqueue | Withdraw
FromPrimary = Answered | Refusal | SlotWait


def to_primary_decoder() -> msgspec.msgpack.Decoder[ToPrimary]:
    return msgspec.msgpack.Decoder(ToPrimary)


def from_primary_decoder() -> msgspec.msgpack.Decoder[FromPrimary]:
    return msgspec.msgpack.Decoder(FromPrimary)
