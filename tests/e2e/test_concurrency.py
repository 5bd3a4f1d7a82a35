"""Many requests in flight at once: every answer must match its own request."""

from __future__ import annotations

import threading

import numpy as np
import tritonclient.http as httpclient

from tests.support.server import ServerProcess

CLIENTS = 32
REQUESTS_PER_CLIENT = 14  # 448 requests in all


def test_concurrent_clients_get_their_own_answers(server: ServerProcess) -> None:
    failures: list[str] = []
    done = [0] * CLIENTS

    def client_loop(index: int) -> None:
        rng = np.random.default_rng(index)
        client = httpclient.InferenceServerClient(
            server.host_port, connection_timeout=30, network_timeout=60
        )
        try:
            for n in range(REQUESTS_PER_CLIENT):
                binary = n % 2 == 0
                if index % 2:
                    rows = int(rng.integers(1, 9))
                    a = rng.integers(-(2**20), 2**20, size=(rows, 16), dtype=np.int32)
                    b = rng.integers(-(2**20), 2**20, size=(rows, 16), dtype=np.int32)
                    inputs = [
                        httpclient.InferInput("INPUT0", [rows, 16], "INT32"),
                        httpclient.InferInput("INPUT1", [rows, 16], "INT32"),
                    ]
                    inputs[0].set_data_from_numpy(a, binary_data=binary)
                    inputs[1].set_data_from_numpy(b, binary_data=binary)
                    outputs = [
                        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
                        httpclient.InferRequestedOutput("OUTPUT1", binary_data=not binary),
                    ]
                    result = client.infer(
                        "simple", inputs, outputs=outputs, request_id=f"{index}-{n}"
                    )
                    ok = np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(
                        result.as_numpy("OUTPUT1"), a - b
                    )
                else:
                    cols = int(rng.integers(1, 20_000))
                    x = rng.standard_normal((1, cols)).astype(np.float32)
                    inp = httpclient.InferInput("INPUT0", [1, cols], "FP32")
                    inp.set_data_from_numpy(x, binary_data=binary)
                    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
                    result = client.infer(
                        "identity_fp32", [inp], outputs=[out], request_id=f"{index}-{n}"
                    )
                    ok = np.array_equal(result.as_numpy("OUTPUT0"), x)
                if result.get_response()["id"] != f"{index}-{n}":
                    ok = False
                if not ok:
                    failures.append(f"client {index} request {n}: wrong answer")
                done[index] += 1
        except Exception as exc:  # collected and reported below
            failures.append(f"client {index}: {type(exc).__name__}: {exc}")
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures[:5]
    assert sum(done) == CLIENTS * REQUESTS_PER_CLIENT
