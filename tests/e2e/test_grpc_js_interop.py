"""The front's HTTP/2 against Node's @grpc/grpc-js: gRPC written in JavaScript, on Node's http2.

grpc-js shares nothing with grpc's C core (tritonclient, grpcio) nor with python-hyper's h2
(grpclib, tests/e2e/test_grpc_interop.py): its framing, deadlines, message limits and stream
handling are its own, its HTTP/2 is Node's http2 module (nghttp2 underneath). One run of
tests/support/grpc_js_client.js makes every call; each test here judges a part of its report.
The packages are pinned and installed with npm outside the repository (tests/support/grpc_js.py);
only a missing ``node`` or ``npm`` skips, a failed install fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.grpc_js import PINS, missing_tools, run_client
from tests.support.server import ServerProcess

LARGE = 8 * 1024 * 1024  # past gRPC's 4 MiB default message limits, both ways


@pytest.fixture(scope="module")
def report(server: ServerProcess) -> dict[str, Any]:
    """What the grpc-js client saw, one run for the module."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"{' and '.join(missing)} not on PATH: the grpc-js client needs Node and npm")
    return run_client(server.grpc_url)


def simple_reply(seed: int) -> dict[str, Any]:
    """``simple``'s reply to inputs ``arange(16) * seed`` each: OUTPUT0 is their sum."""
    output0 = [2 * seed * i for i in range(16)]
    return {"id": f"r{seed}", "model": "simple", "outputs": 2, "output0": output0}


def test_the_pinned_client_ran(report: dict[str, Any]) -> None:
    assert report["grpc_js"] == PINS["@grpc/grpc-js"]


def test_health_and_metadata(report: dict[str, Any]) -> None:
    assert report["live"] is True and report["ready"] is True
    assert report["metadata"] == {"name": "simple", "inputs": ["INPUT0", "INPUT1"]}


def test_unary_infer_answers_each_call(report: dict[str, Any]) -> None:
    assert report["infer"] == [simple_reply(seed) for seed in (1, 2, 3)]


def test_an_8_mib_message_each_way(report: dict[str, Any]) -> None:
    large = report["large"]
    assert large["sent_bytes"] == LARGE
    assert large["reply"]["id"] == "big" and large["reply"]["bytes"] == LARGE
    assert large["reply"]["sha256"] == large["sent_sha256"]


def test_an_unknown_model_is_not_found_with_its_name(report: dict[str, Any]) -> None:
    for call in ("unknown_model", "unknown_model_ready"):
        assert report[call]["name"] == "NOT_FOUND", report[call]
        assert "'nope'" in report[call]["details"]


def test_a_stream_with_a_large_message_and_a_failure_is_answered_in_order(
    report: dict[str, Any],
) -> None:
    """Five messages, the second 8 MiB, the fourth for an unknown model: answered in request
    order, the failure in-band (``error_message``), and the stream ends OK."""
    stream = report["stream"]
    assert stream["status"] == 0
    replies = stream["replies"]
    assert [r["error"] for r in replies] == ["", "", "", replies[3]["error"], ""]
    # the error names its request, as Triton's does: infer_response holds only the id
    assert "'nope'" in replies[3]["error"]
    assert replies[3]["reply"] == {"id": "bad", "model": "", "outputs": 0}
    assert replies[0]["reply"] == simple_reply(1)
    big = replies[1]["reply"]
    assert big["id"] == "big" and big["bytes"] == LARGE
    assert big["sha256"] == report["large"]["sent_sha256"]
    assert replies[2]["reply"] == simple_reply(2)
    assert replies[4]["reply"] == simple_reply(3)
