"""What a gRPC call costs the front, in figures that do not depend on the machine's load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.support.server import ServerProcess


def _minor_faults(pid: int) -> int:
    """The process's minor page faults so far (``/proc/<pid>/stat`` field 10)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def test_megabyte_calls_reuse_the_fronts_heap() -> None:
    """1 MiB in and out per call: the front's buffers come from its heap, not fresh mappings.

    A block taken with mmap is unmapped when freed and faults in again, page by page, at
    the next call: with glibc's mmap threshold at 1 MiB every 1 MiB message did that
    (about 800 faults a call in the front: the request, the response and grpc's copy of
    it), which cost more CPU than the rest of the call.
    """
    proc = ServerProcess().wait_ready()
    try:
        data = np.random.default_rng(7).random((1, 256 * 1024), dtype=np.float32)
        with grpcclient.InferenceServerClient(proc.grpc_url) as client:
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            for _ in range(10):  # warm: the pools, the heap
                client.infer("identity_fp32", [tensor])
            before = _minor_faults(proc.process.pid)
            calls = 40
            for _ in range(calls):
                out = client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
            per_call = (_minor_faults(proc.process.pid) - before) / calls
        np.testing.assert_array_equal(out, data)
        assert per_call < 100, per_call
    finally:
        assert proc.stop() == 0, proc.log
