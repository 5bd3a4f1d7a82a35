"""Entry point of a worker process.

A worker owns ONNX Runtime sessions for the models placed on it and serves
one request at a time, in arrival order, from a socket to the front. It never
handles SIGINT (the front coordinates shutdown); SIGTERM sent to the worker
itself makes it finish what it has already received, free its shared memory
and exit 0.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
from collections.abc import Callable
from time import monotonic_ns

import msgspec

from oipserve.wire.datatypes import element_count, split_bytes_elements
from oipserve.wire.images import ImageError
from oipserve.wire.messages import (
    DecodeJson,
    ErrorKind,
    Failed,
    Forget,
    ForgetRegions,
    FrameSplitter,
    Infer,
    InferDone,
    JsonDecoded,
    JsonParsed,
    Loaded,
    LoadModel,
    ParseJson,
    Release,
    Stop,
    TensorDesc,
    ToWorker,
    Unloaded,
    UnloadModel,
    WorkerReady,
    frame,
)
from oipserve.wire.shm import BufferPool, SegmentCache
from workers import json_text, runtime
from workers.images import decode_batch
from workers.outputs import bound_outputs, write_outputs
from workers.regions import RegionCache, RegionError

log = logging.getLogger("oipserve.worker")

#: Ends the client's message for an unexpected failure; the traceback is logged.
_SEE_LOG = " (an internal error; the server log has the details)"


class Worker:
    def __init__(self, sock: socket.socket, segment_prefix: str) -> None:
        self.sock = sock
        self.sessions: dict[str, runtime.ModelSession] = {}
        self.inputs = SegmentCache()
        #: Clients' shared-memory objects (system shared-memory extension).
        self.regions = RegionCache()
        self.dropped: list[str] = []
        self.outputs = BufferPool(segment_prefix, on_drop=self.dropped.append)
        self.decoder = msgspec.msgpack.Decoder(ToWorker)
        self.encoder = msgspec.msgpack.Encoder()
        self.replies: list[bytes] = []

    def serve(self) -> None:
        """Read frames until Stop, EOF or SIGTERM; answer each in order."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        terminating = False
        splitter = FrameSplitter()
        # PERF: the socket stays blocking (toggling O_NONBLOCK costs two fcntl calls
        #   each way per reply); the selector says when a recv will not block, and the
        #   drain after SIGTERM reads with MSG_DONTWAIT.
        # NOTE: a selector (epoll), not select(): select() fails with "filedescriptor
        #   out of range" once an fd number passes 1024, which a worker started by a
        #   front with many open connections inherits.
        self.sock.setblocking(True)
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        try:
            while True:
                flags = 0
                if not terminating:
                    events = selector.select()
                    if any(key.fd == wake_r for key, _ in events):
                        os.read(wake_r, 64)
                        terminating = True  # drain what already arrived, then leave
                if terminating:
                    flags = socket.MSG_DONTWAIT
                try:
                    data = self.sock.recv(1 << 20, flags)
                except BlockingIOError:
                    return  # terminating, and nothing more has arrived
                if not data:
                    return  # the front is gone
                for body in splitter.feed(data):
                    if not self.handle(self.decoder.decode(body)):
                        self.flush()
                        return
                self.flush()
        finally:
            selector.close()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)

    def flush(self) -> None:
        if not self.replies:
            return
        payload = b"".join(self.replies)
        self.replies.clear()
        try:
            self.sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def reply(self, message: object) -> None:
        self.replies.append(frame(self.encoder, message))

    def fail(self, rid: int, kind: ErrorKind, message: str) -> None:
        self.reply(Failed(rid, kind, message))

    def handle(self, message: ToWorker) -> bool:
        """Handle one message; False means stop."""
        if isinstance(message, Infer):
            self.infer(message)
        elif isinstance(message, ParseJson):
            self.parse_json(message)
        elif isinstance(message, DecodeJson):
            self.decode_json(message)
        elif isinstance(message, Release):
            for name in message.segments:
                self.outputs.release_by_name(name)
        elif isinstance(message, Forget):
            for name in message.segments:
                self.inputs.forget(name)
        elif isinstance(message, ForgetRegions):
            self.regions.forget(message.objects)
        elif isinstance(message, LoadModel):
            self.load(message)
        elif isinstance(message, UnloadModel):
            self.sessions.pop(message.key, None)
            self.reply(Unloaded(message.rid, message.key))
        elif isinstance(message, Stop):
            return False
        return True

    def load(self, message: LoadModel) -> None:
        try:
            session = runtime.ModelSession(
                message.path, message.intra_op_threads, message.providers, message.session_options
            )
        except runtime.LOAD_ERRORS as exc:  # the model file or its options: say why
            self.fail(message.rid, ErrorKind.INVALID_INPUT, str(exc))
            return
        except Exception:
            log.exception("loading %s from %s failed", message.key, message.path)
            self.fail(message.rid, ErrorKind.INTERNAL, f"loading '{message.key}' failed{_SEE_LOG}")
            return
        self.sessions[message.key] = session
        self.reply(
            Loaded(
                message.rid,
                message.key,
                session.inputs,
                session.outputs,
                session.session.get_providers(),
                session.optional_inputs,
            )
        )

    def parse_json(self, message: ParseJson) -> None:
        self._json_step(
            message.rid,
            "parsing",
            lambda: JsonParsed(message.rid, json_text.parse(message, self.inputs)),
        )

    def decode_json(self, message: DecodeJson) -> None:
        def step() -> JsonDecoded:
            json_text.decode(message.texts, self.inputs)
            return JsonDecoded(message.rid)

        self._json_step(message.rid, "decoding", step)

    def _json_step(self, rid: int, doing: str, step: Callable[[], object]) -> None:
        """Run one step of a large JSON body (json_text) and reply with what it returns;
        a ValueError is the client's."""
        try:
            reply = step()
        except ValueError as exc:
            self.fail(rid, ErrorKind.INVALID_INPUT, str(exc))
            return
        except Exception:
            log.exception("%s a JSON request body failed", doing)
            self.fail(rid, ErrorKind.INTERNAL, f"{doing} the request failed{_SEE_LOG}")
            return
        self.reply(reply)

    def infer(self, message: Infer) -> None:
        started = monotonic_ns()
        session = self.sessions.get(message.key)
        if session is None:
            self.fail(
                message.rid, ErrorKind.UNAVAILABLE, f"model '{message.key}' is not loaded here"
            )
            return
        targets = {t.name: t for t in message.targets}
        try:
            feeds = {}
            for t in message.inputs:
                buf = self._input(t)
                if t.image is not None:  # encoded images: decode here, not in the front
                    # NOTE: the front checked that the length prefixes tile the data.
                    parts = split_bytes_elements(buf)
                    feeds[t.name] = decode_batch(t.name, parts, t.image)
                    del parts  # the views pin the segment's mapping
                else:
                    feeds[t.name] = session.feed(t.name, t.datatype, t.shape, buf)
                del buf
            names = message.outputs or [m.name for m in session.outputs]
            fed = monotonic_ns()
            bound = bound_outputs(self.regions, session, names, feeds, targets)
            values = None
            if bound is not None:
                # ONNX Runtime writes the outputs straight into the clients' regions.
                try:
                    session.run_into(names, feeds, bound)
                except Exception:
                    if all(targets[name].shape is not None for name in names):
                        raise
                    # NOTE: a shape came from the graph's dim names, which ONNX Runtime
                    #   holds to for bound outputs only: run again the ordinary way. If
                    #   that works, the names were wrong: this model copies from now on.
                    bound = None
                    values = session.run(names, feeds)
                    session.dim_names_hold = False
                    log.warning(
                        "model '%s': an output's declared dim names do not match what it "
                        "makes; its outputs are copied into clients' regions from now on",
                        message.key,
                    )
            else:
                values = session.run(names, feeds)
            del feeds
            ran = monotonic_ns()
        except (runtime.RequestError, ImageError, RegionError) as exc:
            self.fail(message.rid, ErrorKind.INVALID_INPUT, str(exc))
            return
        except Exception as exc:  # report it and keep serving
            if runtime.rejects_input(exc):
                self.fail(message.rid, ErrorKind.INVALID_INPUT, f"onnxruntime: {exc}")
            else:
                log.exception("model '%s' failed while running", message.key)
                self.fail(
                    message.rid, ErrorKind.INTERNAL, f"model '{message.key}' failed{_SEE_LOG}"
                )
            return
        if bound is not None:
            descs = [
                TensorDesc(
                    name,
                    session.output_types[name],
                    list(bound[name].shape),
                    "",
                    targets[name].offset,
                    bound[name].nbytes,
                    None,
                    targets[name].region,
                )
                for name in names
            ]
            del bound
            self._done(message.rid, "", descs, started, fed, ran)
            return
        assert values is not None
        try:
            segment, descs = write_outputs(
                self.regions, self.outputs, session, names, values, targets, message.text_outputs
            )
        except (runtime.RequestError, RegionError) as exc:
            self.fail(message.rid, ErrorKind.INVALID_INPUT, str(exc))
            return
        except OSError as exc:
            self.fail(
                message.rid, ErrorKind.UNAVAILABLE, f"no shared memory for the outputs: {exc}"
            )
            return
        self._done(message.rid, segment, descs, started, fed, ran)

    def _input(self, t: TensorDesc) -> memoryview:
        """An input's bytes: in a segment of the front's, or in a client's region."""
        if t.region is None:
            return self.inputs.get(t.segment).buf[t.offset : t.offset + t.nbytes]
        buf = self.regions.view(t.region, t.offset, t.nbytes)
        if t.datatype == "BYTES":
            # NOTE: the front does not read clients' regions: the prefixes are checked here.
            try:
                found = len(split_bytes_elements(buf))
            except ValueError as exc:
                raise RegionError(
                    f"BYTES data of input '{t.name}' in shared memory is malformed: {exc}"
                ) from None
            if found != element_count(t.shape):
                raise RegionError(
                    f"input '{t.name}': its shape holds {element_count(t.shape)} elements but "
                    f"its BYTES data in shared memory has {found}"
                )
        return buf

    def _done(
        self, rid: int, segment: str, descs: list[TensorDesc], started: int, fed: int, ran: int
    ) -> None:
        dropped = self.dropped[:]
        self.dropped.clear()
        copied = monotonic_ns()
        self.reply(
            InferDone(rid, segment, descs, dropped, started, fed - started, ran - fed, copied - ran)
        )

    def close(self) -> None:
        self.outputs.close()
        self.inputs.close()
        self.regions.close()
        self.sessions.clear()


def main(sock: socket.socket, segment_prefix: str, log_level: str) -> None:
    """Process entry (spawned): serve until told to stop, then free shared memory."""
    # NOTE: our own process group: Ctrl-C in a terminal, or a supervisor that
    #   signals the front's group, reaches only the front, which drains HTTP first
    #   and then stops the workers. A SIGTERM sent to this pid still drains and exits.
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: None)  # handled through the wakeup fd
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    import onnxruntime

    worker = Worker(sock, segment_prefix)
    worker.reply(WorkerReady(os.getpid(), onnxruntime.__version__))
    worker.flush()
    try:
        worker.serve()
    finally:
        worker.close()
        sock.close()
