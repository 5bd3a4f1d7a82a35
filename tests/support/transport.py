"""An asyncio transport in memory, for driving an HTTP protocol object without a socket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

P = TypeVar("P", bound=HttpToolsProtocol)


class MemoryTransport(asyncio.Transport):
    """Enough of a socket transport for uvicorn's protocol to take a request in memory:
    what the protocol writes is kept in ``written``; ``close`` only marks it closing."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.protocol: asyncio.BaseProtocol | None = None
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return 0  # every write is taken at once

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol


def connected(
    protocol_class: type[P], app: Callable, **options: Any
) -> tuple[P, ServerState, MemoryTransport]:
    """A ``protocol_class`` serving ``app`` (uvicorn ``Config`` ``options`` on top of quiet
    defaults), connected to a fresh ``MemoryTransport``."""
    config = uvicorn.Config(
        app,
        http=protocol_class,
        lifespan="off",
        proxy_headers=False,
        log_config=None,
        access_log=False,
        **options,
    )
    state = ServerState()
    protocol = protocol_class(config=config, server_state=state, app_state={})
    transport = MemoryTransport()
    protocol.connection_made(transport)
    return protocol, state, transport
