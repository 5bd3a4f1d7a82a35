"""``--http-workers``: which requests another front answers, and which versions it is given."""

from __future__ import annotations

import asyncio
import os

import pytest

from oipserve.config.settings import Settings
from oipserve.models.config.parse import ModelConfig
from oipserve.models.registry import ModelRegistry, ModelVersion
from oipserve.pool.handle import WorkerHandle
from oipserve.pool.link import AWAY, WorkerLink, away
from oipserve.pool.worker_pool import WorkerPool
from oipserve.runtime.workerproc import WorkerOptions
from oipserve.scaleout.control import CollectStats
from oipserve.scaleout.primary import Replica, Replicas, snapshot
from oipserve.scaleout.process import Router
from oipserve.scheduling.policy import BatchPolicy
from oipserve.wire.messages import LoadModel

LIMIT = 1024


async def _local(scope: dict, receive: object, send: object) -> None:
    scope["answered"] = "here"


async def _forward(scope: dict, receive: object, send: object) -> None:
    scope["answered"] = "primary"


async def _where(router: Router, method: str, path: str, length: int | None = None) -> str:
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    await router(scope, None, None)
    return scope["answered"]


@pytest.mark.parametrize(
    ("method", "path", "where"),
    [
        ("POST", "/v2/models/simple/infer", "here"),
        ("POST", "/v2/models/simple/infer/", "here"),
        ("POST", "/v2/models/simple/versions/1/infer", "here"),
        ("POST", "/v2/models/simple/versions/2/infer", "primary"),  # not given here
        ("POST", "/v2/models/other/infer", "primary"),
        ("GET", "/v2/models/simple/infer", "primary"),
        ("GET", "/v2/health/live", "here"),
        ("GET", "/v2/health/ready", "primary"),
        ("GET", "/v2/models/simple", "primary"),
        ("GET", "/v2/models/simple/stats", "primary"),
        ("POST", "/v2/repository/models/simple/load", "primary"),
        ("POST", "/v2/systemsharedmemory/region/r/register", "primary"),
        ("POST", "/v3/models/simple/infer", "primary"),
    ],
)
async def test_the_router_answers_only_inference_it_was_given(
    method: str, path: str, where: str
) -> None:
    router = Router(_local, _forward, LIMIT)
    router.versions = {"simple": frozenset({"1"})}
    assert await _where(router, method, path) == where


async def test_a_body_over_the_limit_is_refused_here_whatever_the_route() -> None:
    router = Router(_local, _forward, LIMIT)
    assert await _where(router, "POST", "/v2/repository/models/m/load", LIMIT + 1) == "here"
    assert await _where(router, "POST", "/v2/repository/models/m/load", LIMIT) == "primary"


def _version(registry: ModelRegistry, name: str, worker: WorkerHandle, **config: object) -> None:
    model = ModelVersion(name, "1", f"/models/{name}/1/model.onnx", ModelConfig(**config))
    model.state = "READY"
    model.repository = True
    model.workers = [worker]
    worker.models[model.key] = LoadModel(0, model.key, model.path, 1, [])
    registry.models[name] = {"1": model}


def test_a_snapshot_holds_ready_repository_versions() -> None:
    pool = WorkerPool(os.getpid(), WorkerOptions("info"), fronts=2)
    worker = WorkerHandle(1, "cpu", 1, f"{pool.prefix}w1-", accepts_fronts=True)
    worker.alive = True
    worker.front_address = "\0somewhere"
    pool.workers.append(worker)
    registry = ModelRegistry()
    _version(registry, "plain", worker)
    _version(registry, "batched", worker, dynamic_batching=BatchPolicy(max_batch_size=8))
    _version(registry, "loading", worker)
    registry.models["loading"]["1"].state = "LOADING"
    _version(registry, "endpoint", worker)
    registry.models["endpoint"]["1"].repository = False
    taken = snapshot(7, registry, pool)
    assert taken.seq == 7
    assert [(w.worker_id, w.address) for w in taken.workers] == [(1, "\0somewhere")]
    assert sorted(v.name for v in taken.versions) == ["batched", "plain"]
    (plain,) = [v for v in taken.versions if v.name == "plain"]
    assert plain.serial == registry.models["plain"]["1"].serial
    assert list(plain.sessions) == [1]
    # A worker the other fronts cannot reach (dead, or no listener) holds nothing for them.
    worker.alive = False
    assert snapshot(8, registry, pool).versions == []


def test_each_front_has_its_own_workers_round_robin() -> None:
    assert [away(w, 0, 2) for w in (1, 2, 3, 4)] == [0, AWAY, 0, AWAY]
    assert [away(w, 1, 2) for w in (1, 2, 3, 4)] == [AWAY, 0, AWAY, 0]
    assert [away(w, 0, 1) for w in (1, 2, 3)] == [0, 0, 0]  # one front: every worker
    # More fronts than workers: the fronts past the last worker have none of their own,
    # and so share every worker alike.
    assert [away(1, f, 3) for f in (0, 1, 2)] == [0, AWAY, AWAY]


def test_a_front_keeps_to_its_own_worker_until_it_is_away_requests_behind() -> None:
    model = ModelVersion("m", "1", "", None)
    own, other = WorkerLink(1, "cpu", "p-w1-"), WorkerLink(2, "cpu", "p-w2-")
    other.away = AWAY
    for link in (own, other):
        link.alive = True
        link.models[model.key] = LoadModel(0, model.key, "", 1, [])
    model.workers = [other, own]
    picked = []
    for rid in range(AWAY + 3):
        worker = model.pick(256)
        worker.pending[rid] = None  # type: ignore[assignment]  # in flight from now on
        picked.append(worker.worker_id)
    assert picked[:AWAY] == [1] * AWAY  # its own, although the other is idle
    assert set(picked[AWAY:]) == {1, 2}  # then the least loaded, counting AWAY


class _SilentControl:
    """The primary's end of a control socket whose replica never answers."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, message: object) -> None:
        self.sent.append(message)


class _Process:
    pid = 4242

    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


def _one_silent_replica() -> tuple[Replicas, Replica, _SilentControl]:
    """The primary's view of one other front, whose control socket is never answered."""
    replicas = Replicas(
        Settings(model_repository=".", http_workers=2),
        ModelRegistry(),
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        "\0test",
    )
    replica = Replica(1, _Process(), "prefix")  # type: ignore[arg-type]
    control = _SilentControl()
    replica.control = control  # type: ignore[assignment]
    replicas.running.append(replica)
    return replicas, replica, control


async def test_a_draining_replica_is_not_asked_to_follow_a_change() -> None:
    """At shutdown the other fronts drain first and stop following the primary. A load or
    unload still running asked them anyway: it waited ``patience`` (30 s) for an answer,
    then killed them as out of step, and its own client was cut off."""
    replicas, replica, control = _one_silent_replica()
    replica.draining = True
    assert await replicas.ask_all(CollectStats, patience=0.2) == []
    assert control.sent == [] and not replica.process.killed  # type: ignore[attr-defined]

    # A replica that is not draining and stays silent is asked, then killed (replaced).
    replica.draining = False
    assert await replicas.ask_all(CollectStats, patience=0.2) == []
    assert len(control.sent) == 1 and replica.process.killed  # type: ignore[attr-defined]


async def test_a_replica_whose_socket_closed_is_not_waited_for() -> None:
    """Its control socket closes when it dies, before the supervisor takes it out of
    ``running``. An ask in between waited its whole patience (30 s), then killed ("replaced")
    a process that was already gone; the load or unload behind it hung meanwhile."""
    replicas, replica, _ = _one_silent_replica()
    replica.on_closed()  # the socket closed; the process exit is not seen yet
    assert await asyncio.wait_for(replicas.ask_all(CollectStats, patience=30), 1) == []
    assert not replica.process.killed  # type: ignore[attr-defined]
