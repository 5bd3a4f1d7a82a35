"""How an ensemble step's output becomes the next step's input (``dataplane.ensemble``):
described where it lies in the worker's segment, never copied, released once."""

from __future__ import annotations

import asyncio

import numpy as np

from oipserve.dataplane.ensemble_tensors import EnsembleTensor as _Tensor
from oipserve.dataplane.ensemble_tensors import Held
from oipserve.errors import InferenceFailed
from oipserve.request.inference import Inference, InputTensor
from oipserve.request.placement import place
from oipserve.wire.shm import BufferPool
from tests.support.ensemble_models import StepCalls, ensemble_config, fake_ensemble


def test_a_step_output_is_described_where_it_lies() -> None:
    """The next step's descriptor names the worker's segment and offset: no segment of the
    front's is taken, nothing is copied."""
    segment = bytearray(256)
    segment[64:72] = bytes(range(8))
    held = Held("oipserve-1-w0-5", memoryview(segment), lambda: None)
    tensor = _Tensor("t", "FP32", [1, 2], held, data=memoryview(segment)[64:72], offset=64)
    given = tensor.as_input("IN")
    pool = BufferPool("oipserve-test-never-")
    descs, lease = asyncio.run(place([(given, [1, 2], 8, None)], pool))
    assert lease is None and pool.leased_count == 0
    (desc,) = descs
    assert (desc.name, desc.segment, desc.offset, desc.nbytes) == ("IN", held.name, 64, 8)
    pool.close()


def test_a_batched_steps_share_is_copied_once_when_read() -> None:
    """A batched step's output is its share of the batch's segment (offset -1): the next step
    gets its bytes, which placement copies into one input segment."""
    data = memoryview(bytearray(8))
    tensor = _Tensor("t", "FP32", [1, 2], Held("", data, lambda: None), data=data)
    given = tensor.as_input("IN")
    assert given.located is None and given.raw is data


def test_held_releases_once_every_user_is_done() -> None:
    released: list[int] = []
    held = Held("s", memoryview(b""), lambda: released.append(1))
    users = [held.part(), held.part()]
    held.release()  # the request's own
    assert not released
    for user in users:
        user.release()
    assert released == [1]
    held.release()  # one too many: nothing more happens
    assert released == [1]


def _request(model, owned: list[Held]) -> Inference:  # noqa: ANN001
    values = np.array([[1.0, 2.0]], np.float32)
    given = InputTensor("X", "FP32", [1, 2], raw=memoryview(values.tobytes()))
    return Inference(model, [given], [], owned)  # type: ignore[arg-type]


class _Stats:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.succeeded = 0

    def request_failed(self, reason: str, total_ns: int) -> None:
        self.failed.append(reason)

    def request_succeeded(self, *args: int) -> None:
        self.succeeded += 1

    def executed(self, *args: int) -> None:
        pass


DIAMOND = ensemble_config(
    "d",
    [
        ("plus", {"A": "l", "B": "r"}, {"OUT": "Y"}),
        ("one", {"IN": "X"}, {"OUT": "l"}),
        ("ten", {"IN": "X"}, {"OUT": "r"}),
    ],
    [("X", "TYPE_FP32", "[ -1 ]")],
    [("Y", "TYPE_FP32", "[ -1 ]")],
)
ADDS = {"plus": 0.0, "one": 1.0, "ten": 10.0}


def test_independent_branches_run_at_the_same_time() -> None:
    async def scenario() -> tuple[np.ndarray, int, list[str], int]:
        calls = StepCalls(delay=0.05)
        runner, model = fake_ensemble(DIAMOND, ADDS, calls)
        released: list[int] = []
        client = Held("", memoryview(b""), lambda: released.append(1))
        stats = _Stats()
        result = await runner.run(_request(model, [client]), stats, 0)  # type: ignore[arg-type]
        y = np.frombuffer(result.outputs[0].data, np.float32).copy()
        result.release()
        return y, calls.most, calls.calls, len(released) + 10 * stats.succeeded

    y, most, order, counts = asyncio.run(scenario())
    np.testing.assert_array_equal(y, [(1 + 1) + (1 + 10), (2 + 1) + (2 + 10)])
    assert most == 2  # "one" and "ten" at once
    assert order[-1] == "plus"
    assert counts == 11  # the client's inputs released once; one success


def test_max_inflight_requests_bounds_the_requests_in_a_chain() -> None:
    """With one slot per step, a request holds step 0's slot until step 1 is done: one
    request in the whole chain at a time, and all of them answered."""
    chain = ensemble_config(
        "c",
        [("one", {"IN": "X"}, {"OUT": "t"}), ("ten", {"IN": "t"}, {"OUT": "Y"})],
        [("X", "TYPE_FP32", "[ -1 ]")],
        [("Y", "TYPE_FP32", "[ -1 ]")],
        extra="  max_inflight_requests: 1\n",
    )

    async def scenario(limited: bool) -> tuple[int, int]:
        calls = StepCalls(delay=0.01)
        text = chain if limited else chain.replace("max_inflight_requests: 1", "")
        runner, model = fake_ensemble(text, ADDS, calls)
        stats = _Stats()
        results = await asyncio.gather(
            *(runner.run(_request(model, []), stats, 0) for _ in range(4))  # type: ignore[arg-type]
        )
        for result in results:
            result.release()
        return calls.most, stats.succeeded

    assert asyncio.run(scenario(limited=True)) == (1, 4)
    assert asyncio.run(scenario(limited=False))[0] > 1  # the test can see the difference


def test_a_failing_step_fails_the_request_once_with_reason_other() -> None:
    async def scenario() -> tuple[str, list[str], int, list[str]]:
        calls = StepCalls(delay=0.01, fail=frozenset({"ten"}))
        runner, model = fake_ensemble(DIAMOND, ADDS, calls)
        released: list[int] = []
        stats = _Stats()
        client = Held("", memoryview(b""), lambda: released.append(1))
        try:
            await runner.run(_request(model, [client]), stats, 0)  # type: ignore[arg-type]
        except InferenceFailed as exc:
            return exc.message, stats.failed, len(released), calls.calls
        raise AssertionError("the request did not fail")

    message, failed, released, order = asyncio.run(scenario())
    assert message == "model 'ten' failed"
    assert failed == ["OTHER"] and released == 1
    assert "plus" not in order
