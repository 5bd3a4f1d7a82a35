"""Request bodies (REST JSON, REST binary extension, gRPC spec) and decoding of replies.

Bodies are written to files once: wrk sends them verbatim and the gRPC client builds its
protobuf from the spec once, so the clients do no per-request encoding work.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from .models import NP_TO_OIP, OIP_TO_NP, ModelCase


@dataclass(frozen=True)
class HttpBody:
    """A request body file and the headers that go with it."""

    path: Path
    content_type: str
    header_length: int | None  # Inference-Header-Content-Length, None for JSON

    def headers(self) -> dict[str, str]:
        out = {"Content-Type": self.content_type}
        if self.header_length is not None:
            out["Inference-Header-Content-Length"] = str(self.header_length)
        return out


def json_body(case: ModelCase, out: Path) -> HttpBody:
    """Plain OIP JSON: every input as a flat `data` list, every output returned as JSON."""
    doc = {
        "inputs": [
            {
                "name": name,
                "shape": list(arr.shape),
                "datatype": NP_TO_OIP[arr.dtype],
                "data": arr.ravel().tolist(),
            }
            for name, arr in case.inputs.items()
        ]
    }
    out.write_bytes(json.dumps(doc, separators=(",", ":")).encode())
    # KServe reads a body without this header as binary; every peer accepts it.
    return HttpBody(out, "application/json", None)


def binary_body(case: ModelCase, out: Path) -> HttpBody:
    """Binary tensor extension both ways: raw input bytes after the JSON header, and every
    output requested with binary_data=true."""
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(arr.shape),
                "datatype": NP_TO_OIP[arr.dtype],
                "parameters": {"binary_data_size": arr.nbytes},
            }
            for name, arr in case.inputs.items()
        ],
        "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in case.output_names],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    raw = b"".join(np.ascontiguousarray(a).tobytes() for a in case.inputs.values())
    out.write_bytes(head + raw)
    return HttpBody(out, "application/octet-stream", len(head))


def jpeg_body(jpeg: bytes, input_name: str, output_name: str, out: Path) -> HttpBody:
    """One encoded JPEG as a BYTES [1] tensor (4-byte little-endian length prefix + bytes),
    sent with the binary extension; only the small `mean` output is requested."""
    raw = len(jpeg).to_bytes(4, "little") + jpeg
    header = {
        "inputs": [
            {
                "name": input_name,
                "shape": [1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "outputs": [{"name": output_name, "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    out.write_bytes(head + raw)
    return HttpBody(out, "application/octet-stream", len(head))


def grpc_spec(case: ModelCase, out_dir: Path) -> Path:
    """Spec for grpc_client.py: inputs as raw little-endian files (raw_input_contents)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = []
    for name, arr in case.inputs.items():
        path = out_dir / f"{case.name}.{name}.raw"
        path.write_bytes(np.ascontiguousarray(arr).tobytes())
        inputs.append(
            {
                "name": name,
                "datatype": NP_TO_OIP[arr.dtype],
                "shape": list(arr.shape),
                "file": str(path),
            }
        )
    spec = {"model_name": case.name, "inputs": inputs, "outputs": case.output_names}
    spec_path = out_dir / f"{case.name}.grpc.json"
    spec_path.write_text(json.dumps(spec))
    return spec_path


@dataclass
class HttpReply:
    status: int
    outputs: dict[str, np.ndarray]
    binary_outputs: bool
    text: str


def post(url: str, body: HttpBody, timeout_s: float = 10.0) -> HttpReply:
    """Send one request and decode the reply (JSON or binary extension)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("POST", parts.path, body=body.path.read_bytes(), headers=body.headers())
        resp = conn.getresponse()
        data = resp.read()
        hlen = resp.getheader("Inference-Header-Content-Length")
    finally:
        conn.close()
    json_part = data[: int(hlen)] if hlen else data
    try:
        doc = json.loads(json_part)
    except ValueError:
        return HttpReply(resp.status, {}, False, data[:300].decode("utf-8", "replace"))
    if resp.status != 200 or not isinstance(doc, dict):
        return HttpReply(resp.status, {}, False, json_part[:300].decode("utf-8", "replace"))
    outputs: dict[str, np.ndarray] = {}
    offset = int(hlen) if hlen else 0
    binary = False
    for out in doc.get("outputs", []):
        dtype = OIP_TO_NP.get(out.get("datatype", ""), np.dtype(np.float32))
        params = out.get("parameters") or {}
        size = params.get("binary_data_size")
        if size is not None and hlen:
            binary = True
            outputs[out["name"]] = np.frombuffer(data[offset : offset + size], dtype=dtype)
            offset += size
        elif "data" in out:
            outputs[out["name"]] = np.asarray(out["data"], dtype=dtype)
    return HttpReply(resp.status, outputs, binary, "")
