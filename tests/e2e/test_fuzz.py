"""Randomised bad requests: whatever a client sends, the answer is 200 or a clear 4xx."""

from __future__ import annotations

import json
import random

from tests.support.http import request
from tests.support.server import ServerProcess

#: reshape's SHAPE values reach ONNX Runtime, whose refusal must be a 400 too.
MODELS = {
    "reshape": [("DATA", "FP32", [6]), ("SHAPE", "INT64", [2])],
    "simple": [("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])],
    "identity_fp32": [("INPUT0", "FP32", [2, 3])],
    "identity_bytes": [("INPUT0", "BYTES", [1, 2])],
    "identity_bool": [("INPUT0", "BOOL", [1, 2])],
    "identity_uint8": [("INPUT0", "UINT8", [1, 2])],
    "image_nhwc_u8": [("image", "UINT8", [1, 224, 224, 3])],
    "versioned": [("INPUT0", "FP32", [3])],
}
DATATYPES = ["BOOL", "UINT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "BF16", "BYTES", "X"]
ODD_VALUES: list[object] = [
    None,
    True,
    0,
    -1,
    2**31,
    2**64,
    10**400,
    1.5,
    -1e308,
    "",
    "a",
    "é",
    [],
    [[]],
    {},
    {"a": 1},
    [1, "a"],
    [[1, 2], [3]],
    [True, 1],
    ["aGVsbG8="],
    [None],
]


def mutate(rng: random.Random, model: str) -> object:
    inputs = []
    for name, datatype, shape in MODELS[model]:
        count = 1
        for d in shape:
            count *= d
        entry: dict[str, object] = {
            "name": name,
            "datatype": datatype,
            "shape": list(shape),
            "data": [1] * min(count, 64),
        }
        choice = rng.randrange(9)
        if choice == 0:
            entry["datatype"] = rng.choice(DATATYPES)
        elif choice == 1:
            entry["shape"] = [rng.choice([-5, 0, 1, 2, 3, 2**40, 10**30]) for _ in shape]
        elif choice == 2:
            entry["data"] = rng.choice(ODD_VALUES)
        elif choice == 3:
            del entry[rng.choice(["name", "datatype", "shape", "data"])]
        elif choice == 4:
            entry["parameters"] = {rng.choice(["binary_data_size", "x"]): rng.choice(ODD_VALUES)}
        elif choice == 5:
            entry["name"] = rng.choice(["", "nope", name * 50])
        elif choice == 6:
            entry["data"] = [rng.choice(ODD_VALUES) for _ in range(rng.randrange(1, 5))]
        elif choice == 7:
            entry["shape"] = rng.choice(ODD_VALUES)
        inputs.append(entry)
    body: dict[str, object] = {"inputs": inputs}
    if rng.random() < 0.3:
        body["outputs"] = [
            {
                "name": rng.choice(["OUTPUT0", "x", ""]),
                "parameters": {"binary_data": rng.choice(ODD_VALUES)},
            }
        ]
    if rng.random() < 0.2:
        body["parameters"] = {"binary_data_output": rng.choice(ODD_VALUES)}
    if rng.random() < 0.2:
        body["id"] = rng.choice(ODD_VALUES)
    return body


def test_random_bad_requests_never_get_a_5xx(server: ServerProcess) -> None:
    rng = random.Random(20261122)
    seen: dict[int, int] = {}
    for _ in range(400):
        model = rng.choice(list(MODELS))
        body = json.dumps(mutate(rng, model))
        status, headers, raw = request(server, "POST", f"/v2/models/{model}/infer", body)
        seen[status] = seen.get(status, 0) + 1
        assert status in (200, 400, 404, 413), (status, body[:300], raw[:300])
        if status != 200:
            assert set(json.loads(raw)) == {"error"}, raw
    assert seen.get(400, 0) > 100
    status, _, _ = request(server, "GET", "/v2/health/ready")
    assert status == 200


def test_random_binary_bodies_never_get_a_5xx(server: ServerProcess) -> None:
    rng = random.Random(7)
    for _ in range(300):
        model = rng.choice(["identity_fp32", "identity_bytes", "simple", "image_nhwc_u8"])
        (name, datatype, shape), *_ = MODELS[model]
        size = rng.choice([0, 1, 3, 4, 8, 24, 64, 100])
        header = {
            "inputs": [
                {
                    "name": name,
                    "datatype": rng.choice([datatype, "BYTES"]),
                    "shape": rng.choice([list(shape), [1], [2], [size]]),
                    "parameters": {"binary_data_size": rng.choice([size, size + 1, 0])},
                }
            ]
        }
        head = json.dumps(header).encode()
        payload = rng.randbytes(size)
        if rng.random() < 0.3:
            payload = max(0, len(payload) - rng.randrange(0, 3)).to_bytes(4, "little") + payload
        length = rng.choice([len(head), len(head) - 1, 0, len(head) + 5])
        headers = {"Inference-Header-Content-Length": str(length)}
        if rng.random() < 0.1:
            headers["Content-Encoding"] = rng.choice(["gzip", "deflate", "br"])
        status, _, raw = request(
            server, "POST", f"/v2/models/{model}/infer", head + payload, headers
        )
        assert status in (200, 400, 404, 413, 501), (status, header, raw[:300])
        if status != 200:
            assert set(json.loads(raw)) == {"error"}, raw
    status, _, _ = request(server, "GET", "/v2/health/ready")
    assert status == 200
