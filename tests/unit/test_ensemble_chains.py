"""Ensemble chains: which steps the front sends as one Infer, and how a worker runs them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from time import monotonic_ns
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from oipserve.dataplane.dispatch import Dispatch
from oipserve.dataplane.ensemble_chains import _send as chain_send
from oipserve.dataplane.ensemble_chains import plan_chains
from oipserve.models.config.ensemble import EnsembleConfig
from oipserve.models.config.parse import parse_model_config
from oipserve.models.ensemble import chain_runs
from oipserve.models.metadata import TensorSpec
from oipserve.models.registry import ModelVersion
from oipserve.wire.messages import ChainStep, ErrorKind, Failed, Infer, InferDone, StepTimes
from oipserve.wire.shm import SegmentCache
from tests.support.ensemble_models import CONFIGS, ensemble_config, write_step
from tests.support.worker_links import LinkToNoWorker
from tests.support.worker_replies import only_reply, paired_worker
from workers import runtime
from workers.worker import Worker

_X = [("X", "TYPE_FP32", "[ -1 ]")]
_Y = [("Y", "TYPE_FP32", "[ -1 ]")]


def _plan(text: str) -> EnsembleConfig:
    config = parse_model_config(text)
    if config.ensemble is None:
        raise ValueError("not an ensemble")
    return config.ensemble


def _version(name: str) -> ModelVersion:
    model = ModelVersion(name, "1", "", None)
    spec = ("FP32", (-1, -1))
    names = ("A", "B") if name == "plus" else ("IN",)
    model.set_metadata(tuple(TensorSpec(n, *spec) for n in names), (TensorSpec("OUT", *spec),))
    return model


def _composing(plan: EnsembleConfig) -> tuple[ModelVersion, ...]:
    versions: dict[str, ModelVersion] = {}
    return tuple(versions.setdefault(s.model_name, _version(s.model_name)) for s in plan.steps)


def test_a_linear_chain_is_one_run_and_a_diamond_none() -> None:
    assert chain_runs(_plan(CONFIGS["chain"])) == ((0, 1),)
    assert chain_runs(_plan(CONFIGS["chain3"])) == ((0, 1, 2),)
    # The diamond's first steps have other readers / its join reads two steps: its
    # branches keep running at once.
    assert chain_runs(_plan(CONFIGS["diamond"])) == ()


def test_only_the_tensors_the_front_needs_are_written() -> None:
    """x1 only feeds the next step: kept in the worker; x2 is also an ensemble output."""
    text = ensemble_config(
        "e",
        [
            ("add_one", {"IN": "X"}, {"OUT": "x1"}),
            ("double", {"IN": "x1"}, {"OUT": "x2"}),
            ("preprocess", {"IN": "x2"}, {"OUT": "Y"}),
        ],
        _X,
        [*_Y, ("x2", "TYPE_FP32", "[ -1 ]")],
    )
    plan = _plan(text)
    chains = plan_chains(
        plan, chain_runs(plan), _composing(plan), frozenset({"Y", "x2"}), lambda _: True
    )
    (chain,) = chains.heads.values()
    assert chain.steps == (0, 1, 2)
    assert [m.written for m in chain.messages] == [[], ["x2"], ["Y"]]
    assert [m.inputs for m in chain.messages] == [{}, {"IN": "x1"}, {"IN": "x2"}]
    assert chain.keys == ("add_one/1", "double/1", "preprocess/1")


def test_a_model_that_does_not_run_alone_cuts_the_chain() -> None:
    """A batched (or cached, or sequence) model is never chained: its own strategy runs
    its step, so its batcher can join the steps of many requests."""
    plan = _plan(CONFIGS["chain3"])
    composing = _composing(plan)
    middle = composing[1]
    cut = plan_chains(
        plan, chain_runs(plan), composing, frozenset({"Y"}), lambda m: m is not middle
    )
    assert cut.heads == {}
    last = composing[2]
    head = plan_chains(plan, chain_runs(plan), composing, frozenset({"Y"}), lambda m: m is not last)
    assert [c.steps for c in head.heads.values()] == [(0, 1)]
    assert head.heads[0].messages[1].written == ["x2"]  # read by the step outside the chain


class _Fed(Worker):
    """A worker whose chain's first step is fed ``feeding`` (the test's arrays) instead of
    its inputs' bytes; ``fed``: each call's arguments. (A subclass: the compiled ``Worker``
    takes no attribute set on an instance.)"""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.feeding: dict[str, object] = {}
        self.fed: list[object] = []

    def feeds(self, *args: Any) -> dict[str, object]:
        self.fed.append(args)
        return self.feeding


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[_Fed]:
    with paired_worker("oipserve-test-chains-", _Fed) as worker:
        assert isinstance(worker, _Fed)
        for name in ("add_one", "double"):
            write_step(tmp_path, name)
            path = str(tmp_path / name / "1" / "model.onnx")
            worker.sessions[f"{name}/1"] = runtime.ModelSession(path, 1, [])
        yield worker


_CHAIN = [
    ChainStep("add_one/1", {}, {"OUT": "x1"}, []),
    ChainStep("double/1", {"IN": "x1"}, {"OUT": "Y"}, ["Y"]),
]


def test_a_worker_runs_a_chain_in_one_reply(worker: _Fed) -> None:
    """One Infer, one InferDone: the intermediate never reaches the output segment, the
    answer is the steps' bit for bit, and each step has its times."""
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    worker.feeding = {"IN": x}
    worker.handle(Infer(5, "add_one/1", [], ["OUT"], chain=_CHAIN), worker.starter)
    done = only_reply(worker)
    assert isinstance(done, InferDone) and done.rid == 5
    assert [d.name for d in done.outputs] == ["Y"]
    (desc,) = done.outputs
    segments = SegmentCache()
    data = segments.get(done.segment).buf[desc.offset : desc.offset + desc.nbytes]
    y = np.frombuffer(data, np.float32).reshape(desc.shape).copy()
    del data
    segments.forget(done.segment)
    np.testing.assert_array_equal(y, (x + np.float32(1)) * np.float32(2))
    assert [s.rows for s in done.steps] == [4, 4]
    assert all(s.infer_ns > 0 for s in done.steps)


def test_a_failing_step_says_which_steps_ran(worker: _Fed) -> None:
    worker.feeding = {"IN": np.ones((1, 2), np.float32)}
    del worker.sessions["double/1"]
    worker.handle(Infer(6, "add_one/1", [], ["OUT"], chain=_CHAIN), worker.starter)
    failed = only_reply(worker)
    assert isinstance(failed, Failed)
    assert failed.kind is ErrorKind.UNAVAILABLE
    assert failed.message == "model 'double/1' is not loaded here"
    assert len(failed.steps) == 1  # the first step ran: the second is the one that failed


def test_a_chain_past_its_deadline_runs_no_step(worker: _Fed) -> None:
    """A chain the worker comes to after its deadline (``workers.late``) is answered
    DEADLINE_EXCEEDED before its first step, which the front counts as the first's."""
    chain = Infer(7, "add_one/1", [], ["OUT"], chain=_CHAIN, expires=monotonic_ns() - 1)
    worker.handle(chain, worker.starter)
    failed = only_reply(worker)
    assert isinstance(failed, Failed) and failed.kind is ErrorKind.DEADLINE_EXCEEDED
    assert failed.steps == [] and worker.fed == []


async def test_a_chain_goes_to_its_worker_with_its_deadline() -> None:
    """The front's side: a chain's ``Infer`` carries the request's deadline as the worker
    reads it (``WorkerLink.expires``)."""
    link = LinkToNoWorker()
    request = SimpleNamespace(owned=[], model=ModelVersion("add_one", "1", "", None))
    chain = SimpleNamespace(outputs=["Y"], messages=_CHAIN, steps=_CHAIN)
    before = monotonic_ns()
    deadline = asyncio.get_running_loop().time() + 5.0
    sending = asyncio.ensure_future(
        chain_send(Dispatch(SegmentCache(), 8), link.link, request, chain, [], deadline)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0)  # sent; waiting for the reply
    (rid,) = link.link.pending
    link.link.on_message(Failed(rid, ErrorKind.DEADLINE_EXCEEDED, "late"))
    assert isinstance(await sending, Failed)
    (infer,) = [m for m in link.sent() if isinstance(m, Infer)]
    # NOTE: 5 s from now on the workers' clock (the loop's time is coarser: a tenth off)
    assert infer.chain == _CHAIN and infer.expires is not None
    assert before + 4_900_000_000 <= infer.expires <= monotonic_ns() + 5_100_000_000


class _Mappings(SegmentCache):
    """The front's mappings of output segments, with what it let go of kept."""

    def __init__(self) -> None:
        super().__init__()
        self.forgotten: list[str] = []

    def forget(self, name: str) -> None:
        self.forgotten.append(name)
        super().forget(name)


async def test_a_chain_s_reply_lets_go_of_the_segments_its_worker_unlinked() -> None:
    """A worker says which output segments it unlinked in its next reply, whichever: a
    chain's reply dropped them, and the front kept mapping memory nothing could use."""
    link = LinkToNoWorker()
    mappings = _Mappings()
    request = SimpleNamespace(owned=[], model=ModelVersion("add_one", "1", "", None))
    chain = SimpleNamespace(outputs=["Y"], messages=_CHAIN, steps=_CHAIN)
    deadline = asyncio.get_running_loop().time() + 5.0
    sending = asyncio.ensure_future(
        chain_send(Dispatch(mappings, 8), link.link, request, chain, [], deadline)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0)
    (rid,) = link.link.pending
    steps = [StepTimes(0, 0, 0, 0, 1)] * len(_CHAIN)
    link.link.on_message(InferDone(rid, "", [], ["oipserve-0-w1-out-3"], steps=steps))
    done = await sending
    assert isinstance(done, InferDone)
    assert mappings.forgotten == ["oipserve-0-w1-out-3"]
