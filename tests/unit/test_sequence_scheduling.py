"""The sequence batcher's pure parts: which rows a lane's next batch takes (direct, oldest),
when it is due (oldest.scheduling.sequence), the sequence parameters of REST and gRPC
requests (request.sequence_params), and the implicit state a worker keeps
(workers.sequence_state)."""

from __future__ import annotations

import numpy as np
import pytest

from oipserve.dataplane.sequence_batches import control_value
from oipserve.errors import InvalidInput, Unsupported
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.models.config.sequence import Control
from oipserve.request.sequence_params import from_grpc, from_json
from oipserve.scheduling.sequence import (
    Lane,
    Sequence,
    Step,
    direct_due,
    direct_rows,
    oldest_due,
    oldest_rows,
)
from oipserve.wire.messages import SequenceRows, SequenceState
from workers.sequence_state import SequenceStates, StateMismatch

Seq = Sequence[Step, str]


def _lane(places: int, queued: dict[int, list[int]], signature: object = "s") -> Lane[Step, str]:
    """A lane whose slot i holds a sequence with requests enqueued at the given times."""
    lane: Lane[Step, str] = Lane("worker", 1, places)
    for slot, times in queued.items():
        sequence: Seq = Sequence(slot + 100, f"id{slot}")
        for at in times:
            sequence.queue.append(Step(at, signature))
        lane.take(sequence, slot)
    return lane


def test_direct_rows_leave_empty_slots_up_to_the_highest_ready_one() -> None:
    lane = _lane(4, {0: [5], 2: [1], 3: []})
    rows = direct_rows(lane)
    assert [row.slot if row is not None else None for row in rows] == [0, None, 2]
    assert direct_rows(_lane(4, {1: []})) == []


def test_direct_rows_skip_a_sequence_already_in_the_batch_or_not_ready() -> None:
    lane = _lane(3, {0: [1], 1: [2], 2: [3]})
    first, second, third = (lane.slots[i] for i in range(3))
    assert first is not None and second is not None and third is not None
    first.in_batch = True
    third.queue[0].ready = False
    assert [row.slot if row else None for row in direct_rows(lane)] == [None, 1]


def test_direct_rows_take_only_the_lowest_slots_signature() -> None:
    lane = _lane(3, {0: [1], 1: [2], 2: [3]})
    assert lane.slots[1] is not None
    lane.slots[1].queue[0].signature = "other"
    assert [row.slot if row else None for row in direct_rows(lane)] == [0, None, 2]


def test_direct_waits_for_slot_utilization_no_longer_than_the_delay() -> None:
    lane = _lane(4, {0: [1_000]})
    rows = direct_rows(lane)
    assert direct_due(rows, 4, 0.0, 500, 1_000) == 0  # no utilization asked: at once
    assert direct_due(rows, 4, 0.5, 500, 1_200) == 1_500  # 1 of 4 < 50%: wait
    assert direct_due(rows, 4, 0.5, 500, 1_600) == 0  # the delay passed
    assert direct_due(direct_rows(_lane(4, {0: [1], 1: [1]})), 4, 0.5, 500, 2) == 0


def test_oldest_rows_are_the_oldest_requests_up_to_the_batch_size() -> None:
    lane = _lane(4, {0: [30], 1: [10], 2: [20], 3: [5]})
    assert [row.slot for row in oldest_rows(lane, 3)] == [3, 1, 2]


def test_oldest_fires_at_a_preferred_size_or_after_the_delay() -> None:
    lane = _lane(4, {0: [100], 1: [150]})
    rows = oldest_rows(lane, 8)
    assert oldest_due(rows, (4,), 1_000, 200) == 1_100
    assert oldest_due(rows, (2, 4), 1_000, 200) == 0  # 2 is preferred
    assert oldest_due(rows, (4,), 1_000, 1_100) == 0
    assert oldest_due(rows, (4,), 0, 200) == 0  # no delay


def test_lane_places() -> None:
    lane = _lane(2, {})
    assert lane.free_slot() == 0
    sequence: Seq = Sequence(1, 7)
    lane.take(sequence, 0)
    assert lane.free_slot() == 1 and lane.used == 1 and sequence.lane is lane
    lane.release(sequence)
    assert lane.free_slot() == 0 and sequence.lane is None and sequence.slot == -1
    # max_candidate_sequences: 2147483647 allocates nothing ahead
    huge: Lane[Step, str] = Lane("worker", 1, 2**31 - 1)
    assert huge.slots == [] and huge.free_slot() == 0


# ---- control inputs -----------------------------------------------------------------


def _value(control: Control, *args: object) -> object:
    tensor, shape, nbytes, data = control_value(control, *args)  # type: ignore[arg-type]
    assert tensor.name == control.name and tensor.shape == shape
    if isinstance(data, np.ndarray):
        assert data.nbytes == nbytes and list(data.shape) == shape
        return data.tolist()
    return bytes(data)  # type: ignore[arg-type]


def test_control_values_as_triton_shapes_them() -> None:
    start = Control("START", "S", "INT32", 0, 1)
    ready = Control("READY", "R", "FP32", 0.5, 2.0)
    end = Control("END", "E", "BOOL", False, True)
    assert _value(start, 7, True, False, [1, 1]) == [[1]]
    assert _value(start, 7, False, True, [1]) == [0]  # a model without batching: [1]
    assert _value(end, 7, False, True, [1, 1]) == [[True]]
    assert _value(ready, 7, False, False, [1, 1]) == [[2.0]]
    assert _value(ready, None, False, False, [1, 1]) == [[0.5]]  # an empty slot
    corrid = Control("CORRID", "C", "UINT32")
    assert _value(corrid, 2**32 + 5, False, False, [1, 1]) == [[5]]  # the id's low bits
    assert _value(Control("CORRID", "C", "UINT64"), 2**64 - 1, False, False, [1, 1]) == [
        [2**64 - 1]
    ]
    assert _value(Control("CORRID", "C", "BYTES"), "ab", False, False, [1, 1]) == b"\x02\0\0\0ab"
    assert _value(Control("CORRID", "C", "BYTES"), None, False, False, [1, 1]) == b"\0\0\0\0"


# ---- the sequence parameters --------------------------------------------------------


def test_json_sequence_parameters() -> None:
    tag = from_json({"sequence_id": 7, "sequence_start": True})
    assert (tag.sequence_id, tag.start, tag.end) == (7, True, False)
    assert from_json({"sequence_id": "abc", "sequence_end": True}).sequence_id == "abc"
    assert from_json(None).sequence_id == 0
    for bad, message in [
        ({"sequence_id": 1.5}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": -1}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": 1, "sequence_start": 1}, "Unable to parse 'sequence_start'"),
        ({"sequence_id": 1, "sequence_end": "yes"}, "Unable to parse 'sequence_end'"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            from_json(bad)
    with pytest.raises(Unsupported, match="cannot be longer than 128 characters"):
        from_json({"sequence_id": "x" * 129})
    assert from_json({"sequence_id": "x" * 128}).sequence_id == "x" * 128


def test_grpc_sequence_parameters() -> None:
    request = pb.ModelInferRequest()
    request.parameters["sequence_id"].int64_param = 9
    request.parameters["sequence_start"].bool_param = True
    tag = from_grpc(request.parameters)
    assert (tag.sequence_id, tag.start, tag.end) == (9, True, False)
    request.parameters["sequence_id"].string_param = "s"
    assert from_grpc(request.parameters).sequence_id == "s"
    request.parameters["sequence_id"].uint64_param = 3
    with pytest.raises(InvalidInput, match="expected int64_param or string_param."):
        from_grpc(request.parameters)
    request.parameters["sequence_id"].int64_param = 3
    request.parameters["sequence_end"].int64_param = 1
    with pytest.raises(InvalidInput, match="'sequence_end' parameter, expected bool_param."):
        from_grpc(request.parameters)


# ---- implicit state in the worker ---------------------------------------------------

STATE = SequenceState("ACC_IN", "ACC_OUT", "INT32", [1])


def _rows(handles: list[int], starts: list[bool], ends: list[bool]) -> SequenceRows:
    return SequenceRows([STATE], handles, starts, ends, True)


def _step(states: SequenceStates, rows: SequenceRows, adds: list[int]) -> list[int]:
    """One batch of the accumulator: OUTPUT = ACC_IN + INPUT, ACC_OUT = OUTPUT."""
    feeds: dict[str, object] = {}
    names = states.feed("m/1", rows, feeds, ["OUTPUT"])
    assert names == ["OUTPUT", "ACC_OUT"]
    total = np.asarray(feeds["ACC_IN"]) + np.array(adds, np.int32).reshape(-1, 1)
    kept, values = states.keep("m/1", rows, names, [total, total])
    assert kept == ["OUTPUT"]
    return [int(v) for v in np.asarray(values[0]).reshape(-1)]


def test_state_carries_from_request_to_request_per_sequence() -> None:
    states = SequenceStates()
    assert _step(states, _rows([1, 2], [True, True], [False, False]), [1, 10]) == [1, 10]
    assert _step(states, _rows([2, 0, 1], [False, False, False], [False] * 3), [5, 7, 2]) == [
        15,
        7,  # an empty slot: the initial state, never kept
        3,
    ]
    assert _step(states, _rows([1], [True], [False]), [4]) == [4]  # START resets it
    assert _step(states, _rows([2], [False], [True]), [1]) == [16]  # END frees it
    assert set(states.models["m/1"]) == {1}
    states.end("m/1", [1])
    assert "m/1" not in states.models


def test_initial_state_data_and_mismatched_shapes() -> None:
    states = SequenceStates()
    initial = SequenceState("ACC_IN", "ACC_OUT", "INT32", [1], np.int32(40).tobytes())
    rows = SequenceRows([initial], [1], [True], [False], True)
    feeds: dict[str, object] = {}
    states.feed("m/1", rows, feeds, ["OUTPUT"])
    assert np.asarray(feeds["ACC_IN"]).tolist() == [[40]]
    states.models["m/1"] = {1: {"ACC_IN": np.zeros((1, 2), np.int32)}}
    with pytest.raises(StateMismatch, match="different shapes"):
        states.feed("m/1", _rows([1, 2], [False, True], [False, False]), {}, ["OUTPUT"])
