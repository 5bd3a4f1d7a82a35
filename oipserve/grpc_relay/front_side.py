"""The front's end of one gRPC process's socket: forwarded calls run, replies go back.

Each ``Call`` runs as its own task through the same method table the front serves
in-process (``oipserve.grpc_front.handlers.unary_methods``): the request bytes are
parsed here, the data plane answers, the response is serialized here (a large
reply copied out in a thread, without the GIL: ``codec.wire_bytes``). A ``Cancel``
(the client went away, or its deadline passed) cancels that task, which withdraws
a request still queued in a dynamic batcher, exactly as a cancelled call does
in-process. If the socket closes (the process died) every call it had
forwarded is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from oipserve.errors import kind_of
from oipserve.grpc_front.codec import wire_bytes
from oipserve.grpc_front.server import Method
from oipserve.grpc_front.status import log_failure, status_of
from oipserve.grpc_relay.frames import (
    Call,
    Cancel,
    Failed,
    FrameProtocol,
    Header,
    Listening,
    Payload,
    Reply,
)
from oipserve.off_loop import unmap_off_loop
from oipserve.wire.shm import BufferPool, Lease


class ExitedBeforeListening(RuntimeError):
    """The process's socket closed before it said ``Listening`` (nor ``Failed``)."""


class FrontSide(FrameProtocol):
    """Runs the calls one gRPC process forwards.

    A large ModelInfer message is read straight into a segment of ``pool``, the input
    pool: its raw inputs are then where the worker reads them, as a REST body's are,
    and the front never copies them (nor faults in fresh pages for them).
    """

    def __init__(self, methods: dict[str, Method], pool: BufferPool | None = None) -> None:
        super().__init__()
        self._methods = methods
        self._pool = pool
        self._running: dict[int, asyncio.Task[None]] = {}
        #: Leases holding a call's message that no running call has taken over yet.
        self._unclaimed: dict[int, Lease] = {}
        loop = asyncio.get_running_loop()
        self._loop = loop
        #: The port the process serves once it says so; its reason if it cannot.
        self.listening: asyncio.Future[int] = loop.create_future()
        # NOTE: a start that was given up on (timed out, cancelled) never reads the reason.
        self.listening.add_done_callback(lambda f: f.cancelled() or f.exception())
        #: Set when the socket closes.
        self.closed = asyncio.Event()

    def memory_for(self, header: Header, length: int) -> Awaitable[memoryview] | None:
        if self._pool is None or type(header) is not Call or header.method != "ModelInfer":
            return None
        return self._leased(header.id, length)

    async def _leased(self, call_id: int, length: int) -> memoryview:
        assert self._pool is not None
        lease = await self._pool.acquire_async(length)
        if self.closed.is_set():
            lease.release()
            raise ConnectionError("the gRPC process went away")
        self._unclaimed[call_id] = lease
        return lease.buf[:length]

    def frame_received(self, header: Header, payload: Payload) -> None:
        if type(header) is Call:
            task = self._loop.create_task(self._answer(header, payload))
            if header.id in self._unclaimed:
                # NOTE: a task cancelled before its first step never runs its body.
                task.add_done_callback(lambda _, call_id=header.id: self._release(call_id))
            self._running[header.id] = task
        elif type(header) is Cancel:
            task = self._running.pop(header.id, None)
            if task is not None:
                task.cancel()
        elif type(header) is Listening and not self.listening.done():
            self.listening.set_result(header.port)
        elif type(header) is Failed and not self.listening.done():
            self.listening.set_exception(RuntimeError(header.message))

    def _release(self, call_id: int) -> None:
        lease = self._unclaimed.pop(call_id, None)
        if lease is not None:
            lease.release()

    async def _answer(self, call: Call, payload: Payload) -> None:
        leased = call.id in self._unclaimed
        try:
            method = self._methods[call.method]
            request = method.deserialize(payload)
            if leased:
                request.lease = self._unclaimed.pop(call.id)  # the service owns it now
            data = await wire_bytes(await method.call(request), method.serialize)
        except asyncio.CancelledError:
            return  # the process gave up on it (Cancel) or is gone
        except Exception as exc:
            code, message = status_of(exc)
            log_failure(call.method, code, message, exc)
            kind, message = kind_of(exc)
            self.send(Reply(call.id, kind, message))
        else:
            self.send(Reply(call.id), data)
            if type(data) is memoryview:  # gathered into memory of its own: unmapped next
                await self.sent()
                unmap_off_loop(data)
        finally:
            self._running.pop(call.id, None)
            self._release(call.id)  # not taken over: the message did not parse
            if not leased:
                unmap_off_loop(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        for task in self._running.values():
            task.cancel()
        self._running.clear()
        for call_id in list(self._unclaimed):
            self._release(call_id)  # read in part, or never run: the process went away
        if not self.listening.done():
            self.listening.set_exception(ExitedBeforeListening())
        self.closed.set()
