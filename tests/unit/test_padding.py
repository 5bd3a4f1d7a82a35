"""Padded batching's pieces: the ``pad_batch`` parameter, the waste bound, the layout."""

from __future__ import annotations

import numpy as np
import pytest

from oipserve.dataplane.padding import PaddedLayout
from oipserve.errors import InferenceFailed
from oipserve.models.config.padding_config import CutOutput, PadBatch, PaddedInput
from oipserve.models.config.parse import ModelConfigError, parse_model_config
from oipserve.request.inference import InputTensor
from oipserve.wire.messages import TensorDesc

CONFIG = """name: "m" max_batch_size: 8
input [ {{ name: "ids" data_type: TYPE_INT64 dims: [ -1 ] }},
        {{ name: "feats" data_type: TYPE_FP32 dims: [ -1, 2 ] }} ]
output [ {{ name: "h" data_type: TYPE_FP32 dims: [ -1, 4 ] }},
         {{ name: "p" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ }}
parameters {{ key: "pad_batch" value: {{ string_value: "{value}" }} }}
"""


def _parse(value: str) -> PadBatch:
    spec = parse_model_config(CONFIG.format(value=value)).pad_batch
    assert spec is not None
    return spec


def test_the_syntax() -> None:
    spec = _parse(
        "input ids dim 1 pad 0 mask am lengths n int32; input feats dim 1 pad -1.5;"
        " output h dim 1 follows feats; waste 3"
    )
    assert spec.inputs == (
        PaddedInput("ids", 1, "INT64", 0.0, "am", "INT64", "n", "INT32"),
        PaddedInput("feats", 1, "FP32", -1.5),
    )
    assert spec.outputs == (CutOutput("h", 1, "feats"),)
    assert spec.waste == 3.0
    assert spec.generated == {"am": "INT64", "n": "INT32"}
    # follows defaults to the first padded input; waste to 2
    default = _parse("input ids dim 1 pad 0; output h dim 1")
    assert default.outputs == (CutOutput("h", 1, "ids"),) and default.waste == 2.0
    assert parse_model_config(CONFIG.format(value="x").split("parameters")[0]).pad_batch is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "declares no padded input"),
        ("input ids dim 1", "expected 'input NAME dim D pad V"),
        ("input ids dim x pad 0", "dim 'x' is not a number"),
        ("input ids dim 0 pad 0", "dim 0 is not one of its dimensions"),
        ("input feats dim 2 pad 0", "dim 2 has the fixed size 2"),
        ("input ids dim 1 pad zero", "pad value 'zero' is not a number"),
        ("input ids dim 1 pad 1.5", "not a whole number, as INT64 needs"),
        ("input ids dim 1 pad 0 mask", "'mask' needs the name of a model input"),
        ("input ids dim 1 pad 0 mask feats", "mask target 'feats' is a configured input"),
        ("input ids dim 1 pad 0 trim x", "unknown word 'trim'"),
        ("input ids dim 1 pad 0; input ids dim 1 pad 0", "names 'ids' more than once"),
        ("output h dim 1", "no padded input is declared before it"),
        ("input ids dim 1 pad 0; output q dim 1", "pad_batch output 'q' is not a configured"),
        ("input ids dim 1 pad 0; output h dim 1 follows feats", "which is not a padded input"),
        ("input ids dim 1 pad 0; output p dim 1", "dim 1 has the fixed size 4"),
        ("input ids dim 1 pad 0; waste 0.9", "'waste' needs one number of at least 1"),
        ("input ids dim 1 pad 0; waste inf", "'waste' needs one number of at least 1"),
        ("input ids dim 1 pad 0; fill 3", "unknown clause 'fill'"),
    ],
)
def test_malformed_is_refused_with_the_reason(value: str, reason: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        parse_model_config(CONFIG.format(value=value))
    assert reason in str(caught.value)


def test_needs_batching_and_no_ragged_batching() -> None:
    value = "input ids dim 1 pad 0"
    no_batcher = CONFIG.format(value=value).replace("dynamic_batching { }", "")
    with pytest.raises(ModelConfigError, match="needs max_batch_size > 0 and dynamic_batching"):
        parse_model_config(no_batcher)
    ragged = CONFIG.format(value=value).replace(
        "dims: [ -1 ] }", "dims: [ -1 ] allow_ragged_batch: true }", 1
    )
    with pytest.raises(ModelConfigError, match="cannot be combined with ragged batching"):
        parse_model_config(ragged)


class _Queued:
    def __init__(self, placements: list) -> None:
        self.placements = placements


def _request(length: int, rows: int = 1, start: int = 1) -> list:
    ids = np.arange(start, start + rows * length, dtype=np.int64).reshape(rows, length)
    return [(InputTensor("ids", "INT64", [rows, length]), [rows, length], ids.nbytes, ids)]


SPEC = PadBatch(
    (PaddedInput("ids", 1, "INT64", -7, mask="am", lengths="n"),), (CutOutput("h", 1, "ids"),)
)


def test_waste_gate_admits_while_padding_stays_within_the_bound() -> None:
    gate = PaddedLayout(SPEC).gate()
    gate.first(_Queued(_request(4)))
    assert gate.admit(_Queued(_request(3)))  # 2 x 4 = 8 of 7 real
    assert not gate.admit(_Queued(_request(20)))  # 3 x 20 = 60 of 27 real: > 2x
    assert gate.admit(_Queued(_request(2)))  # the refused one left nothing behind: 12 of 9


def test_signature_leaves_out_only_the_padded_dimension() -> None:
    layout = PaddedLayout(SPEC)
    assert layout.signature(_request(3)) == layout.signature(_request(9))  # type: ignore[arg-type]
    other = [(InputTensor("ids", "INT32", [1, 3]), [1, 3], 12, np.zeros((1, 3), np.int32))]
    assert layout.signature(_request(3)) != layout.signature(other)  # type: ignore[arg-type]


class _Lease:
    def __init__(self, size: int) -> None:
        self.buf = memoryview(bytearray(size))
        self.name = "seg"


def test_assemble_pads_and_makes_the_mask_and_lengths() -> None:
    layout = PaddedLayout(SPEC)
    requests = [_request(2, start=1), _request(4, rows=2, start=10)]
    lease = _Lease(layout.size(requests))  # type: ignore[arg-type]
    descs = {d.name: d for d in layout.assemble(requests, lease)}  # type: ignore[arg-type]

    def read(name: str, dtype: type) -> np.ndarray:
        d = descs[name]
        raw = lease.buf[d.offset : d.offset + d.nbytes]
        return np.frombuffer(raw, dtype).reshape(d.shape)

    assert read("ids", np.int64).tolist() == [
        [1, 2, -7, -7],
        [10, 11, 12, 13],
        [14, 15, 16, 17],
    ]
    assert read("n", np.int64).tolist() == [2, 4, 4]
    assert read("am", np.int64).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert layout.elements(requests) == (12, 10)  # type: ignore[arg-type]


def test_split_cuts_back_to_each_length() -> None:
    layout = PaddedLayout(SPEC)
    requests = [_request(4, rows=2), _request(2)]
    hidden = np.arange(3 * 4 * 2, dtype=np.float32).reshape(3, 4, 2)
    segment = memoryview(hidden.tobytes())
    desc = TensorDesc("h", "FP32", [3, 4, 2], "seg", 0, hidden.nbytes)
    (first,), (second,) = layout.split([desc], segment, requests, [2, 1])  # type: ignore[arg-type]
    assert first[0].shape == [2, 4, 2]  # the longest: as it is
    assert second[0].shape == [1, 2, 2]  # one row: a prefix view, no copy
    assert np.frombuffer(second[1], np.float32).tolist() == hidden[2, :2].reshape(-1).tolist()
    (short,) = layout.split([desc], segment, [_request(2, rows=2), _request(4)], [2, 1])[0]  # type: ignore[arg-type]
    assert short[0].shape == [2, 2, 2]  # two rows: copied out
    assert np.frombuffer(short[1], np.float32).tolist() == hidden[:2, :2].reshape(-1).tolist()
    wrong = TensorDesc("h", "FP32", [3, 5, 2], "seg", 0, 0)
    with pytest.raises(InferenceFailed, match="is not the batch's padded length 4"):
        layout.split([wrong], memoryview(bytes(120)), requests, [2, 1])  # type: ignore[arg-type]
