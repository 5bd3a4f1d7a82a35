"""Another front's gRPC calls that the primary answers: forwarded as bytes, over a channel.

An HTTP front answers ModelInfer, ModelStreamInfer and ServerLive itself; every other
RPC (readiness, metadata, config, statistics, repository, shared memory) carries state
the primary owns, so it goes there unchanged: the request's bytes, its metadata (the
primary checks restrictions again, as its REST routes do for forwarded headers) and
what is left of its deadline. The primary serves the same service on a private
abstract Unix socket for this (``primary.grpc_forward_address``).

The channel is grpc's client (``grpc.aio``): these RPCs are rare next to inference,
and the front has no HTTP/2 client of its own.

An inference (a model only the primary serves: a worker endpoint's) is marked with the
client connection it came from (``header_rules.FORWARDED_CONNECTION``: this front's pid
and the serial of the connection's share, never reused in this process; not an index of
the fronts, which a replacement takes over while its predecessor's calls may still be at
a worker), so that the primary counts it in that connection's share of the workers'
queues until the worker answers (``runtime.worker_share.ForwardedShares``).
"""

from __future__ import annotations

import os

import grpc
import grpc.aio

from oipserve.front.grpc.handler_context import Aborted
from oipserve.front.grpc.rpcs import rpc_path
from oipserve.front.header_rules import forwarded_metadata

_UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class GrpcForwarder:
    """Calls RPCs of the primary with the bytes a client sent here."""

    def __init__(self, address: str) -> None:
        # NOTE: grpc names an abstract socket without its leading NUL.
        self._channel = grpc.aio.insecure_channel(
            f"unix-abstract:{address.lstrip(chr(0))}", options=_UNLIMITED
        )
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        #: What every mark of this front starts with: its pid (a replacement has its own).
        self._front = f"{os.getpid()}."

    async def __call__(
        self,
        method: str,
        request: bytes,
        metadata: tuple[tuple[str, str], ...],
        timeout: float | None,
        connection: int = 0,
    ) -> bytes:
        """``method`` answered by the primary; ``connection``: the serial of the share of
        the client connection whose inference this is (0: not an inference)."""
        call = self._calls.get(method)
        if call is None:
            call = self._calls[method] = self._channel.unary_unary(rpc_path(method))
        # NOTE: ``metadata`` passed the rules every front applies on arrival
        #   (``oipserve.front.header_rules``), which are what grpc.aio sends; so does ``timeout``.
        mark = f"{self._front}{connection}" if connection else ""
        try:
            return await call(request, metadata=forwarded_metadata(metadata, mark), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise Aborted(exc.code(), exc.details() or "") from None

    async def close(self) -> None:
        await self._channel.close()
