"""Image inputs: what sending a JPEG costs compared with sending the pixels as a tensor.

One run starts its own oipserve on 127.0.0.1 (``--http-port 0``, only the two models it needs)
and measures, for the same 224x224 picture:

* ``jpeg bytes``   - the JPEG as one BYTES element, decoded by the worker (image_nhwc_u8);
* ``uint8 tensor`` - the decoded pixels as a binary UINT8 [1,224,224,3] tensor (image_nhwc_u8);
* ``fp32 tensor``  - the same pixels as a binary FP32 tensor (image_nhwc_fp32);

each as requests per second and p50/p99 latency over a bounded number of requests from
``--concurrency`` keep-alive connections (binary extension, only the small ``mean`` output
returned), plus the decode time per image of ``workers.images.decode_batch`` on this machine,
the work the JPEG path adds in the worker.

    python benchmarks/image_inputs.py [--requests 2000] [--concurrency 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import tritonclient.http as httpclient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from oipserve.wire.images import image_spec_for  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402
from workers.images import decode_batch  # noqa: E402

SIZE = 224


@dataclass
class Result:
    name: str
    body_bytes: int
    requests: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))


def make_image() -> np.ndarray:
    """A photo-like 224x224 BGR picture: gradients plus mild noise (fixed seed)."""
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    base = np.stack([x, y, (x + y) / 2], axis=-1) * (255 / SIZE)
    noise = np.random.default_rng(0).normal(0, 12, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def request_body(datatype: str, shape: list[int], array: np.ndarray) -> tuple[bytes, int]:
    """A binary-extension body (JSON header + tensor bytes) and its header length."""
    tensor = httpclient.InferInput("image", shape, datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    output = httpclient.InferRequestedOutput("mean", binary_data=True)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [tensor], outputs=[output]
    )
    return bytes(body), int(json_size or 0)


def run_load(
    host: str, port: int, model: str, body: bytes, header_length: int,
    requests: int, concurrency: int,
) -> tuple[float, list[float]]:  # fmt: skip
    """Send ``requests`` identical requests from ``concurrency`` threads; (seconds, ms each)."""
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(header_length),
    }
    path = f"/v2/models/{model}/infer"
    per_thread = [
        requests // concurrency + (i < requests % concurrency) for i in range(concurrency)
    ]
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[str] = []
    start = threading.Barrier(concurrency + 1)

    def worker(index: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        out = latencies[index]
        start.wait()
        try:
            for _ in range(per_thread[index]):
                t0 = time.perf_counter()
                conn.request("POST", path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                out.append((time.perf_counter() - t0) * 1000)
                if resp.status != 200:
                    errors.append(f"{resp.status}: {data[:200]!r}")
                    return
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{model}: {errors[0]}")
    return seconds, [x for chunk in latencies for x in chunk]


def decode_us(jpeg: bytes, repeats: int) -> float:
    """Median microseconds decode_batch needs for one 224x224 JPEG into a UINT8 NHWC input."""
    spec = image_spec_for("image", [-1, SIZE, SIZE, 3], "uint8", {})
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        decode_batch("image", [jpeg], spec)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per scenario (bounded)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=100, help="requests before measuring")
    parser.add_argument("--decode-repeats", type=int, default=500)
    parser.add_argument("--json", type=Path, help="also write the results here")
    ns = parser.parse_args()

    image = make_image()
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    jpeg = encoded.tobytes()
    pixels = cv2.imdecode(encoded, cv2.IMREAD_COLOR)[np.newaxis]  # what the JPEG path feeds
    scenarios = [
        ("jpeg bytes", "image_nhwc_u8", request_body("BYTES", [1], np.array([jpeg], object))),
        ("uint8 tensor", "image_nhwc_u8", request_body("UINT8", list(pixels.shape), pixels)),
        (
            "fp32 tensor",
            "image_nhwc_fp32",
            request_body("FP32", list(pixels.shape), pixels.astype(np.float32)),
        ),
    ]

    # The two image models only (explicit model control).
    flags = [
        "--host", "127.0.0.1",
        "--model-control-mode", "explicit",
        "--load-model", "image_nhwc_u8", "--load-model", "image_nhwc_fp32",
    ]  # fmt: skip
    server = ServerProcess(args=flags).wait_ready()
    host, port = server.host_port.rsplit(":", 1)
    results: list[Result] = []
    try:
        for name, model, (body, header_length) in scenarios:
            run_load(host, int(port), model, body, header_length, ns.warmup, ns.concurrency)
            seconds, latencies = run_load(
                host, int(port), model, body, header_length, ns.requests, ns.concurrency
            )
            results.append(Result(name, len(body), len(latencies), seconds, latencies))
    finally:
        server.stop()
    decode = decode_us(jpeg, ns.decode_repeats)

    print(
        f"224x224 JPEG ({len(jpeg)} bytes, quality 90), {ns.requests} requests per row,"
        f" concurrency {ns.concurrency}, 127.0.0.1, binary extension"
    )
    print(f"{'input':<14}{'body bytes':>12}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for r in results:
        print(
            f"{r.name:<14}{r.body_bytes:>12}{r.rps:>10.0f}{r.percentile(50):>10.2f}"
            f"{r.percentile(99):>10.2f}"
        )
    print(f"decode per image (decode_batch, in process): {decode:.0f} us")
    if ns.json:
        ns.json.write_text(
            json.dumps(
                {
                    "jpeg_bytes": len(jpeg),
                    "concurrency": ns.concurrency,
                    "decode_us_per_image": decode,
                    "rows": [
                        {
                            "input": r.name,
                            "body_bytes": r.body_bytes,
                            "requests": r.requests,
                            "rps": r.rps,
                            "p50_ms": r.percentile(50),
                            "p99_ms": r.percentile(99),
                        }
                        for r in results
                    ],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
