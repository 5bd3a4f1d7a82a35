"""The floor: the same .onnx in ONNX Runtime called in-process, no server, no protocol.

Runs as its own process (the harness's interpreter, i.e. oipserve's ORT build) with the same
session settings as the servers: `--sessions` sessions of `--intra` threads, each driven by its
own Python thread (ORT releases the GIL in run()), which is what N server instances can do
at best on this machine.

    python floor.py --model M.onnx --input NAME=file.npy [...] --sessions 2 --duration 3
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
import onnxruntime as ort


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--intra", type=int, default=1)
    parser.add_argument("--inter", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--max-calls", type=int, default=5_000_000)
    ns = parser.parse_args()

    feeds = {}
    for item in ns.input:
        name, path = item.split("=", 1)
        feeds[name] = np.load(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = ns.intra
    options.inter_op_num_threads = ns.inter
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sessions = [
        ort.InferenceSession(ns.model, options, providers=["CPUExecutionProvider"])
        for _ in range(ns.sessions)
    ]
    counts = [0] * ns.sessions
    latencies: list[list[int]] = [[] for _ in range(ns.sessions)]
    start_at = time.monotonic() + ns.warmup
    end_at = start_at + ns.duration
    cap = max(1, ns.max_calls // ns.sessions)

    def drive(i: int) -> None:
        session, out = sessions[i], latencies[i]
        while True:
            t0 = time.perf_counter_ns()
            session.run(None, feeds)
            t1 = time.perf_counter_ns()
            now = time.monotonic()
            if now >= end_at or counts[i] >= cap:
                return
            if now >= start_at:
                counts[i] += 1
                out.append(t1 - t0)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(ns.sessions)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, start_at - time.monotonic()))
    c0 = time.process_time()
    for t in threads:
        t.join(timeout=ns.warmup + ns.duration + 60)
    c1 = time.process_time()
    lat = np.concatenate([np.asarray(x, dtype=np.int64) for x in latencies]) / 1000.0
    points = [1, 5, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95, 97.5, 99, 99.5, 99.9]
    pct = np.percentile(lat, points).tolist() if lat.size else [0.0] * len(points)
    print(
        json.dumps(
            {
                "ok": True,
                "requests": int(sum(counts)),
                "duration_s": ns.duration,
                "percentiles_us": [[p, v] for p, v in zip(points, pct, strict=True)],
                "mean_us": float(lat.mean()) if lat.size else 0.0,
                "cpu_s": c1 - c0,
                "ort_version": ort.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
