"""A model's only instance held on purpose, so that the requests after it queue.

The tests stop the model's one worker (SIGSTOP) and send a first request, which the batcher
hands to the stopped worker: the instance is then busy, and whatever comes next waits in the
queue, where ``nv_inference_pending_request_count`` counts it (docs/metrics.md, "Pending").
"""

from __future__ import annotations

import socket

from tests.support.raw_http import json_infer
from tests.support.server import ServerProcess, pending, steadily, wait_for
from tests.support.sockets import read_by_peer


def hold_the_instance(server: ServerProcess, model: str, body: bytes) -> socket.socket:
    """Send ``body`` (JSON) to ``model``, whose worker is stopped, on a connection of its
    own; return that connection once the request holds the model's only instance.

    Held means: the front has read all of it, and nothing of the model stays queued (a
    request is queued until its batch leaves for the worker). Read the answer with
    ``tests.support.raw_http.read_response`` once the worker goes on.
    """
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(json_infer(model, body))
    assert wait_for(lambda: read_by_peer(sock), 10), "the front did not read the request"
    assert wait_for(steadily(lambda: pending(server, model) == 0), 10), pending(server, model)
    return sock
