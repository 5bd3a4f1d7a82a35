"""The front's end of one gRPC process's socket: forwarded calls run, replies go back.

Each ``Call`` runs as its own task through the same method table the front serves
in-process (``oipserve.grpc_front.handlers.unary_methods``): the request bytes are
parsed here, the data plane answers, the response is serialized here. A ``Cancel``
(the client went away, or its deadline passed) cancels that task, which withdraws
a request still queued in a dynamic batcher, exactly as grpc.aio's cancellation
does in-process. If the socket closes (the process died) every call it had
forwarded is cancelled.
"""

from __future__ import annotations

import asyncio

from oipserve.errors import kind_of
from oipserve.grpc_front.handlers import Method
from oipserve.grpc_front.status import log_failure, status_of
from oipserve.grpc_relay.frames import (
    Call,
    Cancel,
    FrameProtocol,
    Header,
    Listening,
    Payload,
    Reply,
)


class FrontSide(FrameProtocol):
    """Runs the calls one gRPC process forwards."""

    def __init__(self, methods: dict[str, Method]) -> None:
        super().__init__()
        self._methods = methods
        self._running: dict[int, asyncio.Task[None]] = {}
        loop = asyncio.get_running_loop()
        self._loop = loop
        #: The port the process serves, once it says so.
        self.listening: asyncio.Future[int] = loop.create_future()
        #: Set when the socket closes.
        self.closed = asyncio.Event()

    def frame_received(self, header: Header, payload: Payload) -> None:
        if type(header) is Call:
            self._running[header.id] = self._loop.create_task(self._answer(header, payload))
        elif type(header) is Cancel:
            task = self._running.pop(header.id, None)
            if task is not None:
                task.cancel()
        elif type(header) is Listening and not self.listening.done():
            self.listening.set_result(header.port)

    async def _answer(self, call: Call, payload: Payload) -> None:
        try:
            method = self._methods[call.method]
            response = await method.call(method.deserialize(payload))
            data = method.serialize(response)
        except asyncio.CancelledError:
            return  # the process gave up on it (Cancel) or is gone
        except Exception as exc:
            code, message = status_of(exc)
            log_failure(call.method, code, message, exc)
            kind, message = kind_of(exc)
            self.send(Reply(call.id, kind, message))
        else:
            self.send(Reply(call.id), data)
        finally:
            self._running.pop(call.id, None)

    def connection_lost(self, exc: Exception | None) -> None:
        for task in self._running.values():
            task.cancel()
        self._running.clear()
        if not self.listening.done():
            self.listening.cancel()
        self.closed.set()
