"""A gzip-compressed gRPC message is bounded by --max-request-bytes before it inflates (#18).

grpcio's client compresses the message for real (``grpc.Compression.Gzip``): a
160 MiB message of zeros is ~160 KB on the wire. The server must refuse it
(RESOURCE_EXHAUSTED) without inflating more than the limit, and its RSS must
come back to idle afterwards (freed slices handed back to the system).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.server import ServerProcess, wait_for

MiB = 1024 * 1024
LIMIT = 64 * MiB


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(args=["--max-request-bytes", str(LIMIT)]).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def memory(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(name)


def test_compressed_oversized_message_is_refused_and_memory_returns(
    server: ServerProcess,
) -> None:
    request = service_pb2.ModelInferRequest(model_name="no_such_model")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 40 * MiB])
    assert tensor.name == "INPUT0"
    request.raw_input_contents.append(bytes(160 * MiB))
    options = [("grpc.max_send_message_length", -1)]
    pid = server.process.pid  # the front inflates the messages
    with grpc.insecure_channel(server.grpc_url, options=options) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ServerLive(service_pb2.ServerLiveRequest())
        idle = memory(pid, "VmRSS")
        for attempt in range(3):
            # The bound is per request: what the previous message still holds (grpc frees
            # a refused call's slices when it destroys the call, later on a loaded machine)
            # is in `before`, not in this request's growth.
            before = memory(pid, "VmRSS")
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(request, compression=grpc.Compression.Gzip, timeout=60)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            peak = memory(pid, "VmHWM") - before
            # Inflating stops at the limit; the whole message would be 160 MiB and more.
            assert peak < 1.5 * LIMIT, f"request {attempt}: peak RSS grew by {peak / MiB:.0f} MiB"
    settled = wait_for(lambda: memory(pid, "VmRSS") < idle + 40 * MiB, timeout=10)
    assert settled, f"RSS stayed {(memory(pid, 'VmRSS') - idle) / MiB:.0f} MiB above idle"
