"""Outputs a worker printed as JSON text, spliced into the response where they belong.

The text goes to the socket as a view of the worker's segment: the response must be the
same JSON the front would have written, alone or beside binary outputs, and the segment
must be released only once the last view is gone.
"""

from __future__ import annotations

import asyncio
import gc
import json

import falcon.asgi
import numpy as np
import orjson

from oipserve.front.rest.media import HEADER_LENGTH
from oipserve.front.rest.render import PRINT_STEP, outputs_to_print, print_in_steps, render_infer
from oipserve.models.registry import ModelVersion
from oipserve.request.inference import InferResult, OutputTensor
from oipserve.wire.datatypes import encode_bytes_elements


class FakeRequest:
    def __init__(self, headers: dict[str, str] | None = None) -> None:
        self.headers = headers or {}

    def get_header(self, name: str) -> str | None:
        return self.headers.get(name)


def _printed(values: np.ndarray) -> memoryview:
    return memoryview(orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY))


def _body(resp: falcon.asgi.Response) -> bytes:
    if resp.stream is None:
        return resp.data

    async def collect() -> bytes:
        return b"".join([bytes(part) async for part in resp.stream])

    return asyncio.run(collect())


def test_texts_beside_binary_and_plain_outputs() -> None:
    first = np.arange(70_000, dtype=np.float32) / 7
    second = np.arange(3, dtype=np.int64)
    third = np.arange(80_000, dtype=np.int32)
    released: list[bool] = []
    outputs = [
        OutputTensor("A", "FP32", [1, first.size], _printed(first), text=True),
        OutputTensor("B", "INT64", [3], memoryview(second.tobytes())),
        OutputTensor("C", "INT32", [third.size], memoryview(third.tobytes())),
        OutputTensor("D", "FP32", [first.size], _printed(first[::-1].copy()), text=True),
    ]
    result = InferResult(ModelVersion("m", "1", "", None), outputs, lambda: released.append(True))
    resp = falcon.asgi.Response()
    render_infer(FakeRequest(), resp, result, "id\x00", [False, False, True, False], False)  # type: ignore[arg-type]
    body = _body(resp)
    header_size = int(resp.headers[HEADER_LENGTH.lower()])
    answer = json.loads(body[:header_size])
    assert answer["id"] == "id\x00"  # a NUL of the client's is escaped, never a mark
    by_name = {o["name"]: o for o in answer["outputs"]}
    np.testing.assert_array_equal(np.array(by_name["A"]["data"], dtype=np.float32), first)
    assert by_name["B"]["data"] == [0, 1, 2]
    assert by_name["C"]["parameters"] == {"binary_data_size": third.nbytes}
    np.testing.assert_array_equal(np.frombuffer(body[header_size:], np.int32), third)
    np.testing.assert_array_equal(np.array(by_name["D"]["data"], dtype=np.float32), first[::-1])
    del resp, body
    gc.collect()
    assert released == [True]


def test_a_text_alone_is_plain_json() -> None:
    values = np.linspace(0, 1, 100_000, dtype=np.float32)
    result = InferResult(
        ModelVersion("m", "1", "", None),
        [OutputTensor("A", "FP32", [100_000], _printed(values), text=True)],
        lambda: None,
    )  # type: ignore[arg-type]
    resp = falcon.asgi.Response()
    render_infer(FakeRequest(), resp, result, None, None, False)  # type: ignore[arg-type]
    assert resp.content_type == "application/json"
    expected = orjson.dumps(
        {
            "model_name": "m",
            "model_version": "1",
            "outputs": [{"name": "A", "datatype": "FP32", "shape": [100_000], "data": values}],
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    assert _body(resp) == expected  # byte for byte what the front prints itself


def test_an_output_printed_in_steps_is_the_text_of_the_whole_array() -> None:
    values = np.random.default_rng(0).standard_normal(PRINT_STEP * 3 + 7).astype(np.float32)
    small = np.arange(5, dtype=np.int64)
    outputs = [
        OutputTensor("A", "FP32", [values.size], memoryview(values.tobytes())),
        OutputTensor("B", "INT64", [5], memoryview(small.tobytes())),
    ]
    result = InferResult(ModelVersion("m", "1", "", None), outputs, lambda: None)
    assert outputs_to_print(result, None, True) == []
    printing = outputs_to_print(result, None, False)
    assert printing == [outputs[0]]
    asyncio.run(print_in_steps(result, printing))
    assert outputs[0].text and not outputs[1].text
    resp = falcon.asgi.Response()
    render_infer(FakeRequest(), resp, result, None, None, False)  # type: ignore[arg-type]
    expected = orjson.dumps(
        {
            "model_name": "m",
            "model_version": "1",
            "outputs": [
                {"name": "A", "datatype": "FP32", "shape": [values.size], "data": values},
                {"name": "B", "datatype": "INT64", "shape": [5], "data": small},
            ],
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    assert _body(resp) == expected


def test_a_bytes_output_printed_in_steps_is_the_text_of_the_whole_list() -> None:
    elements = [f"row {i} é".encode() for i in range(PRINT_STEP + 1000)] + [b"\xff bad \xfe"]
    data = memoryview(encode_bytes_elements(elements))
    result = InferResult(
        ModelVersion("m", "1", "", None),
        [OutputTensor("S", "BYTES", [len(elements)], data)],
        lambda: None,
    )
    printing = outputs_to_print(result, None, False)
    assert printing == result.outputs
    asyncio.run(print_in_steps(result, printing))
    resp = falcon.asgi.Response()
    render_infer(FakeRequest(), resp, result, None, None, False)  # type: ignore[arg-type]
    texts = [element.decode("utf-8", "replace") for element in elements]
    entry = {"name": "S", "datatype": "BYTES", "shape": [len(elements)], "data": texts}
    expected = orjson.dumps({"model_name": "m", "model_version": "1", "outputs": [entry]})
    assert _body(resp) == expected
