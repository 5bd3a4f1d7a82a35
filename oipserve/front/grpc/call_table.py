"""What every gRPC call of one server shares: its methods, restrictions and limits.

A ``CallTable`` is built once per server (``front.grpc.tables``) and read by each
``front.grpc.call.Call``: which path names which method (or is forwarded to the primary
front), which methods a ``--grpc-restricted-protocol`` rule guards, how large a message
may be each way, and where a large ModelInfer message is read to (the input pool).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from oipserve.config.access import GRPC_METHODS, allows, by_api, denial
from oipserve.config.settings import Settings
from oipserve.errors import Forbidden
from oipserve.front.grpc.rpcs import HEALTH_CHECK, RPCS, SERVICE, STREAM_RPC, Method, rpc_path
from oipserve.front.http.h2_asgi import RestOverH2
from oipserve.request.inference import Parked
from oipserve.runtime.worker_share import ForwardedShares, share_of
from oipserve.wire.shm import BufferPool

__all__ = ["Answers", "CallTable", "Forward"]


#: Another front that answers what this one does not: (method, request, the call's
#: metadata, seconds left or None, the serial of the share of the client connection an
#: inference is counted in, 0 for another RPC) -> the response message.
Forward = Callable[[str, bytes, tuple[tuple[str, str], ...], "float | None", int], Awaitable[bytes]]
#: Whether this front answers inference of (model, version or None) itself.
Answers = Callable[[str, "str | None"], bool]


class CallTable:
    """What every call of one server shares: the methods, the restrictions, the limits.

    ``methods`` are answered here; with ``forward``, every other unary RPC of the
    service is handed to it as bytes (``--http-workers``: the primary answers them), and
    so is inference of a model this front does not serve (``answers``: worker endpoints'
    models and echo endpoints live in the primary), unary or a stream's request.
    ``stream_infer`` answers one ModelStreamInfer request message as it came (with what
    it tells while it waits for a sequence slot: ``Inference.parked``).
    """

    def __init__(
        self,
        settings: Settings,
        methods: dict[str, Method],
        stream_infer: Callable[[Any, Parked | None], Awaitable[bytes | memoryview]],
        pool: BufferPool | None,
        forward: Forward | None = None,
        answers: Answers | None = None,
    ) -> None:
        #: path -> (RPC name, its method; None: forwarded).
        self.methods: dict[str, tuple[str, Method | None]] = {
            rpc_path(name): (name, method) for name, method in methods.items()
        }
        self.forward = forward
        #: None: every model's inference is answered here (the primary).
        self.answers = answers if forward is not None else None
        if forward is not None:
            for name in (*RPCS, HEALTH_CHECK):
                if name != STREAM_RPC and name not in methods:
                    self.methods[rpc_path(name)] = (name, None)
        self.stream_path = f"/{SERVICE}/{STREAM_RPC}"
        self.stream_infer = stream_infer
        self.pool = pool
        self.send_limit = settings.grpc_max_message_bytes
        # NOTE: a compressed message is bounded by this once inflated too, like an HTTP body.
        self.receive_limit = min(settings.grpc_max_message_bytes, settings.max_request_bytes)
        # A message partly in is dropped past this plus a second per ``min_transfer_rate``
        # bytes received meanwhile (``Call._upload_timer``): the REST body's rule.
        self.body_timeout = settings.body_timeout
        self.min_transfer_rate = settings.min_transfer_rate
        # A reply the client does not take (its window kept closed) is dropped past this
        # plus a second per ``min_transfer_rate`` bytes the client took of it (``Call._send``).
        self.send_timeout = settings.send_timeout
        #: A connection's share of the workers' queues, and the deadline of a call without
        #: one: for the inference forwarded to the primary (``CallRunner._forwarded_infer``).
        self.max_share = share_of(settings.max_queue_per_worker)
        self.infer_timeout = settings.infer_timeout
        #: The primary's shares of the other fronts' client connections, for the
        #: inferences they forward to its private socket (``CallRunner._count_forwarded``).
        self.forwarded = ForwardedShares()
        #: The REST app for the streams that are not gRPC (``listener.H2Server.serve_rest``);
        #: None: they are answered 415 (a GET: RST_STREAM PROTOCOL_ERROR), as before.
        self.rest: RestOverH2 | None = None
        table = by_api(settings.grpc_restricted_protocol)
        #: method name -> (its restriction, the refusal), for restricted methods only.
        self.restricted = {
            method: (table[api], Forbidden(denial(api, table[api], grpc=True)))
            for method, api in GRPC_METHODS.items()
            if api in table
        }

    def elsewhere(self, model: str, version: str) -> bool:
        """Whether inference of ``model`` (``version``, "" its default) is another front's
        to answer. A request naming no model is answered (refused) here."""
        return self.answers is not None and bool(model) and not self.answers(model, version or None)

    def refusal(self, name: str, metadata: tuple[tuple[str, str], ...]) -> Forbidden | None:
        rule = self.restricted.get(name)
        if rule is None:
            return None
        restriction, refusal = rule
        # NOTE: the key sent twice is refused whichever comes first, as REST refuses a
        #   header sent twice (its values joined); only the first was judged here.
        sent = [value for key, value in metadata if key == restriction.header]
        return None if len(sent) == 1 and allows(restriction, sent[0]) else refusal
