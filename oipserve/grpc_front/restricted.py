"""RPCs put behind their API group's metadata key (``--grpc-restricted-protocol``).

An interceptor, installed only when some group is restricted: for each call it
looks the method's restriction up (one dict lookup; None for an unrestricted
RPC, which continues untouched) and, when the call lacks the key or its value,
answers PERMISSION_DENIED with a handler that never parses the request. It runs
before the method lookup (``server._Service``), so a refused ModelInfer is never
counted as arriving.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
import grpc.aio

from oipserve.access import GRPC_METHODS, Restriction, allows, by_api, denial
from oipserve.errors import Forbidden
from oipserve.grpc_front.status import log_failure, status_of

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


class Restricted(grpc.aio.ServerInterceptor):
    """Refuses calls to restricted RPCs that lack their ``triton-grpc-protocol-<key>``."""

    def __init__(self, service: str, restrictions: Iterable[Restriction]) -> None:
        table = by_api(restrictions)
        #: full method path -> (restriction, the handler that refuses it), built once.
        self._rules: dict[str, tuple[Restriction, grpc.RpcMethodHandler]] = {}
        for method, api in GRPC_METHODS.items():
            restriction = table.get(api)
            if restriction is not None:
                refusal = _refusal(method, Forbidden(denial(api, restriction, grpc=True)))
                self._rules[f"/{service}/{method}"] = (restriction, refusal)

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        rule = self._rules.get(details.method)
        if rule is not None:
            restriction, refusal = rule
            if not allows(restriction, _metadata(details, restriction.header)):
                return refusal
        return await continuation(details)


def _metadata(details: grpc.HandlerCallDetails, key: str) -> str | None:
    """The call's value for ``key`` (keys arrive in lower case), or None."""
    for name, value in details.invocation_metadata or ():
        if name == key:
            return value if isinstance(value, str) else None
    return None


def _refusal(method: str, error: Forbidden) -> grpc.RpcMethodHandler:
    """A handler answering ``error``'s status; the request stays unparsed bytes."""
    code, message = status_of(error)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        log_failure(method, code, message, error)
        await context.abort(code, message)

    if method == "ModelStreamInfer":

        async def refuse_stream(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> Any:
            await refuse(None, context)

        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.unary_unary_rpc_method_handler(refuse)
