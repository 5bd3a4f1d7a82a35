"""How long the front's event loop stalls while large requests run (issue #18's 20 ms goal).

Starts a server on the sample repository (identity_fp32 only), then, for each case, probes
``GET /v2/health/live`` (answered by the front alone) every 2 ms on a keep-alive connection
while two clients each send two large requests, and prints the worst and p99 probe
latency. REST client threads only send and read bytes (no JSON parsing while probing: that
would hold this process's GIL); gRPC clients run as processes of their own (grpc's Python
layer holds the GIL while it copies a large message). The gRPC cases also probe
``ServerLive`` over gRPC (the same loop, through its HTTP/2).

    python benchmarks/loop_stalls.py [--only rest|grpc]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

ELEMENTS = 4_000_000
#: The largest gRPC case: 122 MiB of FP32 each way (the 20 ms goal was missed from ~30 MiB).
GRPC_ELEMENTS = 32_000_000


def _rest_probe(server: ServerProcess) -> tuple[Callable[[], None], Callable[[], None]]:
    probe = http.client.HTTPConnection(server.host_port, timeout=30)

    def ask() -> None:
        probe.request("GET", "/v2/health/live")
        probe.getresponse().read()

    return ask, probe.close


def _grpc_probe(server: ServerProcess) -> tuple[Callable[[], None], Callable[[], None]]:
    import grpc

    channel = grpc.insecure_channel(server.grpc_url)
    live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")

    def ask() -> None:
        live(b"", timeout=30)

    return ask, channel.close


def probe_while(
    server: ServerProcess, send: Callable[[], None], clients: int, grpc_too: bool = False
) -> str:
    threads = [threading.Thread(target=send) for _ in range(clients)]
    probes = [("REST", *_rest_probe(server))]
    if grpc_too:
        probes.append(("gRPC", *_grpc_probe(server)))
    latencies: dict[str, list[float]] = {name: [] for name, _, _ in probes}
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        for name, ask, _ in probes:
            start = time.perf_counter()
            ask()
            latencies[name].append(time.perf_counter() - start)
        time.sleep(0.002)
    for thread in threads:
        thread.join()
    lines = []
    for name, _, close in probes:
        close()
        times = sorted(latencies[name])
        p99 = times[int(len(times) * 0.99)]
        lines.append(
            f"{name} probe worst {times[-1] * 1e3:6.1f} ms   p99 {p99 * 1e3:5.1f} ms   "
            f"probes {len(times)}"
        )
    return ("\n" + " " * 39).join(lines)


def grpc_sender(server: ServerProcess, elements: int) -> Callable[[], None]:
    """Two identity calls of ``elements`` FP32 values, from a process of its own."""

    def send() -> None:
        subprocess.run(
            [sys.executable, __file__, "--send-grpc", server.grpc_url, str(elements)],
            check=True,
        )

    return send


def send_grpc(url: str, elements: int) -> None:
    import grpc
    from tritonclient.grpc import service_pb2

    values = np.random.default_rng(1).random((1, elements), dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(values.shape))
    request.raw_input_contents.append(values.tobytes())
    wire = request.SerializeToString()  # the wire bytes, made once
    limit = 1 << 30
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    with grpc.insecure_channel(url, options=options) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for _ in range(2):
            infer(wire, timeout=120)


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
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["rest", "grpc"])
    parser.add_argument("--send-grpc", nargs=2, metavar=("URL", "ELEMENTS"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.send_grpc:
        send_grpc(options.send_grpc[0], int(options.send_grpc[1]))
        return
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
        idle = [("idle", lambda: time.sleep(3), 1)]
        rest = [
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
        grpc_cases = [
            (f"{4 * n >> 20} MiB gRPC in and out", grpc_sender(server, n), 2)
            for n in (GRPC_ELEMENTS // 4, GRPC_ELEMENTS)
        ]
        for name, send, clients in idle:
            print(f"{name:38s} {probe_while(server, send, clients, True)}", flush=True)
        if options.only != "grpc":
            for name, send, clients in rest:
                print(f"{name:38s} {probe_while(server, send, clients)}", flush=True)
        if options.only != "rest":
            for name, send, clients in grpc_cases:
                print(f"{name:38s} {probe_while(server, send, clients, True)}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
