"""What a deployment hands the server: KServe's tritonserver command line, the layouts
KServe's storage initializer leaves at /mnt/models, a tritonclient inference of the model
served there, and a way to see that a mounted (read-only) model repository was not written
to."""

from __future__ import annotations

import datetime
import hashlib
import http.client
import json
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.h2_rest import H2c
from tests.support.http import request
from tests.support.server import SAMPLE_REPOSITORY, ServerProcess
from tests.support.tensors import simple_inputs

# kserve/kserve config/runtimes/kserve-tritonserver.yaml, `args` of kserve-container.
KSERVE_TRITONSERVER_ARGS = [
    "tritonserver",
    "--model-store=/mnt/models",
    "--grpc-port=9000",
    "--http-port=8080",
    "--allow-grpc=true",
    "--allow-http=true",
]


def read_only(root: Path) -> None:
    """Make ``root`` and everything in it read-only, as KServe mounts /mnt/models."""
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & 0o555)


def fingerprint(root: Path) -> list[tuple[str, int, int, int, str]]:
    """Every entry under ``root``: path, size, mode, mtime (ns) and the content's sha256."""
    entries = []
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        name = str(path.relative_to(root))
        entries.append((name, stat.st_size, stat.st_mode, stat.st_mtime_ns, digest))
    stat = root.lstat()
    entries.append((".", stat.st_size, stat.st_mode, stat.st_mtime_ns, ""))
    return entries


#: What a bucket may hold, as KServe's storage initializer copies it to /mnt/models (the
#: storage URI pointing at the bucket, or at one model's directory in it). Each is the sample
#: model ``simple`` (whose config.pbtxt names it "simple", not the InferenceService).
KSERVE_LAYOUTS = {
    # s3://bucket/model.onnx: a bare model file.
    "bare": ("model.onnx",),
    # s3://bucket/{model.onnx,config.pbtxt}
    "bare-config": ("model.onnx", "config.pbtxt"),
    # s3://bucket/densenet/ (the storage URI names the model's own directory).
    "model-dir": ("1/model.onnx", "config.pbtxt"),
    # s3://bucket/ holding one Triton model directory.
    "single-dir": ("densenet/1/model.onnx", "densenet/config.pbtxt"),
    # s3://bucket/ holding one directory with a bare model file in it.
    "single-dir-bare": ("densenet/model.onnx",),
    # A Triton repository of one model named as the InferenceService (served as today).
    "triton": ("NAME/1/model.onnx", "NAME/config.pbtxt"),
}


def write_kserve_layout(root: Path, layout: str, name: str) -> Path:
    """Fill ``root`` (made here) as ``layout`` of ``KSERVE_LAYOUTS``; ``NAME`` is ``name``."""
    sample = SAMPLE_REPOSITORY / "simple"
    for entry in KSERVE_LAYOUTS[layout]:
        target = root / entry.replace("NAME", name)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = sample / ("config.pbtxt" if entry.endswith(".pbtxt") else "1/model.onnx")
        shutil.copyfile(source, target)
    root.mkdir(parents=True, exist_ok=True)
    return root


def infer_simple_http(host_port: str, model: str) -> dict[str, str]:
    """Infer the sample ``simple`` served as ``model`` over HTTP (tritonclient: it posts to
    ``/v2/models/<model>/infer``), check its sums; returns the model's metadata."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    client = httpclient.InferenceServerClient(host_port)
    try:
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer(model, inputs)
        assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
        assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
        assert result.get_response()["model_name"] == model
        metadata: dict[str, str] = client.get_model_metadata(model)
        return metadata
    finally:
        client.close()


def infer_simple_grpc(url: str, model: str) -> None:
    """The same over gRPC (``ModelInfer`` with ``model_name`` ``model``)."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    client = grpcclient.InferenceServerClient(url)
    try:
        result = client.infer(model, simple_inputs(a, b))
        assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    finally:
        client.close()


def rest_over_h2c(port: int, model: str) -> None:
    """REST as Knative's queue-proxy sends it to a port named ``h2c``: HTTP/2 with prior
    knowledge, every request a stream (the health probe's path, then an inference of the
    sample ``simple`` served as ``model``), on one connection."""
    a = list(range(16))
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [3] * 16},
        ]
    }
    with H2c("127.0.0.1", port) as h2:
        ready = h2.request("GET", "/v2/health/ready")
        assert ready.status == 200, ready
        answer = h2.request(
            "POST",
            f"/v2/models/{model}/infer",
            [("content-type", "application/json")],
            json.dumps(body).encode(),
        )
        assert answer.status == 200, answer
        outputs = {o["name"]: o["data"] for o in json.loads(answer.body)["outputs"]}
        assert outputs["OUTPUT0"] == [x + 3 for x in a]


def free_port() -> int:
    """A TCP port free now on 127.0.0.1, for a server that must be probed before it says
    which port it took (a Kubernetes probe knows the port from the manifest)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe_status(port: int, path: str, timeout: float = 1.0) -> int | None:
    """What a kubelet httpGet probe sees: the status, or None (refused, or no answer within
    ``timeout``, as the probe's ``timeoutSeconds``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def logged_at(log: str, text: str) -> datetime.datetime | None:
    """When the server logged the first line holding ``text`` (its local time stamp)."""
    for line in log.splitlines():
        if text in line:
            return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return None


def readiness_while(
    srv: ServerProcess, name: str, load: threading.Thread
) -> dict[str, set[object]]:
    """Probe while ``load`` runs: the statuses of /v2/health/ready and of ``name``'s ready,
    over REST and gRPC, five times each; the load must outlast the probes."""
    seen: dict[str, set[object]] = {
        "server": set(),
        "model": set(),
        "grpc server": set(),
        "grpc": set(),
    }
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        for _ in range(5):
            seen["server"].add(request(srv, "GET", "/v2/health/ready")[0])
            status, _, body = request(srv, "GET", f"/v2/models/{name}/ready")
            seen["model"].add((status, json.loads(body).get("ready")))
            seen["grpc server"].add(client.is_server_ready())
            seen["grpc"].add(client.is_model_ready(name))
    finally:
        client.close()
    assert load.is_alive(), "the load ended before the probes did: make the model slower"
    return seen
