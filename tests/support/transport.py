"""An asyncio transport in memory, for driving an HTTP protocol object without a socket."""

from __future__ import annotations

import asyncio
from typing import Any


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
