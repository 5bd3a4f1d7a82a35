"""One worker process as seen from the front: start it, talk to it, notice its death.

Each worker is a ``python -m workers`` process with a socket pair to the front. Requests
carry an id; the reply resolves the matching future; a request with a deadline fails at
it. A worker's death is seen at once through its process sentinel (and the socket
closing): its in-flight requests fail with 503 and its death listeners are told. A
second socket pair carries heartbeats, which a worker answers from a thread of its own.
``oipserve.pool`` keeps all the handles and replaces dead workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable

import msgspec

from oipserve.errors import DeadlineExceeded, Unavailable, from_kind
from oipserve.wire.messages import (
    Failed,
    Forget,
    ForgetRegions,
    Infer,
    InferDone,
    Loaded,
    LoadModel,
    ObjectRef,
    OutputTarget,
    Release,
    Reply,
    Stop,
    TensorDesc,
    UnloadModel,
    WorkerReady,
    frame,
)
from oipserve.wire.shm import sweep
from oipserve.worker_sockets import HeartbeatProtocol, MessageProtocol
from oipserve.workerproc import WorkerProcess, exit_status

log = logging.getLogger("oipserve.pool")  # NOTE: the name operators know

_ENCODER = msgspec.msgpack.Encoder()

#: Seconds a new worker has to import ONNX Runtime and say it is ready.
START_TIMEOUT = 120.0
#: How often a worker's pending requests are checked against their deadlines: a request
#: fails at most this much after its deadline.
DEADLINE_SWEEP = 0.05
#: Seconds a housekeeping message (Release, Forget) waits for a request to carry it.
LAZY_FLUSH = 0.002


#: Seconds a worker whose connection closed may take to exit on its own before it is
#: declared dead and killed (its exit status tells a requested stop from a death).
EXIT_GRACE = 1.0


class WorkerDied(Unavailable):
    pass


class WorkerHandle:
    """One worker process, the requests in flight on it and the models it holds."""

    def __init__(
        self, worker_id: int, device: str, threads: int, prefix: str, dedicated: bool = False
    ) -> None:
        self.worker_id = worker_id
        self.device = device
        self.threads = threads
        #: Started for worker endpoints (POST /v2/workers/.../load): repository models
        #: are not placed here, and it stops once its last session is unloaded.
        self.dedicated = dedicated
        self.segment_prefix = prefix
        self.process: WorkerProcess | None = None
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[object]] = {}
        #: Per pending infer: callbacks run when the worker no longer reads its inputs.
        self.on_done: dict[int, Callable[[], None]] = {}
        self.models: dict[str, LoadModel] = {}
        self.alive = False
        self.ready = asyncio.Event()
        self.pid: int | None = None
        self._next_rid = 0
        self._outbox: list[bytes] = []
        #: A flush is scheduled for this loop iteration.
        self._flush_soon = False
        #: The timer that sends housekeeping messages no request came to carry.
        self._lazy_flush: asyncio.TimerHandle | None = None
        #: PERF: asyncio.get_running_loop() makes a getpid() system call on each use.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._death_listeners: list[Callable[[WorkerHandle], None]] = []
        self._stopping = False
        #: Its end was logged and its death listeners told (once per process).
        self._reported = False
        #: Per pending request with a deadline: that deadline (loop time). PERF: one sweep
        #:   timer per worker checks them, rather than a timer per request.
        self._deadlines: dict[int, float] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._heartbeat: asyncio.Transport | None = None
        #: Loop time of the worker's last heartbeat echo (or of its start).
        self.last_heartbeat = 0.0
        #: Steps in progress during which the worker's heartbeat thread may be silent for a
        #: while, because the step holds the GIL: loads (ONNX Runtime building a session)
        #: and large JSON bodies (msgspec and simdjson, ~1.6 ms per MiB; ``json_offload``).
        self.loading = 0
        self._hung = ""

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def _rid(self) -> int:
        self._next_rid += 1
        return self._next_rid

    async def start(self, loop: asyncio.AbstractEventLoop, log_level: str) -> None:
        # NOTE: CUDA must number GPUs as NVML does, or device_id "N" would not be cuda:N
        #   of the inventory (see hardware.onnxruntime); workers inherit this.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        ours, theirs = socket.socketpair()
        beat_ours, beat_theirs = socket.socketpair()
        try:
            process = WorkerProcess(theirs, beat_theirs, self.segment_prefix, log_level)
        except BaseException:
            ours.close()
            beat_ours.close()
            raise
        finally:
            theirs.close()
            beat_theirs.close()
        self._loop = loop
        self.process = process
        self.alive = True
        self._reported = False
        self._stopping = False
        self._hung = ""
        self.ready = asyncio.Event()
        loop.add_reader(process.sentinel, self.on_exit, "its process exited")
        transport, _ = await loop.connect_accepted_socket(lambda: MessageProtocol(self), ours)
        self.transport = transport  # type: ignore[assignment]
        beat, _ = await loop.connect_accepted_socket(lambda: HeartbeatProtocol(self), beat_ours)
        self._heartbeat = beat  # type: ignore[assignment]
        try:
            await asyncio.wait_for(self.ready.wait(), START_TIMEOUT)
        except TimeoutError:
            self.kill()
            raise RuntimeError(
                f"worker {self.worker_id} did not start in {START_TIMEOUT}s"
            ) from None
        if not self.alive:
            raise RuntimeError(f"worker {self.worker_id} exited during start-up")

    def add_death_listener(self, listener: Callable[[WorkerHandle], None]) -> None:
        self._death_listeners.append(listener)

    def on_message(self, message: object) -> None:
        if isinstance(message, Reply):
            self._deadlines.pop(message.rid, None)
            done = self.on_done.pop(message.rid, None)
            if done is not None:
                done()
            future = self.pending.pop(message.rid, None)
            if future is not None and not future.done():
                future.set_result(message)
            elif isinstance(message, InferDone):
                # NOTE: nobody waits for these outputs any more (the request was
                #   cancelled); hand the segment straight back.
                self.release_outputs(message.segment)
        elif isinstance(message, WorkerReady):
            self.pid = message.pid
            self.last_heartbeat = self._loop.time()  # type: ignore[union-attr]
            self.ready.set()

    def connection_closed(self) -> None:
        """The worker closed its socket: it is exiting, or broken.

        Its process's exit (the sentinel) normally follows at once and says how it ended;
        one still running ``EXIT_GRACE`` seconds later is treated as dead.
        """
        process = self.process
        if process is not None and process.is_alive():
            # NOTE: cut off at once (its requests fail 503, its models stop being ready);
            #   only the report and the replacement wait for the exit status.
            self._cut_off("its connection closed")
            self._loop.call_later(EXIT_GRACE, self._closed_and_running, process)  # type: ignore[union-attr]
        else:
            self.on_exit("its connection closed")

    def _closed_and_running(self, process: WorkerProcess) -> None:
        if process is self.process:  # NOTE: not a replacement started meanwhile
            self.on_exit("its connection closed")

    def on_exit(self, why: str) -> None:
        """The process is gone or must be: cut it off, reap it, say how it ended (once)."""
        self._cut_off(why)
        if self._reported:
            return
        self._reported = True
        code: int | None = None
        if self.process is not None:
            asyncio.get_running_loop().remove_reader(self.process.sentinel)
            self.process.join(0)
            code = self.process.returncode
            # A worker whose socket closed cannot be reached any more: make sure it is
            # gone, then reap it (at once: it has exited, or SIGKILL ends it now).
            self.process.kill()
            self.process.join(5)
        why = self._hung or why
        if self._stopping:
            log.info("worker %d (pid %s) stopped", self.worker_id, self.pid)
            return
        if not self._hung and code in (0, -signal.SIGTERM):
            # NOTE: a worker exits 0 after SIGTERM (it drains first); only an operator
            #   (or a supervisor) sends one, so this is a stop, not a death.
            log.info(
                "worker %d (pid %s) was stopped by SIGTERM (exit status %s); starting a "
                "replacement",
                self.worker_id,
                self.pid,
                code,
            )
        else:
            log.error(
                "worker %d (pid %s) died: %s%s", self.worker_id, self.pid, why, exit_status(code)
            )
        for listener in self._death_listeners:
            listener(self)

    def _cut_off(self, why: str) -> None:
        """Fail everything in flight and take no more (once): it can no longer answer."""
        if not self.alive:
            return
        self.alive = False
        if self.transport is not None:
            self.transport.abort()
        if self._heartbeat is not None:
            self._heartbeat.abort()
        self._deadlines.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        why = self._hung or why
        self.ready.set()  # wake a start() that waits
        error = WorkerDied(
            f"worker {self.worker_id} ({self.device}) stopped while handling this request: {why}"
        )
        for rid, future in list(self.pending.items()):
            done = self.on_done.pop(rid, None)
            if done is not None:
                done()
            if not future.done():
                future.set_exception(error)
        self.pending.clear()
        # The dead process's output segments: nobody else will unlink them.
        sweep(self.segment_prefix)

    def send(self, message: object, urgent: bool = True) -> None:
        """Queue a message; everything queued in one loop iteration goes out in one write.

        A message that is not ``urgent`` (housekeeping: Release, Forget) waits for the next
        urgent one to ride along with, or at most ``LAZY_FLUSH`` seconds.
        """
        if self.transport is None or not self.alive:
            return
        # PERF: one socket write per request (Infer) and one per response (Release)
        #   cost a fifth of the front's time under load; coalescing them per event
        #   loop iteration turns many into one. A Release alone also woke the worker
        #   for nothing: under load it now rides with the next Infer.
        self._outbox.append(frame(_ENCODER, message))
        if urgent:
            if not self._flush_soon:
                self._flush_soon = True
                self._loop.call_soon(self._flush)  # type: ignore[union-attr]
        elif self._lazy_flush is None:
            self._lazy_flush = self._loop.call_later(LAZY_FLUSH, self._flush_lazily)  # type: ignore[union-attr]

    def _flush(self) -> None:
        self._flush_soon = False
        outbox, self._outbox = self._outbox, []
        if self.transport is not None and self.alive and outbox:
            self.transport.write(b"".join(outbox))

    def _flush_lazily(self) -> None:
        self._lazy_flush = None
        self._flush()

    def call(
        self,
        make: Callable[[int], object],
        on_done: Callable[[], None] | None = None,
        deadline: float | None = None,
    ) -> Awaitable[object]:
        """Send a request built with a fresh id; the awaitable resolves to the reply.

        At ``deadline`` (loop time) the awaitable fails with DeadlineExceeded; the request
        stays pending until the worker answers it (the worker may still be reading its
        inputs, and its outputs go straight back to it).
        """
        if not self.alive:
            raise WorkerDied(f"worker {self.worker_id} ({self.device}) is not running")
        rid = self._rid()
        loop = self._loop
        future: asyncio.Future[object] = loop.create_future()  # type: ignore[union-attr]
        self.pending[rid] = future
        if on_done is not None:
            self.on_done[rid] = on_done
        if deadline is not None:
            self._deadlines[rid] = deadline
            if self._sweep is None:
                self._sweep = loop.call_later(DEADLINE_SWEEP, self._expire_overdue)  # type: ignore[union-attr]
        self.send(make(rid))
        if len(self.pending) == 1:
            # PERF: an idle worker gets its request at once (one loop iteration less
            #   of latency); a busy one cannot start it sooner, so it is batched.
            self._flush()
        return future

    def _expire_overdue(self) -> None:
        """Fail the pending requests past their deadline; look again while any are left."""
        self._sweep = None
        loop = self._loop
        now = loop.time()  # type: ignore[union-attr]
        overdue = [rid for rid, deadline in self._deadlines.items() if deadline <= now]
        for rid in overdue:
            del self._deadlines[rid]
            future = self.pending.get(rid)
            if future is not None and not future.done():
                future.set_exception(DeadlineExceeded())
        if self._deadlines:
            self._sweep = loop.call_later(DEADLINE_SWEEP, self._expire_overdue)  # type: ignore[union-attr]

    # ---- heartbeat -------------------------------------------------------------------

    def answered_heartbeat(self) -> None:
        self.last_heartbeat = self._loop.time()  # type: ignore[union-attr]

    def check_heartbeat(self, now: float, timeout: float) -> None:
        """Send the next heartbeat, or declare the worker hung if it stopped answering."""
        if not self.alive or not self.ready.is_set() or self._heartbeat is None:
            return
        silent = now - self.last_heartbeat
        if silent > timeout and not self.loading:
            self._hung = f"it stopped answering its heartbeat for {silent:.1f}s (hung)"
            log.error("worker %d (pid %s): %s; killing it", self.worker_id, self.pid, self._hung)
            self.kill()  # its sentinel reports the exit: requests fail 503, it is replaced
            return
        self._heartbeat.write(b".")

    async def load(
        self,
        key: str,
        path: str,
        providers: list[tuple[str, dict[str, str]]],
        threads: int | None = None,
        session_options: dict[str, str] | None = None,
    ) -> Loaded:
        message: LoadModel | None = None

        def make(rid: int) -> LoadModel:
            nonlocal message
            message = LoadModel(
                rid, key, path, threads or self.threads, providers, session_options or {}
            )
            return message

        self.loading += 1
        try:
            reply = await self.call(make)
        finally:
            self.loading -= 1
        if isinstance(reply, Failed):
            raise from_kind(reply.kind, reply.message)
        assert isinstance(reply, Loaded) and message is not None
        self.models[key] = message
        return reply

    async def unload(self, key: str) -> None:
        self.models.pop(key, None)
        if self.alive:
            await self.call(lambda rid: UnloadModel(rid, key))

    async def infer(
        self,
        key: str,
        inputs: list[TensorDesc],
        outputs: list[str],
        on_inputs_free: Callable[[], None],
        deadline: float | None = None,
        targets: list[OutputTarget] | None = None,
        text_outputs: list[str] | None = None,
    ) -> InferDone:
        into = targets or []
        texts = text_outputs or []
        reply = await self.call(
            lambda rid: Infer(rid, key, inputs, outputs, into, texts), on_inputs_free, deadline
        )
        if isinstance(reply, Failed):
            raise from_kind(reply.kind, reply.message)
        return reply  # type: ignore[return-value]

    def release_outputs(self, segment: str) -> None:
        self.send(Release([segment]), urgent=False)

    def forget_inputs(self, segments: list[str]) -> None:
        self.send(Forget(segments), urgent=False)

    def forget_regions(self, objects: list[ObjectRef]) -> None:
        if self.alive:
            self.send(ForgetRegions(objects))

    async def stop(self, timeout: float) -> None:
        """Ask the worker to stop, wait, then kill it if it does not."""
        self._stopping = True
        process = self.process
        if process is None:
            return
        self.send(Stop())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while process.is_alive() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if process.is_alive():
            log.warning("worker %d did not stop in %.1fs; killing it", self.worker_id, timeout)
            process.kill()
        self.on_exit("stopped")

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
