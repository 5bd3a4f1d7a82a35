"""A worker's session calls ONNX Runtime's C++ session, not its Python wrapper
(workers/runtime.py): what the wrapper did around the run still happens, but for its
fallback to the CPU after a provider's failure, which is turned off.

There is no GPU here: a stand-in for the C++ session fails every run in its execution
provider (EPFail), as a CUDA provider does on a GPU that faults.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from oipserve.wire.messages import ErrorKind, Failed, LoadModel
from tests.support.server import ROOT
from tests.support.worker_replies import only_reply, paired_worker
from workers.failures import run_failure
from workers.runtime import ModelSession
from workers.worker import Worker

SIMPLE = ROOT / "model-repository/simple/1/model.onnx"
BF16 = ROOT / "model-repository/identity_bf16/1/model.onnx"


class _FailingProvider:
    """Stands in for the C++ session: every run fails in its execution provider."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, *args: object) -> list[object]:
        self.runs += 1
        raise ort_errors.EPFail("CUDA failure 700: an illegal memory access was encountered")

    run_with_ort_values = run


def _simple_feeds() -> dict[str, object]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return {"INPUT0": a, "INPUT1": np.ones((1, 16), dtype=np.int32)}


def _failing(session: ModelSession) -> _FailingProvider:
    failing = _FailingProvider()
    session.session._sess = failing
    return failing


def test_a_run_that_fails_in_its_provider_fails_and_the_session_keeps_its_providers() -> None:
    """ONNX Runtime's wrapper would make the session again on the CPU for good; a GPU
    instance the server reports on its GPU must not quietly run on the CPU (the load
    refuses that too: placement.gpu_fallback_refusal), so the run fails, internal."""
    session = ModelSession(str(SIMPLE), 1, [])
    healthy = session.session._sess
    failing = _failing(session)
    with pytest.raises(ort_errors.EPFail) as raised:
        session.run(["OUTPUT0", "OUTPUT1"], _simple_feeds())
    assert failing.runs == 1 and session.session._sess is failing  # nothing made again
    assert run_failure(raised.value, "simple/1")[0] is ErrorKind.INTERNAL
    # The next run is tried as the first was, on the same session.
    session.session._sess = healthy
    out0, out1 = session.run([], _simple_feeds())
    np.testing.assert_array_equal(out0, np.arange(16).reshape(1, 16) + 1)
    np.testing.assert_array_equal(out1, np.arange(16).reshape(1, 16) - 1)


def test_a_bf16_run_that_fails_in_its_provider_fails_too() -> None:
    session = ModelSession(str(BF16), 1, [])
    (name,) = session.input_types
    words = np.array([[0x3F80, 0x4000]], dtype=np.uint16)  # 1.0, 2.0
    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(words, 16)
    failing = _failing(session)
    with pytest.raises(ort_errors.EPFail):
        session.run([], {name: value})
    assert failing.runs == 1 and session.session._sess is failing


def test_an_input_missing_from_a_run_is_the_servers_error_not_the_clients() -> None:
    """The C++ session answers a missing input with a FAIL "while running" a node, which
    ``rejects_input`` takes for bad values of the client's; the front checked the client's
    names, so a feed without one is the worker's own (an ensemble step's, a state's)."""
    session = ModelSession(str(SIMPLE), 1, [])
    feeds = _simple_feeds()
    del feeds["INPUT1"]
    with pytest.raises(ValueError, match="INPUT1") as raised:
        session.run(["OUTPUT0"], feeds)
    assert run_failure(raised.value, "simple/1")[0] is ErrorKind.INTERNAL


class _WrapperOnly(ort.InferenceSession):
    """An ONNX Runtime whose InferenceSession keeps its C++ session elsewhere."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._elsewhere = self._sess
        del self._sess


@pytest.fixture
def worker() -> Iterator[Worker]:
    with paired_worker("oipserve-test-ep-") as worker:
        yield worker


def test_an_onnxruntime_without_the_cpp_session_fails_the_load_not_the_runs(
    worker: Worker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ort, "InferenceSession", _WrapperOnly)
    with caplog.at_level(logging.ERROR, logger="oipserve.worker"):
        worker.handle(LoadModel(4, "simple/1", str(SIMPLE), 1, []), worker.starter)
    reply = only_reply(worker)
    assert isinstance(reply, Failed) and reply.kind is ErrorKind.INTERNAL
    assert "simple/1" not in worker.sessions
    assert "has no _sess" in caplog.text
