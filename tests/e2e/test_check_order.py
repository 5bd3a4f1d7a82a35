"""A request with several faults is refused for the one Triton names first: Triton's order of
checks (its fronts add each input and output, then core's InferenceRequest::Normalize:
requested outputs, the input count, every batch dimension, the batch size, then each input's
datatype and shape), REST and gRPC alike. Until 2026-11-30 each input was checked whole before
the next, and the outputs last: a request with two faults was refused for another one than
Triton names.
"""

from __future__ import annotations

import pytest

from tests.support.refusals import binary_refusal, refusals, tensor
from tests.support.server import ServerProcess

ROW = list(range(16))


def _int32(name: str, rows: int = 1, width: int = 16) -> dict[str, object]:
    return tensor(name, "INT32", [rows, width], [0] * (rows * width))


def _fp32(name: str, rows: int = 1) -> dict[str, object]:
    return tensor(name, "FP32", [rows, 16], [0.0] * (rows * 16))


#: (inputs, requested outputs, what Triton names) for the sample model ``simple``
#: (INPUT0, INPUT1: INT32 [-1,16]; max_batch_size 8; OUTPUT0, OUTPUT1).
CASES = {
    "an input twice before an unknown output": (
        [_int32("INPUT0"), _int32("INPUT0")],
        ["OUTPUT9"],
        "input 'INPUT0' already exists in request",
    ),
    "an unknown output before a datatype": (
        [_fp32("INPUT0"), _int32("INPUT1")],
        ["OUTPUT9"],
        "unexpected inference output 'OUTPUT9' for model 'simple'",
    ),
    "an unknown output before a missing input": (
        [_int32("INPUT0")],
        ["OUTPUT9"],
        "unexpected inference output 'OUTPUT9' for model 'simple'",
    ),
    "unknown outputs in name order": (
        [_int32("INPUT0"), _int32("INPUT1")],
        ["OUTZ", "OUTA"],
        "unexpected inference output 'OUTA' for model 'simple'",
    ),
    "the input count before a datatype": (
        [_fp32("INPUT0")],
        [],
        "expected 2 inputs but got 1 inputs for model 'simple'",
    ),
    "the input count before an unknown input": (
        [_int32("INPUT0"), _int32("INPUT1"), _int32("NOPE")],
        [],
        "expected 2 inputs but got 3 inputs for model 'simple'",
    ),
    "every batch dimension before a datatype": (
        [_fp32("INPUT0"), _int32("INPUT1", rows=2)],
        [],
        "input 'INPUT1' batch size does not match other inputs for 'simple'",
    ),
    "the batch size before a shape": (
        [_int32("INPUT0", rows=9, width=8), _int32("INPUT1", rows=9)],
        [],
        "inference request batch-size must be <= 8 for 'simple'",
    ),
    "a datatype before the next input's shape": (
        [_fp32("INPUT0"), _int32("INPUT1", width=8)],
        [],
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fault_triton_names_first(server: ServerProcess, case: str) -> None:
    inputs, outputs, words = CASES[case]
    for message in refusals(server, "simple", inputs, outputs):
        assert words in message, message


#: (model, inputs, what Triton says): the words of core's Normalize for a shape Triton
#: refuses before looking at the model's dims (a negative batch size: Triton's is unsigned).
#: Until 2026-11-30 they were refused as shapes the model does not take, or in our words.
SHAPES = {
    "no shape for a model that batches": (
        "simple",
        [tensor("INPUT0", "INT32", [], [0]), _int32("INPUT1")],
        "input 'INPUT0' has no shape but model requires batch dimension for 'simple'",
    ),
    "a -1 for the batch size": (
        "simple",
        [tensor(name, "INT32", [-1, 16], ROW) for name in ("INPUT0", "INPUT1")],
        "inference request batch-size must be <= 8 for 'simple': input 'INPUT0' has batch size -1",
    ),
    "a -1 in a request's shape": (
        "identity_fp32",
        [tensor("INPUT0", "FP32", [2, -1], [0.0, 0.0])],
        "All input dimensions should be specified for input 'INPUT0' for model 'identity_fp32', "
        "got [2,-1]",
    ),
    "a -1 after a dimension the model does not take": (
        "reshape_optional",
        [tensor("X", "FP32", [1, 4], [0.0] * 4), tensor("BIAS", "FP32", [1, 3, -1], [0.0])],
        "unexpected shape for input 'BIAS' for model 'reshape_optional'. Expected [-1,2,2], "
        "got [1,3,-1]",
    ),
    "another negative size": (
        "identity_fp32",
        [tensor("INPUT0", "FP32", [2, -2], [0.0, 0.0])],
        "tensor 'INPUT0' contains an invalid dimension [2,-2]: input 'INPUT0' has a negative "
        "dimension in [2, -2]",
    ),
}


#: Triton's HTTP front reads each size of an input's shape as an unsigned integer, as it
#: adds the input (http_server.cc), and refuses a negative one, -1 too, in these words
#: before core sees the request (a 500 there, a 400 here).
UNPARSED = (
    "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
)


def _unparsed(name: str, shape: list[int]) -> str:
    return (
        f"{UNPARSED}: input '{name}' has a negative size in its shape {shape} (each size of a "
        "request's shape is 0 or more; -1, any size, is for a model's dims)"
    )


def _negative(inputs: list[dict[str, object]]) -> dict[str, object] | None:
    return next((t for t in inputs if min(t["shape"], default=0) < 0), None)  # type: ignore[call-overload]


@pytest.mark.parametrize("case", list(SHAPES))
def test_shapes_refused_in_tritons_words(server: ServerProcess, case: str) -> None:
    """gRPC: core's words; REST: a negative size is its HTTP front's (until 2026-11-30
    core's there too)."""
    model, inputs, words = SHAPES[case]
    rest, grpc_message = refusals(server, model, inputs)
    assert words in grpc_message, grpc_message
    negative = _negative(inputs)
    if negative is None:
        assert words in rest, rest
    else:
        assert rest == _unparsed(str(negative["name"]), list(negative["shape"])), rest  # type: ignore[call-overload]


#: (inputs, what Triton's HTTP front names, what its gRPC front names): its HTTP front reads
#: each input's shape before it adds the input, after it added the ones before it.
UNPARSED_ORDER = {
    "a negative size before its input's second time": (
        [_int32("INPUT0"), tensor("INPUT0", "INT32", [-1, 16], ROW)],
        _unparsed("INPUT0", [-1, 16]),
        "[request id: <id_unknown>] input 'INPUT0' already exists in request",
    ),
    "an input twice before a negative size after it": (
        [_int32("INPUT0"), _int32("INPUT0"), tensor("INPUT1", "INT32", [1, -16], ROW)],
        "[request id: <id_unknown>] input 'INPUT0' already exists in request",
        "[request id: <id_unknown>] input 'INPUT0' already exists in request",
    ),
    "a negative size before another input's datatype": (
        [_fp32("INPUT0"), tensor("INPUT1", "INT32", [1, -2], ROW)],
        _unparsed("INPUT1", [1, -2]),
        "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP32', but model "
        "'simple' expects 'INT32'",
    ),
}


@pytest.mark.parametrize("case", list(UNPARSED_ORDER))
def test_a_negative_size_where_tritons_http_front_meets_it(
    server: ServerProcess, case: str
) -> None:
    inputs, rest_words, grpc_words = UNPARSED_ORDER[case]
    rest, grpc_message = refusals(server, "simple", inputs)
    assert rest.startswith(rest_words), rest
    assert grpc_message.startswith(grpc_words), grpc_message


def test_a_negative_size_of_a_binary_input(server: ServerProcess) -> None:
    """The binary extension's inputs are read the same way: the front's words, 400."""
    inputs = [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    for given in inputs:
        given["parameters"] = {"binary_data_size": 64}
    message = binary_refusal(server, "simple", inputs, bytes(128))
    assert message == _unparsed("INPUT1", [-1, 16]), message


#: (inputs, requested outputs, Triton's words, whether core puts the request's id first)
TAGS = {
    "a datatype": (
        [_fp32("INPUT0"), _int32("INPUT1")],
        [],
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
        True,
    ),
    "an input twice": ([_int32("INPUT0"), _int32("INPUT0")], [], "input 'INPUT0' already", True),
    "the input count": ([_int32("INPUT0")], [], "expected 2 inputs but got 1 inputs", True),
    "an unknown output (model.cc)": (
        [_int32("INPUT0"), _int32("INPUT1")],
        ["OUTPUT9"],
        "unexpected inference output 'OUTPUT9' for model 'simple'",
        False,
    ),
    "an unknown input (model.cc)": (
        [_int32("INPUT0"), _int32("NOPE")],
        [],
        "unexpected inference input 'NOPE' for model 'simple'",
        False,
    ),
    "an element count past int64 (its HTTP front)": (
        [tensor("INPUT0", "INT32", [16, 2**60 + 2], [0]), _int32("INPUT1")],
        [],
        "invalid shape for input 'INPUT0': shape [16,1152921504606846978] causes total element",
        False,
    ),
}


@pytest.mark.parametrize("request_id", ["req-7", None, ""])
@pytest.mark.parametrize("case", list(TAGS))
def test_the_request_id_first_where_triton_puts_it(
    server: ServerProcess, case: str, request_id: str | None
) -> None:
    """Core's refusals of a request start ``[request id: <id>] `` (InferenceRequest::
    LogRequest; ``<id_unknown>`` without an id, or an empty one); model.cc's and its HTTP
    front's do not. REST and gRPC alike; until 2026-11-30 none had it."""
    inputs, outputs, words, tagged = TAGS[case]
    head = f"[request id: {request_id or '<id_unknown>'}] " if tagged else ""
    for message in refusals(server, "simple", inputs, outputs, request_id=request_id):
        assert message.startswith(head + words), message
