"""The front's gRPC processes: started before ``ready``, replaced when one dies, stopped first.

``GrpcProcesses.start`` starts the first process on ``--grpc-port`` (0: it picks
one) and the others on the port it got; with more than one they bind with
``SO_REUSEPORT`` and the kernel spreads new connections across them. A process
that dies is logged and replaced on the same port (the calls it had forwarded
are cancelled; its clients see their connection close, UNAVAILABLE). ``stop``
tells every process to drain, while the front keeps answering what they forward,
and kills any still running after the timeout.
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
from oipserve.wire.shm import BufferPool
from oipserve.workerproc import ChildProcess, exit_status

log = logging.getLogger("oipserve.grpc")

#: How long a new gRPC process may take to import, bind and say ``Listening``.
START_TIMEOUT = 60.0
#: Send buffer of each end of a gRPC process's socket.
SOCKET_BUFFER = 1024 * 1024
#: Beyond the drain's timeout, how long a stopping process gets to exit.
EXIT_GRACE = 5.0


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
        self._running: list[GrpcProcess] = []
        self._stopping = False
        self._replacing: set[asyncio.Task[None]] = set()
        self.port = settings.grpc_port

    async def start(self) -> int:
        """Start every process; the port they serve. Raises RuntimeError when one cannot."""
        try:
            first = await self._start_one(self.port)
            self.port = first.side.listening.result()
            self._watch(first)
            for _ in range(self._count - 1):
                self._watch(await self._start_one(self.port))
        except BaseException:
            self._stopping = True
            for started in self._running:
                self._unwatch(started)
                self._end(started)
            raise
        return self.port

    async def _start_one(self, port: int) -> GrpcProcess:
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
        finally:
            theirs.close()
        side = FrontSide(self._methods, self._inputs)
        await loop.connect_accepted_socket(lambda: side, ours)
        side.send(Start(port, self._reuse_port), self._encoded_settings)
        started = GrpcProcess(process, side)
        try:
            await asyncio.wait_for(asyncio.shield(side.listening), START_TIMEOUT)
        except ExitedBeforeListening:
            self._end(started)
            raise RuntimeError(
                f"the gRPC process exited before it listened{exit_status(process.returncode)}"
            ) from None
        except BaseException:
            self._end(started)
            raise
        return started

    def _watch(self, started: GrpcProcess) -> None:
        self._running.append(started)
        asyncio.get_running_loop().add_reader(started.process.sentinel, self._exited, started)

    def _unwatch(self, started: GrpcProcess) -> None:
        if started.process.sentinel >= 0:
            asyncio.get_running_loop().remove_reader(started.process.sentinel)

    def _exited(self, gone: GrpcProcess) -> None:
        self._unwatch(gone)
        gone.process.join(0)
        if gone in self._running:
            self._running.remove(gone)
        if gone.side.transport is not None:
            gone.side.transport.close()
        if self._stopping:
            return
        code = gone.process.returncode
        # NOTE: a process that exits 0 was stopped on purpose (SIGTERM to it alone: it
        #   drains first), as a worker is; anything else is a death.
        report = log.info if code == 0 else log.error
        how = "was stopped" if code == 0 else "died"
        report("gRPC process %d %s%s; starting another", gone.process.pid, how, exit_status(code))
        task = asyncio.get_running_loop().create_task(self._replace())
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self) -> None:
        try:
            started = await self._start_one(self.port)
        except (RuntimeError, TimeoutError) as exc:
            log.error("cannot start a gRPC process on port %d: %s", self.port, exc)
            return
        if self._stopping:
            self._end(started)
            return
        self._watch(started)
        log.info("gRPC process %d serves port %d", started.process.pid, self.port)

    def _end(self, started: GrpcProcess) -> None:
        started.process.kill()
        started.process.join(EXIT_GRACE)
        if started.side.transport is not None:
            started.side.transport.close()

    async def stop(self, timeout: float) -> None:
        """Every process drains (the front still answers), then exits; stragglers are killed."""
        self._stopping = True
        for task in list(self._replacing):
            task.cancel()
        running = list(self._running)
        for each in running:
            each.side.send(Stop(timeout))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout + EXIT_GRACE
        for each in running:
            try:
                await asyncio.wait_for(each.side.closed.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                log.warning("gRPC process %d did not stop in time; killing it", each.process.pid)
        for each in running:
            self._unwatch(each)
            self._end(each)
        self._running.clear()
