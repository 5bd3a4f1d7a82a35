"""Plain HTTP requests to a test server, and the answers the management tests read back.

``http.client`` rather than a library client: a test sees the status, headers and body as
the server sent them, errors included.
"""

from __future__ import annotations

import http.client
import json

import numpy as np
import tritonclient.http as httpclient

from tests.support.server import ServerProcess


def request(
    server: ServerProcess,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own: (status, lower-cased headers, body)."""
    conn = http.client.HTTPConnection(server.host_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post(srv: ServerProcess, path: str, body: object = None) -> tuple[int, bytes]:
    """POST ``body`` (bytes or text as they are, anything else as JSON): status and body."""
    data = None if body is None else body if isinstance(body, str | bytes) else json.dumps(body)
    status, _, payload = request(srv, "POST", path, data)
    return status, payload


def get(srv: ServerProcess, path: str) -> tuple[int, object]:
    """GET ``path``: the status and the decoded JSON answer."""
    status, _, payload = request(srv, "GET", path)
    return status, json.loads(payload)


def fp32_infer(srv: ServerProcess, model: str, n: int = 4) -> np.ndarray:
    """Infer ``[0, n)`` on an FP32 identity ``model`` and check it comes back unchanged."""
    client = httpclient.InferenceServerClient(srv.host_port)
    x = np.arange(n, dtype=np.float32).reshape(1, n)
    inp = httpclient.InferInput("INPUT0", [1, n], "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer(model, [inp]).as_numpy("OUTPUT0")
    assert np.array_equal(out, x)
    return out


def placements(srv: ServerProcess) -> dict[str, list[tuple[str, int]]]:
    """model -> sorted (device, worker id) of every session it has (``GET /v2/hardware``)."""
    status, _, raw = request(srv, "GET", "/v2/hardware")
    assert status == 200
    found: dict[str, list[tuple[str, int]]] = {}
    for device, info in json.loads(raw)["devices"].items():
        for instance in info.get("instances", []):
            found.setdefault(instance["model"], []).append((device, instance["worker"]))
    return {model: sorted(where) for model, where in found.items()}
