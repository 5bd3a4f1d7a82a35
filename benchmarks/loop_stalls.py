"""How long the front's event loop stalls while large requests run (issue #18's 20 ms goal).

Starts a server on the sample repository (identity_fp32 only), then, for each case, probes
``GET /v2/health/live`` (answered by the front alone) every 2 ms on a keep-alive connection
while two client threads each send two large requests, and prints the worst and p99 probe
latency. Client threads only send and read bytes (no JSON parsing while probing: that
would hold this process's GIL).

    python benchmarks/loop_stalls.py
"""

from __future__ import annotations

import gzip
import http.client
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server import ServerProcess  # noqa: E402

ELEMENTS = 4_000_000


def probe_while(server: ServerProcess, send: Callable[[], None], clients: int) -> str:
    threads = [threading.Thread(target=send) for _ in range(clients)]
    probe = http.client.HTTPConnection(server.host_port, timeout=30)
    latencies = []
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        start = time.perf_counter()
        probe.request("GET", "/v2/health/live")
        probe.getresponse().read()
        latencies.append(time.perf_counter() - start)
        time.sleep(0.002)
    for thread in threads:
        thread.join()
    probe.close()
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)]
    return (
        f"worst {latencies[-1] * 1e3:6.1f} ms   p99 {p99 * 1e3:5.1f} ms   probes {len(latencies)}"
    )


def sender(server: ServerProcess, body: bytes, headers: dict[str, str]) -> Callable[[], None]:
    def send() -> None:
        for _ in range(2):
            connection = http.client.HTTPConnection(server.host_port, timeout=120)
            connection.request("POST", "/v2/models/identity_fp32/infer", body, headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"status {response.status}")
            connection.close()

    return send


def binary_request(values: np.ndarray) -> tuple[bytes, dict[str, str]]:
    tensor = {"name": "INPUT0", "shape": [1, values.size], "datatype": "FP32"}
    header = json.dumps(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": values.nbytes}}]}
    ).encode()
    return header + values.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def main() -> None:
    values = np.random.default_rng(0).random(ELEMENTS, dtype=np.float32)
    tensor = {"name": "INPUT0", "shape": [1, values.size], "datatype": "FP32"}
    json_body = json.dumps(
        {
            "inputs": [{**tensor, "data": values.tolist()}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    binary_body, binary_headers = binary_request(values)
    small_body, small_headers = binary_request(values[: ELEMENTS // 4])
    args = ["--model-control-mode", "explicit", "--load-model", "identity_fp32"]
    server = ServerProcess(args=args).wait_ready()
    try:
        cases = [
            ("idle", lambda: time.sleep(3), 1),
            (f"{len(json_body) >> 20} MiB JSON request", sender(server, json_body, {}), 2),
            (
                f"{values.nbytes >> 20} MiB binary in, JSON out",
                sender(server, binary_body, binary_headers),
                2,
            ),
            (
                "the JSON request gzip-compressed",
                sender(server, gzip.compress(json_body, 1), {"Content-Encoding": "gzip"}),
                2,
            ),
            (
                f"{small_body.__len__() >> 20} MiB binary in, gzip JSON out",
                sender(server, small_body, {**small_headers, "Accept-Encoding": "gzip"}),
                2,
            ),
        ]
        for name, send, clients in cases:
            print(f"{name:38s} {probe_while(server, send, clients)}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
