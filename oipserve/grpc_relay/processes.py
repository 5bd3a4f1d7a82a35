"""The front's gRPC processes: started before ``ready``, replaced when one dies, stopped first.

``GrpcProcesses.start`` starts the first process on ``--grpc-port`` (0: it picks
one) and the others on the port it got; with more than one they bind with
``SO_REUSEPORT`` and the kernel spreads new connections across them. A process
that dies is logged and replaced on the same port (the calls it had forwarded
are cancelled; its clients see their connection close, UNAVAILABLE). ``stop``
tells every process to drain, while the front keeps answering what they forward,
and kills any still running after the timeout. Watching, replacing and stopping
are ``oipserve.supervision``'s, as for the other HTTP fronts.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import msgspec

from oipserve.grpc_front.handlers import Method
from oipserve.grpc_relay.frames import Start, Stop
from oipserve.grpc_relay.front_side import ExitedBeforeListening, FrontSide
from oipserve.settings import Settings
from oipserve.supervision import EXIT_GRACE, Supervisor
from oipserve.wire.shm import BufferPool
from oipserve.workerproc import ChildProcess, exit_status

log = logging.getLogger("oipserve.grpc")

#: How long a new gRPC process may take to import, bind and say ``Listening``.
START_TIMEOUT = 60.0
#: Send buffer of each end of a gRPC process's socket.
SOCKET_BUFFER = 1024 * 1024


class GrpcProcess:
    """One running gRPC process and the front's end of its socket."""

    def __init__(self, process: ChildProcess, side: FrontSide) -> None:
        self.process = process
        self.side = side


class GrpcProcesses:
    """``count`` gRPC processes serving one port, each forwarding to ``methods``; large
    request messages are read into segments of ``inputs`` (the data plane's input pool)."""

    def __init__(
        self, settings: Settings, methods: dict[str, Method], count: int, inputs: BufferPool
    ) -> None:
        self._encoded_settings = msgspec.json.encode(settings)
        self._methods = methods
        self._inputs = inputs
        self._count = count
        self._reuse_port = count > 1
        self._children: Supervisor[GrpcProcess] = Supervisor(
            log, "a gRPC process", _describe, self._start_one, _close_link
        )
        self.port = settings.grpc_port

    async def start(self) -> int:
        """Start every process; the port they serve. Raises RuntimeError when one cannot."""
        try:
            first = await self._children.add(0)
            self.port = first.side.listening.result()
            for slot in range(1, self._count):
                await self._children.add(slot)
        except BaseException:
            self._children.abandon()
            raise
        return self.port

    async def _start_one(self, slot: int) -> GrpcProcess:
        """A new process on ``self.port``, serving once it says ``Listening``."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (ours, theirs):
            # PERF: a 1 MiB message through the default ~200 KB buffer took five wake-ups
            #   each way. Not more: each write and read copies up to this much (twice it,
            #   the kernel doubles it) on the loop, with the page faults of fresh memory.
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        try:
            process = ChildProcess(
                "oipserve.grpc_process", ["--link-fd", str(theirs.fileno())], (theirs.fileno(),)
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        side = FrontSide(self._methods, self._inputs)
        await loop.connect_accepted_socket(lambda: side, ours)
        side.send(Start(self.port, self._reuse_port), self._encoded_settings)
        started = GrpcProcess(process, side)
        try:
            await asyncio.wait_for(asyncio.shield(side.listening), START_TIMEOUT)
        except ExitedBeforeListening:
            _end(started)
            raise RuntimeError(
                f"the gRPC process exited before it listened{exit_status(process.returncode)}"
            ) from None
        except BaseException:
            _end(started)
            raise
        log.info("gRPC process %d serves port %d", process.pid, side.listening.result())
        return started

    async def stop(self, timeout: float) -> None:
        """Every process drains (the front still answers), then exits; stragglers are killed."""
        await self._children.stop(timeout, lambda running: running.side.send(Stop(timeout)))


def _describe(running: GrpcProcess) -> str:
    return f"gRPC process {running.process.pid}"


def _close_link(gone: GrpcProcess) -> None:
    if gone.side.transport is not None:
        gone.side.transport.close()


def _end(started: GrpcProcess) -> None:
    """A process that did not get to serve: killed, reaped, its link closed."""
    started.process.kill()
    started.process.join(EXIT_GRACE)
    _close_link(started)
