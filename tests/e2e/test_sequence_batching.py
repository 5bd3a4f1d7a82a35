"""Sequence batching end to end, through tritonclient (HTTP, gRPC, gRPC streaming): the
equivalents of Triton's example sequence models and clients, implicit state with both
strategies, interleaved sequences, Triton's errors, idle expiry, the backlog, and a worker
killed in the middle of a sequence.

The models (tests/support/sequence_models.py): ``simple_sequence`` answers
READY * (INPUT + START), ``simple_dyna_sequence`` READY * (INPUT + START + END * CORRID),
``accumulate_*`` the running sum of a sequence's inputs, kept as implicit state by the
worker; ``one_slot`` is an accumulator with a single slot, for the backlog
(``unloaded_one_slot`` its twin, for an unload); ``accumulate_ensemble`` an ensemble over
``accumulate_direct``; ``wide_input`` a single slot whose input is as wide as a request
makes it (the sum of its elements), ``full_backlog`` its twin, for the backlog's bound.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from oipserve.dataplane.sequence_slots import BACKLOG_MAX
from tests.support.memory import proc_status
from tests.support.raw_http import json_infer, read_response
from tests.support.sequence_models import (
    WIDE_STATE_ELEMENTS,
    write_repository,
    write_wide_input,
    write_wide_state,
)
from tests.support.server import (
    SAMPLE_REPOSITORY,
    ServerProcess,
    front_pid,
    grpc_client_on_front,
    pending,
    socket_to_front,
    steadily,
    stopped_worker,
    wait_for,
)
from tests.support.sockets import read_by_peer

#: ``max_sequence_idle_microseconds`` of the accumulators and the dyna model here.
IDLE_S = 0.4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("sequences")
    write_repository(root, idle_us=int(IDLE_S * 1e6))
    write_wide_input(root)
    write_wide_input(root, "full_backlog")
    # (a model of any shape, for large requests on a stream among a sequence's)
    shutil.copytree(SAMPLE_REPOSITORY / "identity_fp32", root / "identity_fp32")
    # explicit: a test unloads a model (every one is loaded at start, as without it)
    proc = ServerProcess(
        root, args=["--model-control-mode", "explicit", "--load-model", "*"]
    ).wait_ready()
    yield proc
    assert proc.stop() == 0


def _http_infer(
    client: httpclient.InferenceServerClient, model: str, value: int, sequence_id: int | str,
    start: bool = False, end: bool = False, **kwargs: object,
) -> int:  # fmt: skip
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    result = client.infer(
        model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end,
        **kwargs,
    )  # fmt: skip
    return int(result.as_numpy("OUTPUT")[0][0])


def _http_input(value: int) -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return tensor


def _grpc_input(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return tensor


def _grpc_infer(
    client: grpcclient.InferenceServerClient, model: str, value: int, sequence_id: int | str,
    start: bool = False, end: bool = False,
) -> int:  # fmt: skip
    result = client.infer(
        model, [_grpc_input(value)], sequence_id=sequence_id, sequence_start=start,
        sequence_end=end,
    )  # fmt: skip
    return int(result.as_numpy("OUTPUT")[0][0])


def _grpc_once(
    server: ServerProcess, model: str, value: int, sequence_id: int, start: bool = True,
    end: bool = True,
) -> int:  # fmt: skip
    """One request (by default a whole sequence), from a client of its own (any thread)."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        return _grpc_infer(client, model, value, sequence_id, start=start, end=end)


VALUES = [0, 11, 7, 5, 3, 2, 0, 1]


def test_simple_sequence_as_tritons_sync_clients(server: ServerProcess) -> None:
    """Triton's simple_{http,grpc}_sequence_sync_infer_client: two numeric sequences and a
    string one, interleaved; the first answer is value + 1 (START), the others the value."""
    with httpclient.InferenceServerClient(server.host_port) as client:
        ids: list[int | str] = [1000, 1001, str(uuid.uuid4())]
        bases = [0, 100, 20]
        got: list[list[int]] = [[], [], []]
        for step, value in enumerate(VALUES):
            for k, sequence_id in enumerate(ids):
                sent = value if k == 0 else bases[k] - value if step else bases[k]
                got[k].append(
                    _http_infer(
                        client,
                        "simple_sequence",
                        sent,
                        sequence_id,
                        start=step == 0,
                        end=step == len(VALUES) - 1,
                    )  # fmt: skip
                )
    assert got[0] == [1, *VALUES[1:]]
    assert got[1] == [101, *[100 - v for v in VALUES[1:]]]
    assert got[2] == [21, *[20 - v for v in VALUES[1:]]]


def test_dyna_sequence_over_a_grpc_stream(server: ServerProcess) -> None:
    """Triton's simple_grpc_sequence_stream_infer_client with --dyna: responses echo the
    request ids; the END step adds the sequence id (CORRID); the string sequence "1002" runs
    on an accumulator with implicit state and a TYPE_STRING CORRID."""
    answers: queue.Queue[tuple[str, int] | InferenceServerException] = queue.Queue()

    def callback(result: grpcclient.InferResult | None, error: object) -> None:
        if error is not None:
            answers.put(error)  # type: ignore[arg-type]
        elif result is not None:
            answers.put((result.get_response().id, int(result.as_numpy("OUTPUT")[0][0])))

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=callback)
    try:
        for step, value in enumerate(VALUES):
            sends = [
                ("simple_dyna_sequence", 2000, value),
                ("simple_dyna_sequence", 2001, -value),
                ("simple_string_dyna_sequence", "1002", -value if step else 20),
            ]
            for model, sequence_id, sent in sends:
                client.async_stream_infer(
                    model, [_grpc_input(sent)],
                    request_id=f"{sequence_id}_{step}", sequence_id=sequence_id,
                    sequence_start=step == 0, sequence_end=step == len(VALUES) - 1,
                )  # fmt: skip
        got: dict[str, int] = {}
        for _ in range(3 * len(VALUES)):
            answer = answers.get(timeout=30)
            assert not isinstance(answer, InferenceServerException), answer
            got[answer[0]] = answer[1]
    finally:
        client.stop_stream()
        client.close()
    assert [got[f"2000_{i}"] for i in range(len(VALUES))] == [0 + 1, *VALUES[1:-1], 1 + 2000]
    assert [got[f"2001_{i}"] for i in range(len(VALUES))] == [
        1, *[-v for v in VALUES[1:-1]], -1 + 2001,
    ]  # fmt: skip
    sums = list(np.cumsum([20, *[-v for v in VALUES[1:]]]))
    assert [got[f"1002_{i}"] for i in range(len(VALUES))] == [*sums[:-1], sums[-1] + 1002]


@pytest.mark.parametrize("model", ["accumulate_direct", "accumulate_oldest"])
def test_implicit_state_of_interleaved_sequences(server: ServerProcess, model: str) -> None:
    """Each sequence's running sum, kept by the worker, while several run at once (their
    requests share batches); statistics count every request."""
    sequences = {3000 + k: [k + 1] * 6 for k in range(6)}  # sequence k adds k + 1 six times

    def run(sequence_id: int, adds: list[int]) -> list[int]:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            return [
                _grpc_infer(client, model, add, sequence_id, start=i == 0, end=i == len(adds) - 1)
                for i, add in enumerate(adds)
            ]

    with httpclient.InferenceServerClient(server.host_port) as http:
        before = http.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
        with ThreadPoolExecutor(len(sequences)) as pool:
            results = dict(
                zip(sequences, pool.map(run, sequences, sequences.values()), strict=True)
            )
        after = http.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    for sequence_id, adds in sequences.items():
        assert results[sequence_id] == list(np.cumsum(adds)), sequence_id
    requests = sum(len(adds) for adds in sequences.values())
    assert after["success"]["count"] - before["success"]["count"] == requests
    assert after["queue"]["count"] - before["queue"]["count"] == requests


def test_an_ensemble_passes_its_sequence_to_a_sequence_step(server: ServerProcess) -> None:
    """``accumulate_ensemble``'s one step is an accumulator with implicit state: the
    ensemble request's sequence_id / start / end reach it (Triton passes the correlation
    id to its steps), for two interleaved sequences, over HTTP and gRPC; without an id the
    step refuses it in Triton's words."""
    model = "accumulate_ensemble"
    with (
        httpclient.InferenceServerClient(server.host_port) as http,
        grpcclient.InferenceServerClient(server.grpc_url) as grpc,
    ):
        got: dict[int | str, list[int]] = {7100: [], "ens-b": []}
        for i in range(4):
            first, last = i == 0, i == 3
            got[7100].append(_http_infer(http, model, 1, 7100, start=first, end=last))
            got["ens-b"].append(_grpc_infer(grpc, model, 10, "ens-b", start=first, end=last))
        with pytest.raises(InferenceServerException) as info:
            _http_infer(http, model, 1, 0)
        assert info.value.status() == "400"
        assert "must specify a non-zero or non-empty correlation ID" in str(info.value)
    assert got == {7100: [1, 2, 3, 4], "ens-b": [10, 20, 30, 40]}


def test_a_model_without_batching(server: ServerProcess) -> None:
    """``max_batch_size: 0``: controls and state of shape [1], inputs as the client sends them."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        results = []
        for i, value in enumerate([4, 5, 6]):
            tensor = grpcclient.InferInput("INPUT", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], np.int32))
            result = client.infer(
                "unbatched", [tensor], sequence_id="u", sequence_start=i == 0,
                sequence_end=i == 2,
            )  # fmt: skip
            results.append(int(result.as_numpy("OUTPUT")[0]))
    assert results == [4, 9, 15]


def test_tritons_errors(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.host_port) as client:
        with pytest.raises(InferenceServerException) as info:
            _http_infer(client, "simple_sequence", 1, 0)
        assert info.value.status() == "400"
        assert "inference request to model 'simple_sequence' must specify a non-zero or " \
            "non-empty correlation ID" in str(info.value)  # fmt: skip
        with pytest.raises(InferenceServerException) as info:
            _http_infer(client, "simple_sequence", 1, 4242)
        assert info.value.status() == "400"
        assert "inference request for sequence 4242 to model 'simple_sequence' must specify " \
            "the START flag on the first request of the sequence" in str(info.value)  # fmt: skip
        tensor = httpclient.InferInput("INPUT", [2, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[1], [2]], np.int32))
        with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to "):
            client.infer("simple_sequence", [tensor], sequence_id=5, sequence_start=True)
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        with pytest.raises(InferenceServerException) as info:
            _grpc_infer(grpc, "simple_sequence", 1, "x" * 129, start=True)
        assert info.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "cannot be longer than 128 characters" in str(info.value)
        with pytest.raises(InferenceServerException) as info:
            _grpc_infer(grpc, "simple_sequence", 1, 77)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_tritons_words_and_order_for_the_sequence_id(server: ServerProcess) -> None:
    """Triton checks a request (the CORRID's datatype last, core's ValidateCorrelationId),
    then its sequence batcher the batch size, then the correlation ID; REST and gRPC. A
    string id to a numeric CORRID had our words, a numeric id to a string CORRID was taken as
    its text; a batch of 2 without an id was refused for its id."""
    words = (
        "[request id: <id_unknown>] sequence batching control 'CORRID' data-type is 'BYTES', "
        "but model 'simple_dyna_sequence' expects 'UINT64'"
    )
    # (a numeric id to a TYPE_STRING CORRID was taken as its decimal text until 2026-11-30)
    numeric_words = (
        "[request id: <id_unknown>] sequence batching control 'CORRID' data-type is 'UINT64', "
        "but model 'simple_string_dyna_sequence' expects 'BYTES'"
    )
    batch = "inference request to model 'simple_sequence' must specify batch-size 1 due to"
    with httpclient.InferenceServerClient(server.host_port) as http:
        with grpcclient.InferenceServerClient(server.grpc_url) as rpc:
            for client, module in ((http, httpclient), (rpc, grpcclient)):
                with pytest.raises(InferenceServerException) as info:
                    client.infer(
                        "simple_dyna_sequence", [_grpc_input(1) if client is rpc else
                        _http_input(1)], sequence_id="abc", sequence_start=True,
                    )  # fmt: skip
                assert str(info.value.message()).startswith(words), info.value
                with pytest.raises(InferenceServerException) as info:
                    client.infer(
                        "simple_string_dyna_sequence", [_grpc_input(1) if client is rpc else
                        _http_input(1)], sequence_id=1002, sequence_start=True,
                    )  # fmt: skip
                assert str(info.value.message()).startswith(numeric_words), info.value
                tensor = module.InferInput("INPUT", [2, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[1], [2]], np.int32))
                with pytest.raises(InferenceServerException) as info:
                    client.infer("simple_sequence", [tensor])
                assert batch in str(info.value.message()), info.value


def test_an_idle_sequence_loses_its_slot_and_state(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert _http_infer(client, "accumulate_direct", 5, 4000, start=True) == 5
        assert _http_infer(client, "accumulate_direct", 5, 4000) == 10
        time.sleep(IDLE_S * 2.5)  # what is tested: nothing comes for longer than the idle time
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            _http_infer(client, "accumulate_direct", 5, 4000)
        assert _http_infer(client, "accumulate_direct", 2, 4000, start=True) == 2  # fresh state
        assert _http_infer(client, "accumulate_direct", 2, 4000, end=True) == 4


def test_the_backlog_waits_for_a_slot_until_its_timeout(server: ServerProcess) -> None:
    """``one_slot`` has one slot: a second sequence waits in the backlog; its request with
    a timeout fails there with Triton's message (503), one without runs once the first ends;
    its queue time counts its wait for the slot."""
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert _http_infer(client, "one_slot", 1, 5000, start=True) == 1
        before = client.get_inference_statistics("one_slot")["model_stats"][0]["inference_stats"]
        with pytest.raises(InferenceServerException) as info:
            _http_infer(client, "one_slot", 1, 5001, start=True, timeout=300_000)
        assert info.value.status() == "503"
        assert "timeout of the corresponding sequence has been expired" in str(info.value)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_grpc_once, server, "one_slot", 7, 5002)
            assert wait_for(lambda: pending(server, "one_slot") == 1), server.log
            time.sleep(0.2)  # what is measured: a wait for the slot, in its queue time
            assert not waiting.done(), waiting.exception()  # in the backlog
            assert _http_infer(client, "one_slot", 2, 5000, end=True) == 3
            assert waiting.result(timeout=30) == 7
        after = client.get_inference_statistics("one_slot")["model_stats"][0]["inference_stats"]
    assert after["success"]["count"] - before["success"]["count"] == 2
    assert after["fail"]["count"] - before["fail"]["count"] == 1
    assert after["queue"]["ns"] - before["queue"]["ns"] >= 0.2e9  # 5002 waited for the slot


def test_unloading_answers_the_backlog_at_once(server: ServerProcess) -> None:
    """A START waiting in the backlog for a slot is answered 503 when its model is
    unloaded, as the dynamic batcher answers its queue, not at its deadline (120 s)."""
    model = "unloaded_one_slot"
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert _http_infer(client, model, 1, 5500, start=True) == 1  # holds the one slot
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_grpc_once, server, model, 7, 5501)
            assert wait_for(lambda: pending(server, model) == 1), server.log
            client.unload_model(model)
            with pytest.raises(InferenceServerException) as info:
                waiting.result(timeout=30)
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert f"model '{model}' version 1 was unloaded while this request was queued" in str(
            info.value
        )


def test_sequence_models_need_no_client_side_control_inputs(server: ServerProcess) -> None:
    """The metadata lists only the inputs a client sends: no control or state tensors."""
    with httpclient.InferenceServerClient(server.host_port) as client:
        metadata = client.get_model_metadata("simple_dyna_sequence")
        assert [t["name"] for t in metadata["inputs"]] == ["INPUT"]
        assert [t["name"] for t in client.get_model_metadata("accumulate_direct")["outputs"]] == [
            "OUTPUT"
        ]
        config = client.get_model_config("simple_dyna_sequence")
        assert config["sequence_batching"]["oldest"]["max_candidate_sequences"] == 1024
        # Fields at their defaults are printed, as Triton prints them: START's kind is
        # enum 0, and its control input came without it (which control was START?).
        kinds = {
            entry["name"]: [control["kind"] for control in entry["control"]]
            for entry in config["sequence_batching"]["control_input"]
        }
        assert kinds["START"] == ["CONTROL_SEQUENCE_START"], kinds
        assert config["input"][0]["is_shape_tensor"] is False
        assert config["default_model_filename"] == "model.onnx"  # Triton's normalised


def test_a_killed_worker_fails_its_sequences_which_start_again(server: ServerProcess) -> None:
    """The request running when the worker dies fails with 503, so does the next one of
    its sequence; a START then runs on the replacement with fresh state."""
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert _http_infer(client, "one_slot", 5, 6000, start=True) == 5
        old = set(server.worker_pids())
        for pid in old:
            os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(_grpc_once, server, "one_slot", 1, 6000, False, False)
            assert wait_for(lambda: pending(server, "one_slot") == 1), server.log
            for pid in old:
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(InferenceServerException) as info:
                running.result(timeout=30)
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert "that held sequence 6000 stopped; the sequence must start again" in str(info.value)

        def replaced() -> bool:
            now = set(server.worker_pids())
            return (
                len(now) == len(old)
                and not now & old
                and all(client.is_model_ready(name) for name in ("one_slot", "simple_sequence"))
            )

        assert wait_for(steadily(replaced), timeout=60), server.log
        with pytest.raises(InferenceServerException) as info:
            _http_infer(client, "one_slot", 5, 6000)
        assert info.value.status() == "503"
        assert "the sequence must start again" in str(info.value)
        assert _http_infer(client, "one_slot", 3, 6000, start=True) == 3
        assert _http_infer(client, "one_slot", 3, 6000, end=True) == 6


def test_a_client_gone_from_the_backlog_is_no_traceback(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A START waiting in the backlog whose HTTP client closes its connection: its slot
    request is withdrawn and counted as a failure, as the dynamic batcher's queue does,
    not logged as an exception escaping the handler (found by fuzzing: a CancelledError
    traceback for every such client). One front, so that the request is the primary's."""
    root = tmp_path_factory.mktemp("one-slot")
    write_repository(root)
    args = ["--model-control-mode", "explicit", "--load-model", "one_slot", "--http-workers", "1"]
    proc = ServerProcess(root, args=args).wait_ready()
    try:
        with httpclient.InferenceServerClient(proc.host_port) as client:
            assert _http_infer(client, "one_slot", 1, 7000, start=True) == 1  # the one slot
            before = client.get_inference_statistics("one_slot")["model_stats"][0]
            body = json.dumps(
                {
                    "inputs": [
                        {"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}
                    ],
                    "parameters": {"sequence_id": 7001, "sequence_start": True},
                }
            ).encode()
            host, port = proc.host_port.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                conn.sendall(
                    b"POST /v2/models/one_slot/infer HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % len(body)
                    + body
                )
                assert wait_for(lambda: pending(proc, "one_slot") == 1), proc.log
            assert wait_for(lambda: pending(proc, "one_slot") == 0), proc.log  # withdrawn
            assert _http_infer(client, "one_slot", 2, 7000, end=True) == 3
            after = client.get_inference_statistics("one_slot")["model_stats"][0]
        failed = (
            after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
        )
        assert failed == 1
    finally:
        assert proc.stop() == 0, proc.log
    assert "Traceback" not in proc.log and "Exception in ASGI" not in proc.log, proc.log


@pytest.fixture(scope="module")
def long_idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The same models with a 60 s idle time: a sequence keeps its place through a test."""
    root = tmp_path_factory.mktemp("sequences-long-idle")
    write_repository(root, idle_us=60_000_000)
    proc = ServerProcess(root).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def test_oldest_sequences_run_on_while_a_start_waits_for_a_place(
    long_idle_server: ServerProcess,
) -> None:
    """accumulate_oldest (8 places, preserve_ordering): with every place held and a START in
    the backlog, the live sequences' answers were held behind that START (the answers' order
    counted it), and an END let every START in, the other sequences expiring meanwhile
    (found by fuzzing). Now they answer at once, and an END frees one place."""
    server, model = long_idle_server, "accumulate_oldest"
    with httpclient.InferenceServerClient(server.host_port, network_timeout=20) as client:
        for sequence in range(1, 9):
            assert _http_infer(client, model, 10 * sequence, 8000 + sequence, start=True) == (
                10 * sequence
            )
        with ThreadPoolExecutor(2) as pool:
            waiting = [
                pool.submit(_grpc_once, server, model, 7, 8100 + n, True, False) for n in (1, 2)
            ]
            assert wait_for(lambda: pending(server, model) == 2), server.log
            assert _http_infer(client, model, 1, 8002) == 21  # not held behind the backlog
            assert _http_infer(client, model, 1, 8001, end=True) == 11
            done, _ = wait(waiting, timeout=20, return_when=FIRST_COMPLETED)
            assert len(done) == 1 and done.pop().result() == 7  # one place, one START
            for sequence in range(2, 9):  # the others kept their place and their state
                expected = 10 * sequence + (2 if sequence == 2 else 1)
                assert _http_infer(client, model, 1, 8000 + sequence, end=True) == expected
            assert all(f.result(timeout=20) == 7 for f in waiting)


def test_a_start_waiting_for_a_killed_workers_place_runs_on_its_replacement(
    long_idle_server: ServerProcess,
) -> None:
    """one_slot: a START waiting for the place of a sequence whose worker was killed was
    never answered (nothing looked for a place again; found by fuzzing). It runs on the
    replacement now."""
    server = long_idle_server
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert _http_infer(client, "one_slot", 5, 9000, start=True) == 5
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_grpc_once, server, "one_slot", 7, 9001)
            assert wait_for(lambda: pending(server, "one_slot") == 1), server.log
            for pid in server.worker_pids():
                os.kill(pid, signal.SIGKILL)
            assert waiting.result(timeout=30) == 7
        with pytest.raises(InferenceServerException, match="the sequence must start again"):
            _http_infer(client, "one_slot", 5, 9000)


def test_a_running_step_past_its_deadline_is_answered_as_it_ran(server: ServerProcess) -> None:
    """A step whose deadline passes while it runs is answered when it ends, as Triton
    answers it: it was answered 503 while its input still went into the sequence's state,
    so the sum at the END held a step the client was told had failed (found by fuzzing).
    The worker is stopped while the step is on it, until its deadline (50 ms) is past."""
    model = "accumulate_direct"
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert _http_infer(client, model, 100, 7100, start=True) == 100
        with stopped_worker(server):
            step = {
                "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [5]}],
                "parameters": {"sequence_id": 7100, "timeout": 50_000},
            }
            held = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            sent = time.monotonic()
            held.sendall(json_infer(model, json.dumps(step).encode()))
            assert wait_for(lambda: read_by_peer(held), 10), "the front did not read the step"
            assert wait_for(lambda: time.monotonic() - sent > 0.2, 5)  # past the deadline
        with held:
            status, _, body = read_response(held)
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["data"] == [105]
        assert _http_infer(client, model, 0, 7100, end=True) == 105


def test_a_step_whose_inputs_fail_in_a_worker_frees_its_slot(server: ServerProcess) -> None:
    """A sequence's END whose large JSON (decoded by a worker) holds a value out of range is
    a 400, and its sequence ends: it kept ``one_slot``'s only slot for ever (60 s idle
    here), and the next START waited in the backlog until its timeout (found by fuzzing).
    On the primary front, which decodes after queueing the step; another decodes before
    it crosses."""
    model = "one_slot"
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert _http_infer(client, model, 1, 7200, start=True) == 1
        padding = " " * 1_200_000
        body = (
            '{"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": ['
            + padding
            + '99999999999]}], "parameters": {"sequence_id": 7200, "sequence_end": true}}'
        ).encode()
        with socket_to_front(server, server.process.pid) as sock:
            sock.sendall(json_infer(model, body))
            status, _, answer = read_response(sock)
        assert status == 400 and b"out of range for INT32" in answer, answer
        assert _http_infer(client, model, 5, 7201, start=True, end=True, timeout=5_000_000) == 5


def test_a_stream_reads_on_while_a_start_waits_for_a_slot(server: ServerProcess) -> None:
    """One stream: sequence A takes ``one_slot``'s only slot, B's START waits in the backlog,
    70 of A's steps and its END follow. The answers behind B's wait (they leave in order),
    and the stream reads on, so A's END frees the slot for B. Reading stopped after 64
    unanswered requests: A's END was never read until A expired (found by fuzzing)."""
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    plan = [(7300, 1, True, False), (7301, 10, True, False)]
    plan += [(7300, 1, False, False)] * 70 + [(7300, 1, False, True), (7301, 10, False, True)]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for n, (sequence_id, value, start, end) in enumerate(plan):
                client.async_stream_infer(
                    "one_slot", [_grpc_input(value)], request_id=str(n), sequence_id=sequence_id,
                    sequence_start=start, sequence_end=end,
                )  # fmt: skip
            got = [answers.get(timeout=20) for _ in plan]
        finally:
            client.stop_stream()
    assert [error for _, error in got] == [None] * len(plan)
    sums = [int(result.as_numpy("OUTPUT")[0][0]) for result, _ in got]  # type: ignore[attr-defined]
    assert sums == [1, 10, *range(2, 73), 20]


def test_a_stream_reads_on_past_a_window_of_requests_behind_a_waiting_start(
    server: ServerProcess,
) -> None:
    """As above, with 12 MiB of other requests (100 KiB each) between B's START and A's END:
    past what a stream may hold unanswered (4 MiB) and its window (4 MiB more). A request's
    bytes counted until its answer left, so the reading stopped there until A expired
    (found by fuzzing); they leave the count when the request is answered."""
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    big = np.arange(25_600, dtype=np.float32).reshape(1, -1)  # 100 KiB
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer(
                "one_slot", [_grpc_input(1)], sequence_id=7500, sequence_start=True
            )
            client.async_stream_infer(
                "one_slot", [_grpc_input(10)], sequence_id=7501, sequence_start=True
            )
            for _ in range(120):
                tensor = grpcclient.InferInput("INPUT0", list(big.shape), "FP32")
                tensor.set_data_from_numpy(big)
                client.async_stream_infer("identity_fp32", [tensor])
            for sequence_id, value in ((7500, 1), (7501, 10)):
                client.async_stream_infer(
                    "one_slot", [_grpc_input(value)], sequence_id=sequence_id, sequence_end=True
                )
            got = [answers.get(timeout=20) for _ in range(124)]
        finally:
            client.stop_stream()
    assert [error for _, error in got] == [None] * 124
    ends = [int(result.as_numpy("OUTPUT")[0][0]) for result, _ in got[-2:]]  # type: ignore[attr-defined]
    assert ends == [2, 20]
    echoed = got[2][0].as_numpy("OUTPUT0")  # type: ignore[attr-defined]
    np.testing.assert_array_equal(echoed, big)


#: A plan of stream requests: (sequence id, its input, START, END).
Plan = list[tuple[int, np.ndarray, bool, bool]]


def _more_sequences_than_slots(first_id: int, count: int) -> Plan:
    """``count`` STARTs on ``one_slot`` (one slot), then a step of each, then each END."""
    ids = range(first_id, first_id + count)
    return [
        *((i, np.array([[1]], np.int32), True, False) for i in ids),
        *((i, np.array([[2]], np.int32), False, False) for i in ids),
        *((i, np.array([[3]], np.int32), False, True) for i in ids),
    ]


def _stream_plan(
    client: grpcclient.InferenceServerClient, model: str, plan: Plan
) -> list[tuple[object, object]]:
    """``plan`` sent on one stream, without waiting; its answers (result, error), in order,
    each within 20 s (else the stream is cancelled: a stream that stalled is not waited for
    when it closes)."""
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    got: list[tuple[object, object]] = []
    try:
        for n, (sequence_id, values, start, end) in enumerate(plan):
            tensor = grpcclient.InferInput("INPUT", list(values.shape), "INT32")
            tensor.set_data_from_numpy(values)
            client.async_stream_infer(
                model, [tensor], request_id=str(n), sequence_id=sequence_id,
                sequence_start=start, sequence_end=end,
            )  # fmt: skip
        got = [answers.get(timeout=20) for _ in plan]
    finally:
        client.stop_stream(cancel_requests=len(got) < len(plan))
    return got


def _outputs(got: list[tuple[object, object]]) -> list[int]:
    assert [error for _, error in got] == [None] * len(got)
    return [int(result.as_numpy("OUTPUT")[0][0]) for result, _ in got]  # type: ignore[attr-defined]


def test_a_stream_reads_on_while_more_of_its_sequences_wait_than_there_are_slots(
    server: ServerProcess,
) -> None:
    """One stream starts 100 sequences on ``one_slot`` (one slot), then sends a step of
    each, then each END: every request is answered, each sequence's sums right. The
    requests waiting for the slot counted as the stream's requests running: at 64 the
    stream was read no more, and the END that would free the slot never came, until the
    sequence holding it expired (found by fuzzing)."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        got = _stream_plan(client, "one_slot", _more_sequences_than_slots(7700, 100))
    assert _outputs(got) == [1] * 100 + [3] * 100 + [6] * 100


def test_a_stream_reads_on_past_a_window_of_requests_waiting_for_a_slot(
    server: ServerProcess,
) -> None:
    """As above with 40 STARTs of 256 KiB each on ``wide_input`` (one slot) behind a first
    sequence that holds it: 10 MiB waiting for the slot, past what a stream may hold
    unanswered (4 MiB) and its window (4 MiB more), then the first sequence's END. Their
    bytes counted until they were answered: the stream's window was not given back, and
    the END never came."""
    wide = np.ones((1, 65_536), np.int32)
    one = np.array([[1]], np.int32)
    plan: Plan = [(7800, one, True, False)]
    plan += [(7801 + i, wide, True, False) for i in range(40)]
    plan += [(7800, one, False, True)]
    plan += [(7801 + i, one, False, True) for i in range(40)]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        got = _stream_plan(client, "wide_input", plan)
    assert _outputs(got) == [1, *[65_536] * 40, 1, *[1] * 40]


def test_a_stream_reads_on_past_1024_answers_behind_a_start_waiting_for_a_slot(
    server: ServerProcess,
) -> None:
    """Sequence A holds ``one_slot``'s only slot, B's START waits for it, then 1,100 of A's
    steps and its END, then B's END: every request is answered, each sequence's sums
    right. A's steps are answered and their answers wait behind B's (answers leave in
    order); at 1,024 of them the stream was read no more, and A's END, which would free
    the slot, was not read until A expired (60 s here): a correct client stalled."""
    one = np.array([[1]], np.int32)
    plan: Plan = [(7900, one, True, False), (7901, one * 10, True, False)]
    plan += [(7900, one, False, False)] * 1100
    plan += [(7900, one, False, True), (7901, one * 10, False, True)]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        got = _stream_plan(client, "one_slot", plan)
    assert _outputs(got) == [1, 10, *range(2, 1103), 20]


def test_the_backlog_bounds_what_a_stream_leaves_waiting_for_a_slot(
    server: ServerProcess,
) -> None:
    """A stream's requests waiting for a slot no longer count against what the stream may
    hold: the backlog's bound does (10,000 requests a version). Past it a request that
    would wait there is refused at once, 503 / UNAVAILABLE; once the stream is cancelled,
    the backlog is empty and its bound counts nothing again: a START waits in it, and runs
    once the slot is free."""
    model, one = "full_backlog", np.array([[1]], np.int32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        holder = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        holder.set_data_from_numpy(one)
        client.infer(model, [holder], sequence_id=7600, sequence_start=True)  # holds the slot
        client.start_stream(callback=lambda result, error: None)
        try:
            # (a thousand at a time, each wait counted: the backlog's bound is what is tested)
            for first in range(0, BACKLOG_MAX, 1000):
                for n in range(first, first + 1000):
                    client.async_stream_infer(
                        model, [holder], sequence_id=80_000 + n, sequence_start=True
                    )
                assert wait_for(lambda: pending(server, model) == first + 1000, timeout=60)  # noqa: B023
            with pytest.raises(InferenceServerException) as refused:
                client.infer(model, [holder], sequence_id=7601, sequence_start=True)
            assert refused.value.status() == "StatusCode.UNAVAILABLE", refused.value
            assert "already wait for a sequence slot" in str(refused.value)
        finally:
            client.stop_stream(cancel_requests=True)
        assert wait_for(lambda: pending(server, model) == 0, timeout=60)
        with ThreadPoolExecutor(1) as waiter:
            waiting = waiter.submit(_grpc_once, server, model, 1, 7602)
            assert wait_for(lambda: pending(server, model) == 1)  # in the backlog, not refused
            client.infer(model, [holder], sequence_id=7600, sequence_end=True)
            assert waiting.result(timeout=60) == 1


def test_a_steps_timeout_bounds_only_its_wait_for_a_slot(server: ServerProcess) -> None:
    """A step with a ``timeout`` queued behind its sequence's running step waits on, as in
    Triton (the request timeout applies to the backlog): it failed at its timeout, and the
    sequence went on without its input (found by fuzzing). The worker is stopped while the
    step before it runs, past the timeout (50 ms)."""
    model = "accumulate_direct"
    with httpclient.InferenceServerClient(server.host_port) as client:
        assert _http_infer(client, model, 100, 7400, start=True) == 100
        step = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [5]}]}
        with stopped_worker(server):
            running = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            step["parameters"] = {"sequence_id": 7400}
            running.sendall(json_infer(model, json.dumps(step).encode()))
            assert wait_for(lambda: pending(server, model) == 1), server.log
            queued = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            step["parameters"] = {"sequence_id": 7400, "timeout": 50_000}
            queued.sendall(json_infer(model, json.dumps(step).encode()))
            assert wait_for(lambda: pending(server, model) == 2), server.log
            time.sleep(0.3)  # what is tested: the queued step's timeout passes
        with running, queued:
            answers = [read_response(running), read_response(queued)]
        assert [
            (status, json.loads(body)["outputs"][0]["data"]) for status, _, body in answers
        ] == [
            (200, [105]),
            (200, [110]),
        ]
        assert _http_infer(client, model, 0, 7400, end=True) == 110


def test_a_sequence_whose_end_never_ran_leaves_no_state_in_its_worker(
    tmp_path: Path,
) -> None:
    """A sequence whose END fails once queued (large JSON a worker decodes, a value out of
    range) never ran it: the worker is told the sequence is over, as after an idle expiry.
    It was not (the front took the END as having told it): each such sequence left its
    state in the worker for good, 4 MiB here (found by fuzzing). 24 of them must not grow
    the worker by more than a third of what they would hold."""
    write_wide_state(tmp_path)
    proc = ServerProcess(tmp_path, args=["--http-workers", "1"]).wait_ready()
    try:
        (worker,) = proc.worker_pids()
        padding = " " * 1_200_000

        def bad_end(sequence_id: int) -> bytes:
            return (
                '{"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": ['
                + padding
                + '99999999999]}], "parameters": {"sequence_id": '
                + f'{sequence_id}, "sequence_end": true}}}}'
            ).encode()

        with httpclient.InferenceServerClient(proc.host_port) as client:
            assert _http_infer(client, "wide_state", 1, 1, start=True, end=True) == 1  # (warm)
            before = proc_status(worker, "RssAnon")
            for sequence_id in range(2, 26):
                assert _http_infer(client, "wide_state", 1, sequence_id, start=True) == 1
                with socket.create_connection(("127.0.0.1", proc.port), timeout=60) as sock:
                    sock.sendall(json_infer("wide_state", bad_end(sequence_id)))
                    status, _, answer = read_response(sock)
                assert status == 400 and b"out of range" in answer, answer
            grown = proc_status(worker, "RssAnon") - before
        held = 24 * WIDE_STATE_ELEMENTS * 4
        assert grown < held / 3, f"the worker grew {grown >> 20} MiB"
    finally:
        assert proc.stop() == 0, proc.log


def test_a_stream_through_the_other_front_reads_on_while_its_sequences_wait(
    tmp_path: Path,
) -> None:
    """Two fronts: the other front's stream sends its sequences' requests to the primary's
    sequence batcher, which tells it which wait for the slot (``batch_wire.SlotWait``), so
    that it reads on as the primary's own streams do. It counted them as running: at 64 the
    stream was read no more, and the END that would free the slot never came."""
    write_repository(tmp_path, idle_us=60_000_000)
    proc = ServerProcess(tmp_path, env={"OIPSERVE_HTTP_WORKERS": "2"}).wait_ready()
    try:
        client = grpc_client_on_front(proc, front_pid(proc, "extra front"))
        with client:
            got = _stream_plan(client, "one_slot", _more_sequences_than_slots(7900, 100))
        assert _outputs(got) == [1] * 100 + [3] * 100 + [6] * 100
    finally:
        assert proc.stop() == 0, proc.log
