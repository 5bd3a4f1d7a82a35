"""uvicorn's httptools protocol with writes coalesced per event-loop iteration.

uvicorn writes a response's head and its body with two ``transport.write``
calls, and each is a ``send`` system call that wakes the client. Holding the
writes made during one loop iteration and handing them over with a single
``writelines`` (one ``writev``) sends head and body together, and also joins
the responses of pipelined requests. Nothing is copied: the transport gets
the same objects, views of shared memory included.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CorkedTransport:
    """A transport proxy that sends everything written in one loop iteration at once."""

    __slots__ = ("_transport", "_pending", "_loop")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._pending: list[Any] = []
        self._loop = loop

    def write(self, data: Any) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        corked = CorkedTransport(transport, asyncio.get_running_loop())
        super().connection_made(corked)  # type: ignore[arg-type]
