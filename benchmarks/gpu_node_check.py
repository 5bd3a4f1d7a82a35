"""What oipserve makes of a real GPU node: NVML discovery, worker placement, GPU metrics.

Starts `oipserve serve` on the sample repository with default devices (auto: every GPU,
else the CPU), then prints what an operator would look at: the start-up log, the
`/v2/hardware` inventory, `/v2/workers`, one inference per protocol-free check (REST JSON on
`simple`), the `nv_gpu_*` metric families, and whether SIGTERM left anything in /dev/shm.
The fake inventory covers these paths in the test suite; this runs them against NVML.

    python benchmarks/gpu_node_check.py [--devices auto] [--seconds-to-ready 120]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    ]
}


def _fetch(url: str, doc: object = None) -> str:
    """The reply's body, an error's body included (this reports, it does not judge)."""
    data = None if doc is None else json.dumps(doc).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.read().decode()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode()}"


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=1)
    except ValueError:
        return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--seconds-to-ready", type=float, default=120)
    ns = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
           os.environ.get("PYTHONPATH")]))}  # fmt: skip
    argv = [sys.executable, "-P", "-m", "oipserve", "serve", "--model-repository",
            str(ROOT / "model-repository"), "--http-port", "0", "--grpc-port", "0",
            "--metrics-port", "0", "--devices", ns.devices]  # fmt: skip
    shm_before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    assert proc.stdout is not None
    log: list[str] = []
    ready = threading.Event()
    addresses: dict[str, str] = {}

    def read_log() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            log.append(line.rstrip())
            # "ready http://..." or "not ready: ...; serving http://...": either way it serves
            match = re.search(r"(?:ready|serving) (http://\S+).*metrics=(\S+)", line)
            if match:
                addresses["http"], addresses["metrics"] = match.group(1), match.group(2)
                ready.set()

    threading.Thread(target=read_log, daemon=True).start()
    started = time.monotonic()
    try:
        if not ready.wait(ns.seconds_to_ready):
            print("\n".join(log))
            raise SystemExit(f"not ready after {ns.seconds_to_ready:.0f} s")
        print(f"== serving after {time.monotonic() - started:.1f} s")
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        print(f"== child processes: {len(children)}")
        http = addresses["http"]
        print("== start-up log (model lines: the first four)")
        model_lines = [line for line in log if "oipserve.models" in line]
        print("\n".join(model_lines[:4] + [line for line in log if line not in model_lines]))
        for path in ("/v2/hardware", "/v2/workers/onnxruntime", "/v2/models/simple/ready",
                     "/v2/models/stats"):  # fmt: skip
            print(f"== GET {path}")
            print(_pretty(_fetch(http + path)))
        for _ in range(100):  # some GPU work for the utilization gauge
            reply = _fetch(f"{http}/v2/models/simple/infer", SIMPLE)
        print("== POST /v2/models/simple/infer (the 100th)")
        print(reply)
        print("== GET /metrics (lines naming a GPU)")
        metrics = _fetch(f"http://{addresses['metrics']}/metrics")
        print("\n".join(line for line in metrics.splitlines() if "gpu" in line.lower()))
        print("== log since ready")
        print("\n".join(log[len(model_lines) + 4 :][-30:]))
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        time.sleep(0.5)
        left = sorted(set(os.listdir("/dev/shm")) - shm_before)
        print(f"== SIGTERM: exit {code}; left in /dev/shm: {left or 'nothing'}")


if __name__ == "__main__":
    main()
