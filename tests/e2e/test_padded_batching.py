"""Padded batching (the ``pad_batch`` parameter): requests of different lengths in one batch.

The sample encoder (model-repository/build.py ``build_encoder``; repositories in
tests/support/padded_models.py) computes in exact integers, so a request's answer from a
padded batch must be bit-for-bit its answer alone (``encoder_alone``), ``hidden`` cut back
to its own length. The batch statistics show the padded executions; the waste bound keeps
a long request out of a batch of short ones; ``/metrics`` reports the padding.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.padded_models import MALFORMED, tokens, write_padded_repository
from tests.support.server import ServerProcess, pending, wait_for

#: Far longer than four requests take to arrive: the batch fires at its preferred size 4.
DELAY_US = 20_000_000
#: The waste model's delay: how long a request left alone waits for company.
SHORT_DELAY_US = 2_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("padded")
    write_padded_repository(root, DELAY_US, SHORT_DELAY_US)
    proc = ServerProcess(root).wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log


def _infer(
    module: object, client: object, model: str, ids: np.ndarray, mask: bool = True
) -> dict[str, np.ndarray]:
    inputs = []
    for name, values in (("input_ids", ids), ("attention_mask", np.ones_like(ids))):
        if name == "attention_mask" and not mask:
            continue
        tensor = module.InferInput(name, list(values.shape), "INT64")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(values)
        inputs.append(tensor)
    result = client.infer(model, inputs)  # type: ignore[attr-defined]
    return {name: result.as_numpy(name) for name in ("hidden", "pooled")}


def _executions(server: ServerProcess, model: str) -> dict[int, int]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    (stats,) = client.get_inference_statistics(model, "1").model_stats
    return {b.batch_size: b.compute_infer.count for b in stats.batch_stats}


def _new(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _alike_alone(module: object, url: str, requests: list[np.ndarray], got: list[dict]) -> None:
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    for ids, answer in zip(requests, got, strict=True):
        alone = _infer(module, client, "encoder_alone", ids)
        assert answer["hidden"].shape == (1, ids.shape[1], 64)  # cut back to its length
        assert answer["hidden"].tobytes() == alone["hidden"].tobytes()
        assert answer["pooled"].tobytes() == alone["pooled"].tobytes()


@pytest.mark.parametrize(
    ("module", "model"),
    [(grpcclient, "encoder"), (httpclient, "encoder"), (grpcclient, "encoder_mask")],
    ids=["grpc", "rest", "server-made-mask"],
)
def test_padded_batch_answers_each_request_as_alone(
    server: ServerProcess, module: object, model: str
) -> None:
    url = server.grpc_url if module is grpcclient else server.host_port
    requests = tokens(len(model) + (module is grpcclient), [5, 9, 3, 12])
    before = _executions(server, model)
    with ThreadPoolExecutor(4) as pool:
        clients = [module.InferenceServerClient(url) for _ in requests]  # type: ignore[attr-defined]
        got = list(
            pool.map(
                lambda c, ids: _infer(module, c, model, ids, model == "encoder"), clients, requests
            )
        )
    assert _new(before, _executions(server, model)) == {4: 1}  # one padded execution of 4
    _alike_alone(module, url, requests, got)


def _metric(server: ServerProcess, name: str, model: str) -> float:
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    key = f'{name}{{model="{model}",version="1"}} '
    (line,) = [ln for ln in text.splitlines() if ln.startswith(key)]
    return float(line.split()[-1])


def test_waste_bound_keeps_a_long_request_out(server: ServerProcess) -> None:
    """Three short requests queue, then a long one: with it the batch would hold more than
    twice its real elements, so the three run at once and the long one alone."""
    model = "encoder_waste"
    requests = tokens(3, [3, 4, 2, 40])
    before = _executions(server, model)
    with ThreadPoolExecutor(4) as pool:
        futures = []
        for count, ids in enumerate(requests):
            client = grpcclient.InferenceServerClient(server.grpc_url)
            futures.append(pool.submit(_infer, grpcclient, client, model, ids))
            if count < 3:  # in order: the long one last
                assert wait_for(lambda n=count: pending(server, model) == n + 1, 10)
        got = [f.result() for f in futures]
    assert _new(before, _executions(server, model)) == {3: 1, 1: 1}
    _alike_alone(grpcclient, server.grpc_url, requests, got)
    with_padding = _metric(server, "oipserve_pad_batch_elements", model)
    real = _metric(server, "oipserve_pad_batch_real_elements", model)
    # the batch of 3 (lengths 3, 4, 2: 12 padded of 9 real, two inputs), the 40 alone
    assert (with_padding, real) == (2 * (12 + 40), 2 * (9 + 40))


def test_malformed_pad_batch_is_refused_at_load(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.host_port)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    for name, (_, reason) in MALFORMED.items():
        assert index[name]["state"] == "UNAVAILABLE", name
        assert reason in index[name]["reason"], (name, index[name]["reason"])
    assert index["encoder"]["state"] == "READY"
