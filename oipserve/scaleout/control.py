"""The control socket between the primary front and one other HTTP front (a replica).

One Unix stream socket pair per replica, framed like the workers' sockets
(``oipserve.wire.framing.frame``: a length, then msgpack). The primary sends
requests, each with a ``seq``; the replica answers each with ``Done``, ``StatsRows``
or ``Refused`` carrying the same ``seq``. Only ``Listening`` comes unasked, once,
when the replica serves the HTTP port. Nothing here is on an inference's path: the
replica talks to the workers on sockets of its own (``oipserve.pool.link``), and to the
primary's batchers on its batch socket (``batch_wire``). Either end is a
``framed.FramedProtocol``.
"""

from __future__ import annotations

import msgspec

from oipserve.models.config.parse import ModelConfig
from oipserve.models.metadata import TensorSpec
from oipserve.telemetry.stats_row import StatsRow
from oipserve.wire.messages import ErrorKind, LoadModel

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


class RegionSpec(msgspec.Struct, frozen=True, array_like=True):
    """A client's system shared-memory region as it was registered."""

    name: str
    key: str
    offset: int
    byte_size: int


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
    #: Clients' regions registered so far (later ones come as ``RegionAdded``): a front
    #: started to replace one that died knew none of them (found by fuzzing).
    regions: list[RegionSpec]


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


def to_replica_decoder() -> msgspec.msgpack.Decoder[ToReplica]:
    return msgspec.msgpack.Decoder(ToReplica)


def from_replica_decoder() -> msgspec.msgpack.Decoder[FromReplica]:
    return msgspec.msgpack.Decoder(FromReplica)
