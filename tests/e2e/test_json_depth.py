"""Triton's nesting limit on JSON ``data``: a value inside 100 nested arrays is refused.

Triton (``HTTP_MAX_JSON_NESTING_DEPTH``) counts the outermost array as depth 0 and
refuses any value at depth 100 with "JSON nesting depth exceeds maximum allowed limit
(100)"; its ``test_json_recursion_depth_limit`` sends a [1, 1] tensor nested 120 deep
(refused) and 50 deep (served), as BYTES and as INT64. Here the same over plain HTTP,
the boundary (99 served, 100 refused), and the paths a large body takes: simdjson's
fast path (from 16 KiB of ``data``) and a worker's decoding (from a 1 MiB body).
"""

from __future__ import annotations

import json

import pytest

from tests.support.http import request
from tests.support.server import ServerProcess

PHRASE = "JSON nesting depth exceeds maximum allowed limit (100)"
#: (model, datatype, the value nested)
MODELS = {"BYTES": ("simple_identity", '"hello"'), "INT64": ("identity_int64", "123")}


def nested(depth: int, value: str) -> str:
    """``value`` inside ``depth`` arrays, as JSON text (no recursion: any depth)."""
    return "[" * depth + value + "]" * depth


def infer(server: ServerProcess, datatype: str, shape: list[int], data: str) -> tuple[int, dict]:
    model, _ = MODELS[datatype]
    header = {"name": "INPUT0", "datatype": datatype, "shape": shape}
    body = '{"inputs": [' + json.dumps(header)[:-1] + ', "data": ' + data + "}]}"
    headers = {"Content-Type": "application/json"}
    status, _, answer = request(server, "POST", f"/v2/models/{model}/infer", body, headers)
    return status, json.loads(answer)


@pytest.mark.parametrize("datatype", list(MODELS))
@pytest.mark.parametrize("depth", [50, 99])
def test_up_to_99_arrays_are_served(server: ServerProcess, datatype: str, depth: int) -> None:
    status, answer = infer(server, datatype, [1, 1], nested(depth, MODELS[datatype][1]))
    if datatype == "INT64" and depth > 64:
        # NOTE: numpy holds at most 64 dimensions; deeper numbers are refused as before
        #   (a 400 of ours; Triton serves them).
        assert status == 400 and PHRASE not in answer["error"], answer
        return
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["data"] == [json.loads(MODELS[datatype][1])]


@pytest.mark.parametrize("datatype", list(MODELS))
@pytest.mark.parametrize("depth", [100, 101, 120, 5000])
def test_100_or_more_arrays_are_refused(server: ServerProcess, datatype: str, depth: int) -> None:
    status, answer = infer(server, datatype, [1, 1], nested(depth, MODELS[datatype][1]))
    assert status == 400, answer
    assert PHRASE in answer["error"], answer
    assert "INPUT0" in answer["error"] or depth == 5000, answer


def test_a_deep_empty_array_counts_as_triton_counts_it(server: ServerProcess) -> None:
    # 101 arrays, the innermost empty: an array at depth 100.
    status, answer = infer(server, "BYTES", [1, 0], nested(100, "[]"))
    assert status == 400 and PHRASE in answer["error"], answer


@pytest.mark.parametrize(
    "count",
    [
        5_000,  # 25 KB of data: simdjson's fast path (json_numbers)
        300_000,  # a 1.5 MB body: decoded by a worker (json_offload)
    ],
)
def test_large_deep_numbers_are_refused_on_every_path(server: ServerProcess, count: int) -> None:
    row = "[" + ",".join(["12345"] * count) + "]"
    status, answer = infer(server, "INT64", [1, count], nested(99, row))
    assert status == 400, answer
    assert PHRASE in answer["error"] and "INPUT0" in answer["error"], answer
    # as deep as numpy allows (64 dimensions) is served
    status, answer = infer(server, "INT64", [1, count], nested(62, row))
    assert status == 200, answer
    assert answer["outputs"][0]["shape"] == [1, count]


@pytest.mark.parametrize("value", [nested(250_000, "true"), "[true]", "1", '"yes"'])
def test_repository_index_refuses_a_ready_that_is_not_a_boolean(
    server: ServerProcess, value: str
) -> None:
    """Triton's ``test_repository_index_deeply_nested_json``: a 'ready' nested 250,000
    deep is refused in Triton's words (the body is decoded against its type, so the value
    is refused where it starts), and the server stays live."""
    headers = {"Content-Type": "application/json"}
    body = '{"ready":' + value + "}"
    status, _, answer = request(server, "POST", "/v2/repository/index", body, headers)
    assert status == 400, answer
    assert "Invalid value for 'ready': expected a boolean" in json.loads(answer)["error"]
    assert request(server, "GET", "/v2/health/live")[0] == 200
