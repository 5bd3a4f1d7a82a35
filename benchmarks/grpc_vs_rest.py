"""gRPC next to REST-binary and REST-JSON, same server, same run.

Starts ``oipserve serve`` on the sample repository (127.0.0.1, free ports),
then drives each (workload, protocol) pair with a few closed-loop client
threads using tritonclient, bounded by both a duration and a request count,
and prints one table: requests/s, p50 and p99 latency, payload MB/s (request
plus response tensor bytes), and each protocol's throughput relative to gRPC.

    python benchmarks/grpc_vs_rest.py                 # defaults: 3 s, 4 clients
    python benchmarks/grpc_vs_rest.py --seconds 5 --clients 8 --max-requests 20000

Numbers include the Python client's own cost (tritonclient encodes JSON and
protobuf in Python), as a Python user would see them.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

ONE_MIB_FLOATS = 256 * 1024


@dataclass
class Workload:
    name: str
    model: str
    tensors: list[tuple[str, np.ndarray, str]]
    #: Output tensor bytes per response, for MB/s.
    out_bytes: int

    @property
    def in_bytes(self) -> int:
        return sum(t[1].nbytes for t in self.tensors)


def workloads() -> list[Workload]:
    rng = np.random.default_rng(0)
    a = rng.integers(-100, 100, (1, 16), dtype=np.int32)
    b = rng.integers(-100, 100, (1, 16), dtype=np.int32)
    big = rng.random((1, ONE_MIB_FLOATS), dtype=np.float32)
    return [
        Workload("simple", "simple", [("INPUT0", a, "INT32"), ("INPUT1", b, "INT32")], 2 * 64),
        Workload("1MiB FP32", "identity_fp32", [("INPUT0", big, "FP32")], big.nbytes),
    ]


def grpc_call(url: str, work: Workload) -> Callable[[], None]:
    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, data, datatype in work.tensors:
        inp = grpcclient.InferInput(name, list(data.shape), datatype)
        inp.set_data_from_numpy(data)
        inputs.append(inp)

    def call() -> None:
        result = client.infer(work.model, inputs)
        result.as_numpy(result.get_response().outputs[0].name)

    return call


def rest_call(url: str, work: Workload, binary: bool) -> Callable[[], None]:
    client = httpclient.InferenceServerClient(url)
    inputs = []
    for name, data, datatype in work.tensors:
        inp = httpclient.InferInput(name, list(data.shape), datatype)
        inp.set_data_from_numpy(data, binary_data=binary)
        inputs.append(inp)
    outputs = None
    if not binary:
        names = ["OUTPUT0", "OUTPUT1"] if work.model == "simple" else ["OUTPUT0"]
        outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in names]

    def call() -> None:
        result = client.infer(work.model, inputs, outputs=outputs)
        result.as_numpy("OUTPUT0")

    return call


@dataclass
class Row:
    workload: str
    protocol: str
    requests: int
    seconds: float
    latencies: list[float]
    bytes_per_request: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1000 if self.latencies else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.rps * self.bytes_per_request / 1e6


def drive(
    make_call: Callable[[], Callable[[], None]], clients: int, seconds: float, max_requests: int
) -> tuple[int, float, list[float]]:
    """Closed loop: each thread sends its next request when the last is answered.

    Each thread makes its own client (tritonclient.http's gevent client must
    stay on the thread that made it) and warms it up before the clock starts.
    """
    latencies: list[list[float]] = [[] for _ in range(clients)]
    budget = threading.Semaphore(max_requests)
    window: list[float] = []  # the start time, set once every thread is warm
    ready = threading.Barrier(clients + 1, action=lambda: window.append(time.perf_counter()))
    errors: list[BaseException] = []

    def loop(index: int) -> None:
        mine = latencies[index]
        try:
            call = make_call()
            call()  # connection and model warm-up
        except BaseException as exc:
            errors.append(exc)
            ready.abort()
            return
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            return
        deadline = window[0] + seconds
        try:
            while time.perf_counter() < deadline and budget.acquire(blocking=False):
                t0 = time.perf_counter()
                call()
                mine.append(time.perf_counter() - t0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        pass
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - window[0] if window else 0.0
    if errors:
        raise errors[0]
    merged = [x for part in latencies for x in part]
    return len(merged), elapsed, merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--max-requests", type=int, default=50_000, help="per measurement")
    parser.add_argument("--repository", type=Path, default=ROOT / "model-repository")
    args = parser.parse_args(argv)

    server = ServerProcess(args.repository, args=["--host", "127.0.0.1"]).wait_ready()
    rows: list[Row] = []
    try:
        for work in workloads():
            protocols: dict[str, Callable[[], Callable[[], None]]] = {
                "gRPC": lambda w=work: grpc_call(server.grpc_url, w),
                "REST-binary": lambda w=work: rest_call(server.host_port, w, True),
                "REST-JSON": lambda w=work: rest_call(server.host_port, w, False),
            }
            for protocol, make_call in protocols.items():
                count, elapsed, latencies = drive(
                    make_call, args.clients, args.seconds, args.max_requests
                )
                rows.append(
                    Row(
                        work.name,
                        protocol,
                        count,
                        elapsed,
                        latencies,
                        work.in_bytes + work.out_bytes,
                    )
                )
    finally:
        server.stop()

    print(
        f"\n{args.clients} clients, {args.seconds:g} s (at most {args.max_requests} requests) "
        "per row, 127.0.0.1\n"
    )
    header = (
        f"{'workload':<11} {'protocol':<12} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'MB/s':>8} {'vs gRPC':>8}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        grpc_row = next(r for r in rows if r.workload == row.workload and r.protocol == "gRPC")
        ratio = row.rps / grpc_row.rps if grpc_row.rps else 0.0
        print(
            f"{row.workload:<11} {row.protocol:<12} {row.rps:>9.1f} {row.percentile(50):>8.2f} "
            f"{row.percentile(99):>8.2f} {row.mb_per_s:>8.1f} {ratio:>7.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
