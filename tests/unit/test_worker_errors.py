"""A worker reports failures as kinds: the client's mistakes, the model's, its own bugs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from oipserve.wire.messages import ErrorKind, Failed, Infer, LoadModel
from tests.support.worker_replies import only_reply, paired_worker
from workers import runtime
from workers.worker import Worker


class _Session(runtime.ModelSession):
    """Stands in for runtime.ModelSession: its run raises what the test gives it."""

    def __init__(self, error: Exception) -> None:
        # NOTE: no session to load; a subclass, as the compiled worker takes no other.
        self.outputs = []
        self.error = error

    def run(self, names: list[str], feeds: dict[str, object]) -> list[object]:
        raise self.error


@pytest.fixture
def worker() -> Iterator[Worker]:
    with paired_worker("oipserve-test-errors-") as worker:
        yield worker


def _only_reply(worker: Worker) -> Failed:
    reply = only_reply(worker)
    assert isinstance(reply, Failed)
    return reply


def _infer_failing_with(worker: Worker, error: Exception) -> Failed:
    worker.sessions["m/1"] = _Session(error)
    worker.handle(Infer(7, "m/1", [], ["y"]), worker.starter)
    reply = _only_reply(worker)
    assert reply.rid == 7
    return reply


RESHAPE = (
    "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node."
    " The input tensor cannot be reshaped to the requested shape."
)
GATHER = "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : indices element out of data bounds"
#: What ONNX Runtime 1.2x raises for simple_string's "abc" (a Cast from string to INT32).
CAST = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running"
    " Cast node. Name:'parse0' Status Message: stoll"
)


@pytest.mark.parametrize(
    "error",
    [
        ort_errors.InvalidArgument(GATHER),
        ort_errors.Fail(RESHAPE),
        ort_errors.RuntimeException(CAST),
    ],
    ids=["gather", "reshape", "cast-from-string"],
)
def test_values_onnxruntime_refuses_are_invalid_input(worker: Worker, error: Exception) -> None:
    reply = _infer_failing_with(worker, error)
    assert reply.kind is ErrorKind.INVALID_INPUT
    assert str(error) in reply.message


@pytest.mark.parametrize(
    "error",
    [
        ort_errors.Fail(
            "Non-zero status code returned while running Conv node: Failed to allocate"
        ),
        ort_errors.RuntimeException("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : secret detail"),
        ort_errors.RuntimeException(
            "Non-zero status code returned while running Cast node. Status Message: secret detail"
        ),
        ort_errors.EPFail("secret detail"),
        RuntimeError("secret detail"),
    ],
    ids=["out-of-memory", "runtime-exception", "cast-failing-otherwise", "ep-fail", "bug"],
)
def test_genuine_failures_are_internal_with_a_generic_message(
    worker: Worker, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="oipserve.worker"):
        reply = _infer_failing_with(worker, error)
    assert reply.kind is ErrorKind.INTERNAL
    assert "secret detail" not in reply.message and "alloc" not in reply.message
    assert "model 'm/1' failed" in reply.message
    (record,) = caplog.records
    assert record.exc_info is not None and record.exc_info[1] is error  # traceback logged


def test_unknown_model_is_unavailable(worker: Worker) -> None:
    worker.handle(Infer(3, "gone/1", [], []), worker.starter)
    assert _only_reply(worker).kind is ErrorKind.UNAVAILABLE


def test_a_model_file_onnxruntime_cannot_load_is_invalid_input(
    worker: Worker, tmp_path: Path
) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a model")
    worker.handle(
        LoadModel(5, "bad/1", str(bad), 1, [("CPUExecutionProvider", {})]), worker.starter
    )
    reply = _only_reply(worker)
    assert reply.kind is ErrorKind.INVALID_INPUT
    assert "INVALID_PROTOBUF" in reply.message or "Protobuf" in reply.message
    assert not reply.message.startswith("InvalidProtobuf:")  # ORT's text, no type name
