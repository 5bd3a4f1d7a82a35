"""An ensemble chain run in one worker: steps one after another, intermediates in memory.

The front sends one ``Infer`` with ``chain`` set (``oipserve.dataplane.ensemble_chains``
says which steps qualify) instead of one per step. The first step reads the request's
inputs from shared memory as any request does; each later step is fed the arrays the
earlier steps made, as they are (no copy, no output segment); only the tensors the
front needs (``ChainStep.written``: the ensemble's outputs, and intermediates that a
step outside the chain reads) are written into this connection's output segment.

The reply carries each step's times (``InferDone.steps``), so the front counts each step
in its model's statistics as if it had run alone; a failure (``Failed.steps``: the steps
that ran before it) has the message that step would have given alone.
"""

from __future__ import annotations

from time import monotonic_ns
from typing import TYPE_CHECKING

from oipserve.wire.messages import ErrorKind, Failed, Infer, OutputTarget, StepTimes, TensorDesc
from workers import runtime
from workers.failures import run_failure
from workers.outputs import write_outputs
from workers.regions import RegionError, RegionRefusal

if TYPE_CHECKING:
    from workers.fronts import FrontConnection
    from workers.worker import Worker

__all__ = ["run_chain"]


_NO_TARGETS: dict[str, OutputTarget] = {}


class _ChainFailed(Exception):
    """A step of the chain failed: what the front is told."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def run_chain(worker: Worker, message: Infer, connection: FrontConnection, started: int) -> None:
    """Run ``message.chain`` and reply with one ``InferDone`` (or ``Failed``)."""
    times: list[StepTimes] = []
    tensors: dict[str, object] = {}  # ensemble tensor -> the array a step made
    written: dict[str, tuple[object, str]] = {}  # ... to write: its array, its datatype
    try:
        for index in range(len(message.chain)):
            times.append(_step(worker, message, connection, index, tensors, written))
        del tensors
        copying = monotonic_ns()
        names = list(written)
        values = [value for value, _ in written.values()]
        types = {name: datatype for name, (_, datatype) in written.items()}
        del written
        segment, descs = _write(worker, connection, names, values, types, message)
        del values
    except _ChainFailed as failed:
        failure = Failed(message.rid, failed.kind, failed.message, times, connection.take_dropped())
        worker.reply(connection, failure)
        return
    # NOTE: the copy into the segment counts as the last step's output phase.
    last = times[-1]
    times[-1] = StepTimes(
        last.started_ns, last.input_ns, last.infer_ns, monotonic_ns() - copying, last.rows
    )
    worker._done(connection, message.rid, segment, descs, started, started, copying, times)


def _step(
    worker: Worker,
    message: Infer,
    connection: FrontConnection,
    index: int,
    tensors: dict[str, object],
    written: dict[str, tuple[object, str]],
) -> StepTimes:
    """Step ``index``: fed from shared memory (the first) or from ``tensors``; its
    outputs into ``tensors``, those the front needs into ``written`` too."""
    step = message.chain[index]
    started = monotonic_ns()
    session = worker.sessions.get(step.key)
    if session is None:
        raise _ChainFailed(ErrorKind.UNAVAILABLE, f"model '{step.key}' is not loaded here")
    outputs = list(step.outputs)
    try:
        if index == 0:
            feeds = worker.feeds(message.inputs, session, connection, step.key)
        else:
            feeds = {name: tensors[source] for name, source in step.inputs.items()}
        rows = _rows(feeds)
        fed = monotonic_ns()
        made = session.run(outputs, feeds)
        del feeds
    except Exception as exc:  # report it (as a request of that model alone) and keep serving
        raise _failure(exc, step.key) from None
    ran = monotonic_ns()
    for name, value in zip(outputs, made, strict=True):
        tensor = step.outputs[name]
        tensors[tensor] = value
        if tensor in step.written:
            written[tensor] = (value, session.output_types[name])
    return StepTimes(started, fed - started, ran - fed, 0, rows)


def _rows(feeds: dict[str, object]) -> int:
    """The leading dim of a step's first input (1 for a scalar, or none)."""
    for value in feeds.values():
        shape = getattr(value, "shape", None)
        if callable(shape):  # an OrtValue (BF16)
            shape = shape()
        return int(shape[0]) if shape else 1
    return 1


def _write(
    worker: Worker,
    connection: FrontConnection,
    names: list[str],
    values: list[object],
    types: dict[str, str],
    message: Infer,
) -> tuple[str, list[TensorDesc]]:
    try:
        return write_outputs(
            worker.regions,
            connection.outputs,
            types,
            names,
            values,
            _NO_TARGETS,
            message.text_outputs,
        )
    except (runtime.RequestError, RegionError) as exc:
        kind = ErrorKind.REFUSED if isinstance(exc, RegionRefusal) else ErrorKind.INVALID_INPUT
        raise _ChainFailed(kind, str(exc)) from None
    except OSError as exc:
        raise _ChainFailed(
            ErrorKind.UNAVAILABLE, f"no shared memory for the outputs: {exc}"
        ) from None


def _failure(exc: Exception, key: str) -> _ChainFailed:
    """A step's failure as ``Worker.infer`` reports it for a request of that model alone."""
    return _ChainFailed(*run_failure(exc, key))
