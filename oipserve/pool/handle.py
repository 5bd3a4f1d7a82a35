"""One worker process as seen from the front that started it.

Each worker is a ``python -m workers`` process with a socket pair to the front. The
requests on that socket (ids, replies, deadlines) are ``oipserve.pool.link``'s; this
adds the process: starting it, loading and unloading its models, noticing its death. A
death is seen at once through its process sentinel (and the socket closing): its
in-flight requests fail with 503 and its death listeners are told. A second socket pair
carries heartbeats, which a worker answers from a thread of its own (``check_heartbeat``
says when silence means a hang, whatever the front's own loop was doing). With
``accepts_fronts`` the worker also listens for other fronts' connections
(``--http-workers``). ``oipserve.pool.worker_pool`` keeps all the handles and replaces dead workers:
one handle is one slot, whose processes follow one another, each reaped (``reaped``)
before the next starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import Final

from oipserve.errors import InternalError, WorkerProtocolError, from_kind
from oipserve.pool.link import MessageProtocol, WorkerDied, WorkerLink
from oipserve.runtime.listeners import unix_listener
from oipserve.runtime.workerproc import WorkerOptions, WorkerProcess, exit_status
from oipserve.wire.messages import Failed, Loaded, LoadModel, Stop, UnloadModel, WorkerReady
from oipserve.wire.shm import sweep

__all__ = ["WorkerDied", "WorkerHandle"]

log = logging.getLogger("oipserve.pool")  # NOTE: the name operators know

#: Seconds a new worker has to import ONNX Runtime and say it is ready.
START_TIMEOUT: Final = 120.0
#: Seconds a worker whose connection closed may take to exit on its own before it is
#: declared dead and killed (its exit status tells a requested stop from a death).
EXIT_GRACE: Final = 1.0
#: How often ``reaped`` looks whether a killed process has been reaped, and after how
#: many seconds it says in the log that one is still not gone (uninterruptible sleep, a
#: core dump being written): the slot's next process waits for it all the same.
REAP_POLL: Final = 0.02
REAP_WARNING: Final = 5.0


class WorkerHandle(WorkerLink):
    """One worker process, the requests in flight on it and the models it holds."""

    def __init__(
        self,
        worker_id: int,
        device: str,
        threads: int,
        prefix: str,
        dedicated: bool = False,
        accepts_fronts: bool = False,
    ) -> None:
        super().__init__(worker_id, device, prefix)
        self.threads = threads
        #: Started for worker endpoints (POST /v2/workers/.../load): repository models
        #: are not placed here, and it stops once its last session is unloaded.
        self.dedicated = dedicated
        #: The worker listens for other fronts (``front_address``).
        self.accepts_fronts = accepts_fronts
        #: Where other fronts connect to this process (an abstract Unix socket name, new
        #: for each process started in this handle); empty unless ``accepts_fronts``.
        self.front_address = ""
        self._starts = 0
        self.process: WorkerProcess | None = None
        self._stopping = False
        #: Its end was logged and its death listeners told (once per process).
        self._reported = False
        #: Our end of the heartbeat socket pair (non-blocking, watched by the loop); closed
        #: when the process is cut off, which tells the worker its front gave it up.
        self._heartbeat: socket.socket | None = None
        #: Why the current process was cut off, once it was.
        self._cut_reason = ""
        #: Loop time at which an echo of the worker was last heard (or it greeted).
        self.last_heartbeat = 0.0
        #: Loop time of the first heartbeat sent since the last echo heard; None when every
        #: heartbeat sent so far was answered by an echo heard since.
        self._unanswered_since: float | None = None

    async def start(self, loop: asyncio.AbstractEventLoop, options: WorkerOptions) -> None:
        # NOTE: CUDA must number GPUs as NVML does, or device_id "N" would not be cuda:N
        #   of the inventory (see hardware.onnxruntime); workers inherit this.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self._close_heartbeat()  # NOTE: an earlier process's, should its cut-off not have run
        ours, theirs = socket.socketpair()
        beat_ours, beat_theirs = socket.socketpair()
        listener = self._front_listener()
        if options.colocate and self.device != "cpu":
            # NOTE: measured on CPU workers only (a GPU worker's driver threads, unmeasured).
            options = options._replace(colocate=False)
        try:
            process = WorkerProcess(theirs, beat_theirs, self.segment_prefix, options, listener)
        except BaseException:
            ours.close()
            beat_ours.close()
            raise
        finally:
            theirs.close()
            beat_theirs.close()
            if listener is not None:
                listener.close()
        self._loop = loop
        self.process = process
        self.pid = process.pid  # NOTE: for the log, before (or without) its greeting
        self._cut_reason = ""
        self.alive = True
        self._reported = False
        self._stopping = False
        self._hung = ""
        self._unanswered_since = None
        self.ready = asyncio.Event()
        # NOTE: bound to this process: the sentinel of an earlier one must never end
        #   the process that follows it in this slot.
        loop.add_reader(process.sentinel, self._process_exited, process)
        transport, _ = await loop.connect_accepted_socket(lambda: MessageProtocol(self), ours)
        self.transport = transport
        beat_ours.setblocking(False)
        self._heartbeat = beat_ours
        loop.add_reader(beat_ours.fileno(), self._hear)
        try:
            await asyncio.wait_for(self.ready.wait(), START_TIMEOUT)
        except TimeoutError:
            self.kill()
            raise RuntimeError(
                f"worker {self.worker_id} did not start in {START_TIMEOUT}s"
            ) from None
        if not self.alive:
            raise RuntimeError(f"worker {self.worker_id} exited during start-up")

    def _front_listener(self) -> socket.socket | None:
        """The listening socket other fronts connect to, bound here and handed to the worker.

        An abstract Unix socket: nothing to remove from the file system, gone with the
        last process holding it. The worker accepts only peers of this user.
        """
        if not self.accepts_fronts:
            self.front_address = ""
            return None
        self._starts += 1
        self.front_address = f"\0{self.segment_prefix}fronts-{self._starts}"
        return unix_listener(self.front_address, 64)

    def on_message(self, message: object) -> None:
        super().on_message(message)
        if type(message) is WorkerReady:  # PERF: (see messages.REPLIES)
            self.last_heartbeat = self._loop.time()

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
            self._loop.call_later(EXIT_GRACE, self._closed_and_running, process)
        else:
            self.on_exit("its connection closed")

    def _closed_and_running(self, process: WorkerProcess) -> None:
        if process is self.process:  # NOTE: not a replacement started meanwhile
            self.on_exit("its connection closed")

    def _process_exited(self, process: WorkerProcess) -> None:
        """A process's sentinel became readable: it has exited."""
        if process is self.process:
            self.on_exit("its process exited")
        elif process.sentinel >= 0:  # an earlier process of this slot (reported already)
            asyncio.get_running_loop().remove_reader(process.sentinel)
            process.join(0)

    def on_exit(self, why: str) -> None:
        """The process is gone or must be: cut it off, kill it, say how it ended (once).

        Its sessions are gone with it (``models`` empties: what it should hold again is the
        registry's to say). It is reaped here when it has exited already, else as soon as
        it has (``_reap_soon``): never by blocking the event loop.
        """
        self._cut_off(why)
        self.models = {}
        if self._reported:
            return
        self._reported = True
        code: int | None = None
        if self.process is not None:
            if self.process.sentinel >= 0:
                asyncio.get_running_loop().remove_reader(self.process.sentinel)
            self.process.join(0)
            code = self.process.returncode
            # A worker whose socket closed cannot be reached any more: make sure it is gone.
            self.process.kill()
            self._reap_soon(self.process)
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

    def _reap_soon(self, process: WorkerProcess) -> None:
        """Reap a killed process now, or as soon as it has exited (no zombie is left, even
        where nobody awaits ``reaped``)."""
        process.join(0)
        if process.returncode is None:
            self._loop.call_later(REAP_POLL, self._reap_soon, process)

    def _cut_off(self, why: str) -> None:
        if not self.alive:
            return
        self._cut_reason = why
        self._close_heartbeat()
        super()._cut_off(why)
        # The dead process's output segments (every front's): nobody else will unlink them.
        sweep(self.segment_prefix)

    # ---- heartbeat -------------------------------------------------------------------

    def check_heartbeat(self, now: float, timeout: float) -> None:
        """Send the next heartbeat, or declare the worker hung if it stopped answering.

        Hung means: a heartbeat was sent more than ``timeout`` seconds ago and no echo has
        come back since, with the socket read to its end just now. The verdict never
        rests on the front's loop having been on time. A heartbeat reaches the worker as
        it is written (a socket pair, not the loop), and its echo waits in the socket
        until the front reads it; the socket is read here before judging, because after
        a stall the loop runs its overdue timers (this check) before it polls the
        sockets (uvloop, libuv). So a front stalled for any time (a CONTINUATION flood,
        a SIGSTOP) finds the echo of its last heartbeat and carries on, while a stopped
        or wedged worker, which sends none, is declared hung ``timeout`` s after the first
        heartbeat it left unanswered: after ``timeout`` plus at most one interval of
        its last answer. Cheap: one ``recv`` and one ``send`` per worker and interval.
        """
        if not self.alive or not self.ready.is_set() or self._heartbeat is None:
            return
        self._hear()
        since = self._unanswered_since
        if since is not None and now - since > timeout and not self.loading:
            silent = now - self.last_heartbeat
            self._hung = f"it stopped answering its heartbeat for {silent:.1f}s (hung)"
            log.error("worker %d (pid %s): %s; killing it", self.worker_id, self.pid, self._hung)
            self.kill()  # its sentinel reports the exit: requests fail 503, it is replaced
            return
        try:
            self._heartbeat.send(b".")
        except OSError:
            pass  # NOTE: a full or broken socket: unanswered all the same, and judged so
        if since is None:
            self._unanswered_since = now

    def _hear(self) -> None:
        """Read every echo the heartbeat socket holds (the loop's reader, and the check)."""
        beat = self._heartbeat
        if beat is None:
            return
        heard = False
        while True:
            try:
                data = beat.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                # NOTE: the worker's end closed (it is exiting): stop watching a socket
                #   that stays readable; its sentinel, or the check, ends it.
                self._loop.remove_reader(beat.fileno())
                break
            heard = True
        if heard:
            self.last_heartbeat = self._loop.time()
            self._unanswered_since = None

    def _close_heartbeat(self) -> None:
        beat, self._heartbeat = self._heartbeat, None
        if beat is not None:
            self._loop.remove_reader(beat.fileno())
            beat.close()

    # ---- models and the process ------------------------------------------------------

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
        if not isinstance(reply, Loaded) or message is None:
            raise WorkerProtocolError(
                f"worker {self.worker_id} answered {type(reply).__name__} to LoadModel"
            )
        self.models[key] = message
        return reply

    async def unload(self, key: str) -> None:
        self.models.pop(key, None)
        if self.alive:
            await self.call(lambda rid: UnloadModel(rid, key))

    async def stop(self, timeout: float) -> None:
        """Ask the worker to stop, wait, then kill it if it does not; reap it."""
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
            if timeout > 0:
                log.warning("worker %d did not stop in %.1fs; killing it", self.worker_id, timeout)
            process.kill()
        self.on_exit("stopped")
        await self.reaped(REAP_WARNING)

    async def reaped(self, timeout: float | None = None) -> None:
        """The last process started in this handle is gone: its end reported (once), the
        process killed if it still ran, reaped (no zombie left) and its output segments
        swept. The pool awaits this before it starts the next process of this slot, so two
        processes of one slot never run side by side nor share a segment name.

        Waits as long as the kernel takes to let the process go, or ``timeout`` seconds.
        """
        process = self.process
        if process is None:
            return
        process.kill()
        loop = asyncio.get_running_loop()
        started = loop.time()
        warned = False
        # NOTE: is_alive() reaps without closing the sentinel, which the event loop may
        #   still watch (on_exit stops watching it, then join closes it).
        while process.is_alive():
            waited = loop.time() - started
            if timeout is not None and waited >= timeout:
                log.error("worker %d (pid %s) is still not reaped", self.worker_id, process.pid)
                return
            if not warned and waited >= REAP_WARNING:
                warned = True
                log.warning(
                    "worker %d (pid %s) was killed %.0fs ago and has not exited yet; the "
                    "next process of its slot waits for it",
                    self.worker_id,
                    process.pid,
                    waited,
                )
            await asyncio.sleep(REAP_POLL)
        if not self._reported:
            # NOTE: a start that failed before the sentinel said so (its socket closed
            #   first): its end is reported here, with its exit status, as any other.
            self.on_exit(self._cut_reason or "its start failed")
        process.join(0)
        sweep(self.segment_prefix)  # NOTE: what it made after its cut-off swept them

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()


def own_handle(worker: WorkerLink) -> WorkerHandle:
    """``worker`` as a process this front started and manages (load, unload, stop).

    A model version's workers are links: handles in the primary front, which started
    them; in another front (``--http-workers``) links to the primary's workers, which
    only the primary manages.
    """
    if not isinstance(worker, WorkerHandle):
        raise InternalError(f"worker {worker.worker_id} is not one this front started")
    return worker
