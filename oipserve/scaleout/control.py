"""The control socket between the primary front and one other HTTP front (a replica).

One Unix stream socket pair per replica, framed like the workers' sockets
(``oipserve.wire.messages.frame``: a length, then msgpack). The primary sends
requests, each with a ``seq``; the replica answers each with ``Done``, ``StatsRows``
or ``Refused`` carrying the same ``seq``. Only ``Listening`` comes unasked, once,
when the replica serves the HTTP port. Nothing here is on an inference's path: the
replica talks to the workers on sockets of its own (``oipserve.pool.link``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar, cast

import msgspec

from oipserve.models.config.parse import ModelConfig
from oipserve.models.metadata import TensorSpec
from oipserve.telemetry.stats import StatsRow
from oipserve.wire.messages import ErrorKind, FrameSplitter, LoadModel, frame

# ---- what a replica is told ------------------------------------------------------------


class WorkerCopy(msgspec.Struct, frozen=True, array_like=True):
    """A worker a replica connects to: where (``WorkerHandle.front_address``) and who."""

    worker_id: int
    device: str
    segment_prefix: str
    address: str


class VersionCopy(msgspec.Struct, frozen=True, array_like=True):
    """A model version a replica answers itself, as the primary's registry has it."""

    name: str
    version: str
    serial: int
    key: str
    path: str
    config: ModelConfig | None
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    echo: bool
    #: The workers holding a session for it, and how it was loaded on each.
    sessions: dict[int, LoadModel]


class Snapshot(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """The workers and the versions answered locally, replacing the last snapshot.

    Versions keep their statistics across snapshots (same serial, same object); a
    version no longer listed is forwarded from then on.
    """

    seq: int
    workers: list[WorkerCopy]
    versions: list[VersionCopy]


class Start(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Serve the HTTP port (``reuse_port`` is always set: the primary holds it too), hand
    what is not answered locally to ``forward_to``; segments under ``segment_prefix``.
    The same for gRPC on ``grpc_port`` (0: none) and ``grpc_forward_to``."""

    seq: int
    #: This front's number, 1 to N-1 (the primary is 0): which workers are its own.
    index: int
    port: int
    forward_to: str
    grpc_port: int
    grpc_forward_to: str
    segment_prefix: str
    #: The prefix every segment of this server has (own objects clients cannot register).
    server_prefix: str
    settings: bytes
    snapshot: Snapshot


class Retire(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Stop answering version ``serial`` (forward its requests) and say ``Done`` once the
    requests already sent to its workers are answered: its sessions are unloaded next."""

    seq: int
    serial: int
    why: str


class CollectStats(msgspec.Struct, frozen=True, tag=True, array_like=True):
    seq: int


class RegionAdded(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """A client registered a system shared-memory region with the primary: register it too."""

    seq: int
    name: str
    key: str
    offset: int
    byte_size: int


class RegionsRemoved(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Unregister ``name`` (every region when None) as the primary does (deferred while
    requests use it); answered at once with ``RegionsBusy``."""

    seq: int
    name: str | None


class RegionsIdle(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """``Done`` once no request here uses any of the unregistered regions ``names``
    (answered whenever that is: the replica goes on following meanwhile)."""

    seq: int
    names: list[str]


class Drain(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Stop accepting connections, answer what was received (within ``timeout``), exit."""

    seq: int
    timeout: float


ToReplica = (
    Start | Snapshot | Retire | CollectStats | RegionAdded | RegionsRemoved | RegionsIdle | Drain
)

# ---- what a replica answers ------------------------------------------------------------


class Listening(msgspec.Struct, frozen=True, tag=True, array_like=True):
    seq: int
    pid: int


class Done(msgspec.Struct, frozen=True, tag=True, array_like=True):
    seq: int


class StatsRows(msgspec.Struct, frozen=True, tag=True, array_like=True):
    seq: int
    rows: list[StatsRow]


class RegionsBusy(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """The answer to ``RegionsRemoved``: the unregistered regions requests here still use."""

    seq: int
    names: list[str]


class Refused(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """The request could not be carried out: ``message`` says why, ``kind`` is the error's
    (``oipserve.errors``) when it was the client's or the server's on purpose."""

    seq: int
    message: str
    kind: ErrorKind = ErrorKind.INTERNAL


FromReplica = Listening | Done | StatsRows | RegionsBusy | Refused

_ENCODER = msgspec.msgpack.Encoder()


#: What a control socket's end receives: ``ToReplica`` in a replica, ``FromReplica`` in the
#: primary.
Incoming = TypeVar("Incoming")


class ControlProtocol(asyncio.Protocol, Generic[Incoming]):
    """Either end of a control socket: frames in to ``on_message``, ``send`` out."""

    def __init__(
        self,
        decoder: msgspec.msgpack.Decoder[Incoming],
        on_message: Callable[[Incoming], None],
        on_closed: Callable[[], None],
    ) -> None:
        self._decoder = decoder
        self._on_message = on_message
        self._on_closed = on_closed
        self._splitter = FrameSplitter()
        self.transport: asyncio.Transport | None = None
        #: Frames sent during this turn of the loop, written together at its end.
        self._outgoing: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (asyncio types the hook for every protocol; a stream's transport is a Transport)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        for body in self._splitter.feed(data):
            self._on_message(self._decoder.decode(body))

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_closed()

    def send(self, message: object) -> None:
        """Queue ``message``; what is sent during one turn of the loop goes in one write.

        PERF: the batch sockets carry a message per request each way. Written one by one,
        each write woke the other end once, and the primary's batcher took the requests
        of one turn of a replica's loop in as many turns of its own, forming smaller
        batches (``docs/scaling.md``, "Batches formed across fronts").
        """
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(frame(_ENCODER, message))

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(b"".join(outgoing) if len(outgoing) > 1 else outgoing[0])


def to_replica_decoder() -> msgspec.msgpack.Decoder[ToReplica]:
    return msgspec.msgpack.Decoder(ToReplica)


def from_replica_decoder() -> msgspec.msgpack.Decoder[FromReplica]:
    return msgspec.msgpack.Decoder(FromReplica)
