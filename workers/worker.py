"""Entry point of a worker process.

A worker owns ONNX Runtime sessions for the models placed on it and serves
one request at a time, in arrival order, from a socket to the front that started
it. With a listening socket (``--http-workers``), other fronts of the same server
connect too: each connection gets its replies on itself and output segments of
its own, freed when it closes; only the starting front loads, unloads and stops.
It never handles SIGINT (the front coordinates shutdown); SIGTERM sent to the
worker itself makes it finish what it has already received, free its shared
memory and exit 0.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
from collections.abc import Callable
from time import monotonic_ns
from types import FrameType
from typing import Final

import msgspec
from mypy_extensions import mypyc_attr

from oipserve.wire.datatypes import bytes_count_fault, element_count, split_bytes_elements
from oipserve.wire.framing import frame_into
from oipserve.wire.messages import (
    DecodeJson,
    EndSequences,
    ErrorKind,
    Failed,
    Forget,
    ForgetRegions,
    Infer,
    InferDone,
    JsonDecoded,
    JsonParsed,
    Loaded,
    LoadModel,
    ParseJson,
    Release,
    StepTimes,
    Stop,
    TensorDesc,
    ToWorker,
    Unloaded,
    UnloadModel,
    WorkerReady,
)
from workers import json_text, runtime
from workers.busy_poll import NextRequestPoll, next_events
from workers.chains import run_chain
from workers.colocation import Colocation, pinned_siblings
from workers.failures import SEE_LOG, run_failure
from workers.fronts import FrontConnection, accept_front
from workers.heap import return_free_heap
from workers.images import decode_batch, quiet_opencv
from workers.late import LateRequests
from workers.outputs import bound_descs, bound_outputs, run_bound, write_outputs
from workers.peer_segments import CheckedSegments, server_prefix
from workers.regions import RegionCache, RegionError, RegionRefusal
from workers.sequence_state import SequenceStates

log = logging.getLogger("oipserve.worker")

#: Replies wait to leave together while the messages of one read are handled (one write
#: for all), unless this much time (ns) went by since the read: a reply held behind a queue
#: of long runs would reach its front only after all of them (a model of 39 ms a run, seven
#: requests in one read: the first answer 230 ms late). Tiny requests (~30 µs a run) still
#: leave a read's answers in one write; an answer after a run past this leaves at once.
REPLY_HOLD_NS: Final = 1_000_000
#: An InferDone's steps when it answers no ensemble chain (shared, never changed).
_NO_STEPS: Final[list[StepTimes]] = []


# NOTE: tests feed an ensemble chain's first step through a subclass's ``feeds``.
@mypyc_attr(allow_interpreted_subclasses=True)
class Worker:
    def __init__(
        self,
        sock: socket.socket,
        segment_prefix: str,
        fronts: socket.socket | None = None,
        busy_poll_us: int = 0,
        colocate_with: int = 0,
    ) -> None:
        self.sessions: dict[str, runtime.ModelSession] = {}
        #: Clients' shared-memory objects (system shared-memory extension).
        self.regions = RegionCache()
        #: Implicit state of the sequences this worker owns (``workers.sequence_state``).
        self.sequences = SequenceStates()
        self.segment_prefix = segment_prefix
        self.starter = FrontConnection(sock, segment_prefix, starter=True)
        self.starter.pid = colocate_with
        # Ensembles: inputs may lie in workers' output segments (workers.peer_segments).
        self.starter.inputs = CheckedSegments(server_prefix(segment_prefix))
        #: Every front's connection, the starter's first.
        self.connections: list[FrontConnection] = [self.starter]
        #: Where other fronts connect (``--http-workers``), or None.
        self.fronts = fronts
        #: The connections by fd, as ``serve``'s epoll reports them; the listener's fd.
        self._by_fd: dict[int, FrontConnection] = {}
        self._listener = -1
        self._accepted = 0
        #: What each front is told first (the process and its ONNX Runtime).
        self.greeting = WorkerReady(os.getpid(), "")
        self.decoder = msgspec.msgpack.Decoder(ToWorker)
        self.encoder = msgspec.msgpack.Encoder()
        #: Requests come to past their deadline, answered without running (``workers.late``).
        self.late = LateRequests()
        #: When to poll for the next request instead of sleeping (``workers.busy_poll``).
        self.polling = NextRequestPoll(busy_poll_us * 1000)
        #: Whether this worker runs on its front's CPU (``workers.colocation``).
        self.colocation = Colocation(
            colocate_with != 0, taken=lambda: pinned_siblings(self.front_pids())
        )
        #: This turn of the loop: its Infer messages, and their front's pid (0: several).
        self._infers = 0
        self._infers_from = -1
        #: The last Infer's front had no other request in flight (``Infer.light``).
        self._light = False

    def serve(self) -> None:
        """Read frames until the starter's Stop or EOF, or SIGTERM; answer each in order."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        poll = self._poll(wake_r)
        try:
            until = 0
            while True:
                most = len(self._by_fd) + 2  # the wake pipe, the listener
                events = next_events(poll, until, self.colocation.sleep_limit(), most)
                if not events:  # asleep that long while pinned (workers.colocation)
                    self.colocation.idled()
                    until = 0
                    continue
                woken = monotonic_ns()
                self.polling.woken(woken)
                if _ready(events, wake_r):
                    os.read(wake_r, 64)
                    # Drain what already arrived, on every connection, then leave.
                    for connection in self.connections:
                        while self.receive(connection, socket.MSG_DONTWAIT):
                            pass
                    return
                if not self._serve_events(events, poll, woken):
                    return  # the starting front is gone, or said Stop
                self._judge_turn()
                until = self.polling.idle(monotonic_ns(), light=self._light)
        finally:
            poll.close()
            self._by_fd.clear()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)

    def _poll(self, wake_r: int) -> select.epoll:
        """The epoll ``serve`` waits in: the starter's socket, the wake pipe, the listener.

        PERF: the sockets stay blocking (toggling O_NONBLOCK costs two fcntl calls each way
        per reply); epoll says when a recv will not block, and the drain after SIGTERM
        reads with MSG_DONTWAIT. Epoll itself, not ``selectors``: its ``select`` builds
        (SelectorKey, events) pairs in interpreted Python at every call.
        NOTE: epoll, not select(): select() fails with "filedescriptor out of range" once
        an fd number passes 1024, which a worker started by a front with many open
        connections inherits.
        """
        self.starter.sock.setblocking(True)
        poll = select.epoll()
        starter = self.starter.sock.fileno()
        poll.register(starter, select.EPOLLIN)
        self._by_fd[starter] = self.starter
        poll.register(wake_r, select.EPOLLIN)
        if self.fronts is not None:
            self.fronts.setblocking(False)
            self._listener = self.fronts.fileno()
            poll.register(self._listener, select.EPOLLIN)
        return poll

    def _serve_events(self, events: list[tuple[int, int]], poll: select.epoll, woken: int) -> bool:
        """Accept or read what each ready fd has (any event, a hang-up or error too, is
        read: its recv tells); False once the starter's connection ended. ``woken``: when
        epoll answered (``monotonic_ns``)."""
        since = woken  # PERF: the first read's hold counts from it (a clock read less)
        for fd, _ in events:
            if fd == self._listener:
                self.accept(poll)
                continue
            connection = self._by_fd.get(fd)
            if connection is None:
                continue
            served = self.receive(connection, 0, since)
            since = 0
            if served:
                continue
            if connection is self.starter:
                return False
            self.disconnect(connection, poll)
        return True

    def _judge_turn(self) -> None:
        """Tell the co-location what this turn carried (``workers.colocation``)."""
        if self._infers:
            self.colocation.turn(self._infers_from, self._infers, self._light)
            self._infers = 0
            self._infers_from = -1

    def receive(self, connection: FrontConnection, flags: int, since: int = 0) -> bool:
        """Handle what arrived on one connection; False once it ended (EOF, Stop, a front
        that cannot take its replies) or, with MSG_DONTWAIT, when nothing more is there."""
        try:
            data = connection.sock.recv(1 << 20, flags)
        except OSError:  # BlockingIOError (nothing more, MSG_DONTWAIT), a reset: both end it
            return False
        if not data:
            return False
        if not since:
            since = monotonic_ns()
        for body in connection.splitter.feed(data):
            if not self.handle(self.decoder.decode(body), connection):
                connection.flush()
                return False
            if connection.replies and monotonic_ns() - since > REPLY_HOLD_NS:
                if not connection.flush():
                    return False
                since = monotonic_ns()
        return connection.flush()

    def front_pids(self) -> set[int]:
        """The pids of the fronts connected to this worker (known when co-locating)."""
        return {connection.pid for connection in self.connections if connection.pid}

    def accept(self, poll: select.epoll) -> None:
        """Another front of this server connects (``workers.fronts.accept_front``)."""
        if self.fronts is None:  # serve() polls the listener only when there is one
            raise RuntimeError("a front connected to a worker without a front listener")
        accepted = accept_front(self.fronts)
        if accepted is None:
            return
        sock, pid = accepted
        self._accepted += 1
        connection = FrontConnection(sock, f"{self.segment_prefix}c{self._accepted}-", False)
        connection.pid = pid
        connection.inputs = CheckedSegments(server_prefix(self.segment_prefix))
        self.connections.append(connection)
        poll.register(sock.fileno(), select.EPOLLIN)
        self._by_fd[sock.fileno()] = connection
        self.reply(connection, self.greeting)
        if connection.flush():
            log.info("front pid %d connected", pid)
        else:
            self.disconnect(connection, poll)

    def disconnect(self, connection: FrontConnection, poll: select.epoll) -> None:
        """Another front left (or cannot be written to): its output segments go with it."""
        fd = connection.sock.fileno()
        poll.unregister(fd)
        del self._by_fd[fd]
        self.connections.remove(connection)
        connection.close()

    def reply(self, connection: FrontConnection, message: object) -> None:
        frame_into(self.encoder, message, connection.replies)

    def fail(self, connection: FrontConnection, rid: int, kind: ErrorKind, message: str) -> None:
        self.reply(connection, Failed(rid, kind, message, dropped=connection.take_dropped()))

    def handle(self, message: ToWorker, connection: FrontConnection) -> bool:
        """Handle one message from one front; False ends that connection (and, from the
        starter, the worker)."""
        # PERF: type(), not isinstance: a msgspec Struct class that is not the message's
        #   own type looks up ``__instancecheck__``, a bound method made a test.
        if type(message) is Infer:
            self._infers += 1
            self._light = message.light
            if self._infers_from != connection.pid:
                self._infers_from = connection.pid if self._infers_from == -1 else 0
            self.infer(message, connection)
        elif type(message) is ParseJson:
            self.parse_json(message, connection)
        elif type(message) is DecodeJson:
            self.decode_json(message, connection)
        elif type(message) is Release:
            for name in message.segments:
                connection.outputs.release_by_name(name)
        elif type(message) is Forget:
            for name in message.segments:
                connection.inputs.forget(name)
        elif type(message) is ForgetRegions:
            self.regions.forget(message.objects)
        elif type(message) is EndSequences:
            self.sequences.end(message.key, message.handles)
        elif type(message) is Stop:
            return False
        elif isinstance(message, (LoadModel, UnloadModel)):
            self.manage(message, connection)
        return True

    def manage(self, message: LoadModel | UnloadModel, connection: FrontConnection) -> None:
        """Load or unload a model: only the starting front manages sessions."""
        if not connection.starter:
            self.fail(
                connection,
                message.rid,
                ErrorKind.INTERNAL,
                "only the front that started this worker loads and unloads models",
            )
        elif isinstance(message, LoadModel):
            self.load(message)
        else:
            self.sessions.pop(message.key, None)
            self.sequences.drop_model(message.key)
            self.late.forget(message.key)
            return_free_heap()  # the session's blocks, freed just now
            self.reply(connection, Unloaded(message.rid, message.key))

    def load(self, message: LoadModel) -> None:
        try:
            session = runtime.ModelSession(
                message.path, message.intra_op_threads, message.providers, message.session_options
            )
        except runtime.LOAD_ERRORS as exc:  # the model file or its options: say why
            return_free_heap()  # what the session had built before it failed
            self.fail(self.starter, message.rid, ErrorKind.INVALID_INPUT, str(exc))
            return
        except Exception:
            log.exception("loading %s from %s failed", message.key, message.path)
            self.fail(
                self.starter,
                message.rid,
                ErrorKind.INTERNAL,
                f"loading '{message.key}' failed{SEE_LOG}",
            )
            return
        self.sessions[message.key] = session
        self.reply(
            self.starter,
            Loaded(
                message.rid,
                message.key,
                session.inputs,
                session.outputs,
                session.session.get_providers(),
                session.optional_inputs,
                session.session.get_session_options().graph_optimization_level.name,
            ),
        )

    def parse_json(self, message: ParseJson, connection: FrontConnection) -> None:
        self._json_step(
            connection,
            message.rid,
            "parsing",
            lambda: JsonParsed(message.rid, json_text.parse(message, connection.inputs)),
        )

    def decode_json(self, message: DecodeJson, connection: FrontConnection) -> None:
        def step() -> JsonDecoded:
            json_text.decode(message.texts, connection.inputs)
            return JsonDecoded(message.rid)

        self._json_step(connection, message.rid, "decoding", step)

    def _json_step(
        self, connection: FrontConnection, rid: int, doing: str, step: Callable[[], object]
    ) -> None:
        """Run one step of a large JSON body (json_text) and reply with what it returns;
        a ValueError is the client's."""
        try:
            reply = step()
        except ValueError as exc:
            self.fail(connection, rid, ErrorKind.INVALID_INPUT, str(exc))
            return
        except Exception:
            log.exception("%s a JSON request body failed", doing)
            self.fail(connection, rid, ErrorKind.INTERNAL, f"{doing} the request failed{SEE_LOG}")
            return
        self.reply(connection, reply)

    def infer(self, message: Infer, connection: FrontConnection) -> None:
        started = monotonic_ns()
        late = self.late
        if message.expires and late.too_late(message.key, message.expires, started):
            skipped = late.skip(message.rid, message.expires, started)
            self.fail(connection, message.rid, *skipped)
            return
        session = self.sessions.get(message.key)
        if session is None:
            self.fail(
                connection,
                message.rid,
                ErrorKind.UNAVAILABLE,
                f"model '{message.key}' is not loaded here",
            )
            return
        if message.chain:  # an ensemble's steps, one after another here
            run_chain(self, message, connection, started)
            return
        targets = {t.name: t for t in message.targets}
        try:
            feeds = self.feeds(message.inputs, session, connection, message.key)
            names = message.outputs or [m.name for m in session.outputs]
            if message.sequence is not None:  # a sequence model: its implicit state
                names = self.sequences.feed(message.key, message.sequence, feeds, names)
            fed = monotonic_ns()
            bound = bound_outputs(self.regions, session, names, feeds, targets, message.inputs)
            if bound is not None:  # ONNX Runtime writes into the clients' regions
                bound, values = run_bound(session, names, feeds, bound, targets, message.key)
            else:
                values = session.run(names, feeds)
            if message.sequence is not None and values is not None:  # (never bound outputs)
                names, values = self.sequences.keep(message.key, message.sequence, names, values)
            del feeds
            ran = monotonic_ns()
            late.ran(message.key, ran - fed)
        except Exception as exc:  # report it and keep serving
            self.fail(connection, message.rid, *run_failure(exc, message.key))
            return
        if bound is not None:
            descs = bound_descs(session, names, bound, targets)
            del bound
            self._done(connection, message.rid, "", descs, started, fed, ran)
            return
        if values is None:  # set by whichever run gave no bound outputs
            raise RuntimeError(f"model '{message.key}' ran but gave no output values")
        try:
            segment, descs = write_outputs(
                self.regions,
                connection.outputs,
                session.output_types,
                names,
                values,
                targets,
                message.text_outputs,
            )
        except (runtime.RequestError, RegionError) as exc:
            self.fail(connection, message.rid, ErrorKind.INVALID_INPUT, str(exc))
            return
        except OSError as exc:
            self.fail(
                connection,
                message.rid,
                ErrorKind.UNAVAILABLE,
                f"no shared memory for the outputs: {exc}",
            )
            return
        self._done(connection, message.rid, segment, descs, started, fed, ran)

    def feeds(
        self,
        inputs: list[TensorDesc],
        session: runtime.ModelSession,
        connection: FrontConnection,
        key: str,
    ) -> dict[str, object]:
        """A request's inputs as ONNX Runtime takes them: arrays, or OrtValues (BF16);
        ``key``: the model's (``name/version``), for the words of a refusal."""
        feeds: dict[str, object] = {}
        for t in inputs:
            if t.region is None and t.image is None:  # in a segment of the front's
                segment = connection.inputs.get(t.segment).buf
                feeds[t.name] = session.feed_at(
                    t.name, t.datatype, t.shape, segment, t.offset, t.nbytes
                )
                del segment
                continue
            buf = self._input(t, connection, key)
            if t.image is not None:  # encoded images: decode here, not in the front
                # NOTE: the front checked that the length prefixes tile the data.
                parts = split_bytes_elements(buf)
                feeds[t.name] = decode_batch(t.name, parts, t.image)
                del parts  # the views pin the segment's mapping
            else:
                feeds[t.name] = session.feed(t.name, t.datatype, t.shape, buf)
            del buf
        return feeds

    def _input(self, t: TensorDesc, connection: FrontConnection, key: str) -> memoryview:
        """An input's bytes: in a segment of the front's, or in a client's region."""
        if t.region is None:
            return connection.inputs.get(t.segment).buf[t.offset : t.offset + t.nbytes]
        buf = self.regions.view(t.region, t.offset, t.nbytes)
        if t.datatype == "BYTES":
            # NOTE: the front does not read clients' regions: the prefixes are checked here,
            #   in Triton's words as the front checks its own; the front puts the request's
            #   id first, which the worker does not know (RegionRefusal: kind REFUSED).
            model = key.rpartition("/")[0]
            fault, tritons = bytes_count_fault(t.name, model, buf, element_count(t.shape))
            if fault:
                refusal = RegionRefusal if tritons else RegionError
                raise refusal(f"{fault} (a client's shared memory region)")
        return buf

    def _done(
        self,
        connection: FrontConnection,
        rid: int,
        segment: str,
        descs: list[TensorDesc],
        started: int,
        fed: int,
        ran: int,
        steps: list[StepTimes] = _NO_STEPS,  # an ensemble chain's (workers.chains)
    ) -> None:
        dropped = connection.take_dropped()
        copied = monotonic_ns()
        input_ns, infer_ns, output_ns = fed - started, ran - fed, copied - ran
        colocation = self.colocation
        colocation.ran(infer_ns)
        done = InferDone(
            rid, segment, descs, dropped, started, input_ns, infer_ns, output_ns, steps,
            -1 if colocation.pinned_to is None else colocation.pinned_to,
        )  # fmt: skip
        self.reply(connection, done)

    def close(self) -> None:
        for connection in self.connections:
            connection.close()
        self.connections.clear()
        if self.fronts is not None:
            self.fronts.close()
        self.regions.close()
        self.sessions.clear()


def _ready(events: list[tuple[int, int]], fd: int) -> bool:
    """Whether ``fd`` is among epoll's ``events``."""
    for ready, _ in events:
        if ready == fd:
            return True
    return False


def _through_wakeup_fd(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler: none of its own, ``serve`` reads it from the wakeup fd."""
    # NOTE: a function, not ``lambda *_: None``: mypyc made C from that lambda that gcc
    #   refuses (its argument passed as an int).


def main(
    sock: socket.socket,
    segment_prefix: str,
    log_level: str,
    fronts: socket.socket | None = None,
    busy_poll_us: int = 0,
    colocate_with: int = 0,
) -> None:
    """Process entry (spawned): serve until told to stop, then free shared memory.
    ``colocate_with``: the starting front's pid, to run on its CPU at low load
    (``workers.colocation``); 0 never."""
    # NOTE: our own process group: Ctrl-C in a terminal, or a supervisor that
    #   signals the front's group, reaches only the front, which drains HTTP first
    #   and then stops the workers. A SIGTERM sent to this pid still drains and exits.
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _through_wakeup_fd)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    quiet_opencv()
    import onnxruntime

    worker = Worker(sock, segment_prefix, fronts, busy_poll_us, colocate_with)
    worker.greeting = WorkerReady(os.getpid(), onnxruntime.__version__)
    worker.reply(worker.starter, worker.greeting)
    worker.starter.flush()
    try:
        worker.serve()
    finally:
        worker.close()
