"""What a gRPC handler sees of its call on this server's own HTTP/2 (``front.grpc``).

The streaming handler (``front.grpc.streaming``) was written against grpc.aio's
``ServicerContext``; ``Context`` is the small part of it that handler reads: the call's
metadata, and ``abort``, which ends the call with a status (``Aborted``).
"""

from __future__ import annotations

import grpc

__all__ = ["Aborted", "Context"]


class Aborted(Exception):
    """A handler ended its call with this status (``Context.abort``)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Context:
    """What a streaming handler reads of its call (a small part of grpc.aio's context)."""

    __slots__ = ("_metadata",)

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)
