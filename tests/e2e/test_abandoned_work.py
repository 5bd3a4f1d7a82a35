"""A client that abandons its calls faster than a worker runs them (``runtime/abandoned_work.py``).

A reset call ends in the front at once, but the worker that has its request runs it to
the end, its input and output segments held till then. One HTTP/2 connection's such
requests count against it: at 16 the connection is not read (the log says so, once), and
it is read again when 8 are left. Here a raw client sends 24 ModelInfer calls of a model
that takes a while a call (a chain of 16 1024 x 1024 MatMuls on 64 rows), on one
connection, and resets the 23 left once the first is answered (all of them are in the
worker by then): the connection is held, another client is served, and once the worker
has caught up the held connection's next call is read and answered.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from oipserve.front.grpc.h2.frames import ErrorCode, Setting, rst_stream, window_update
from tests.support.h2_attacks import Attacker, data_frames, grpc_message
from tests.support.onnx_models import WEIGHTY, write_weighty_repository
from tests.support.server import ServerProcess, wait_for

MODEL = WEIGHTY
#: MatMuls by 1024 x 1024 weights (64 MiB), on ``ROWS`` rows a call: 2 GFLOP, about 0.1 s
#: here; with 4 layers the worker sometimes had all but 8 done before the resets came.
LAYERS = 16
ROWS = 64
CALLS = 24
HELD = "not read while 16 of its cancelled requests still run in the workers"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    write_weighty_repository(root, LAYERS)
    args = ["--devices", "cpu", "--model-control-mode", "explicit", "--load-model", MODEL]
    proc = ServerProcess(root, args).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log[-4000:]
    assert "Traceback" not in proc.log, proc.log[-4000:]


def _request(rows: int) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[rows, 1024])
    request.raw_input_contents.append(bytes(rows * 1024 * 4))
    return grpc_message(request.SerializeToString())


def test_calls_abandoned_faster_than_the_worker_runs_them_hold_their_connection(
    srv: ServerProcess,
) -> None:
    message = _request(ROWS)
    streams = range(1, 2 * CALLS, 2)
    attacker = Attacker(srv.grpc_port, {Setting.INITIAL_WINDOW_SIZE: 1 << 20})
    try:
        assert attacker.send(window_update(0, 1 << 24))  # room for every reply
        calls = [attacker.call(s, "ModelInfer") + data_frames(s, message) for s in streams]
        assert attacker.send(b"".join(calls))
        assert attacker.wait(lambda: 1 in attacker.began, 60), srv.log[-4000:]
        assert attacker.send(b"".join(rst_stream(s, ErrorCode.CANCEL) for s in streams[1:]))
        assert wait_for(lambda: HELD in srv.log, timeout=30), srv.log[-4000:]
        with grpcclient.InferenceServerClient(srv.grpc_url) as client:  # others are served
            tensor = grpcclient.InferInput("INPUT0", [1, 1024], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 1024), np.float32))
            assert client.infer(MODEL, [tensor]).as_numpy("OUTPUT0").shape == (1, 1024)
        # Read again once the worker has caught up: the connection's next call is answered.
        last = 2 * CALLS + 1
        assert attacker.send(attacker.call(last, "ModelInfer") + data_frames(last, _request(1)))
        assert attacker.wait(lambda: last in attacker.ended, 60), attacker.resets
        assert not attacker.goaway and srv.log.count("cancelled requests still run") == 1
    finally:
        attacker.close()
