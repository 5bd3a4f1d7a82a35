"""An HTTP/2 client with prior knowledge (h2c) for REST and gRPC on one connection, over a
real socket (``H2c``), and an in-memory peer of the server's own HTTP/2 (``RestPeer``).

``H2c`` is python-hyper's ``h2`` (installed with grpclib, a test dependency), so no code
is shared with the server's own HTTP/2. Streams can be opened together and answered in any
order; a body larger than the server's windows is sent as they open (flow control).

``tests.support.h2_raw`` speaks raw frames to judge protocol errors; this one speaks HTTP/2
as a well-behaved client does (Knative's queue-proxy, Envoy, curl --http2-prior-knowledge).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack

from oipserve.config.settings import Settings
from oipserve.front.grpc.call import Call
from oipserve.front.grpc.h2.frames import (
    END_HEADERS,
    END_STREAM,
    PREFACE,
    Frame,
    Setting,
    frame,
    settings_frame,
)
from oipserve.front.header_rules import App
from oipserve.front.http.h2_asgi import RestOverH2
from oipserve.front.http.h2_connection import Http2Connection
from oipserve.front.http.limits import ConnectionLimits
from tests.support.grpc_peer import FakeService, FakeTransport

#: Seconds an answer is waited for.
TIMEOUT = 30.0
#: A gRPC method of the OIP service.
GRPC_SERVICE = "/inference.GRPCInferenceService/"


@dataclass
class Answer:
    """What came back on one stream."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] = field(default_factory=dict)
    ended: bool = False
    #: The server's RST_STREAM code, if it reset the stream (None: it did not).
    reset: int | None = None

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None


class H2c:
    """One HTTP/2 connection with prior knowledge to ``host:port``."""

    def __init__(
        self,
        host: str,
        port: int,
        window: int | None = None,
        sock: socket.socket | None = None,
        through_goaway: bool = False,
    ) -> None:
        """``sock``: a connection to ``host:port`` already made (to one front, say);
        ``window``: the client's receive window, each stream's and the connection's;
        ``through_goaway``: the streams the server took still finish after its GOAWAY."""
        self.sock = sock or socket.create_connection((host, port), timeout=TIMEOUT)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config)
        self.conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window or 65_535},
        )
        self.conn.initiate_connection()
        if window is not None and window > 65_535:
            self.conn.increment_flow_control_window(window - 65_535)
        if through_goaway:
            _finish_after_goaway(self.conn)
        self.answers: dict[int, Answer] = {}
        self.authority = f"{host}:{port}"
        self.closed = False
        #: The last stream id of the server's latest GOAWAY (None: none came).
        self.goaway_last: int | None = None
        self._through_goaway = through_goaway
        #: Bytes one read takes at most (a client that reads slowly takes less).
        self.read_size = 1 << 20
        self._flush()

    def __enter__(self) -> H2c:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # ---- requests -------------------------------------------------------------------

    def start(
        self,
        method: str,
        path: str,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
        end: bool = True,
    ) -> int:
        """Open a stream: its headers, then ``body`` (as the windows allow); ended when
        ``end``. Returns the stream id."""
        stream = self.conn.get_next_available_stream_id()
        fields = [(":method", method), (":scheme", "http"), (":authority", self.authority)]
        fields += [(":path", path), *headers]
        self.answers[stream] = Answer()
        self.conn.send_headers(stream, fields, end_stream=end and not body)
        self._flush()
        if body:
            self.send_body(stream, body, end)
        return stream

    def send_body(self, stream: int, body: bytes, end: bool = True) -> None:
        """Send ``body`` on ``stream`` as the windows allow (reading meanwhile); stops if the
        server answers or resets the stream first."""
        view = memoryview(body)
        while view:
            answer = self.answers[stream]
            if answer.done or self.closed:
                return
            room = min(
                self.conn.local_flow_control_window(stream),
                self.conn.max_outbound_frame_size,
                len(view),
            )
            if room <= 0:
                self._read_once()
                continue
            self.conn.send_data(stream, bytes(view[:room]))
            view = view[room:]
            self._flush()
        if end and not self.answers[stream].done:
            self.conn.end_stream(stream)
            self._flush()

    def request(
        self,
        method: str,
        path: str,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
    ) -> Answer:
        """One whole request; its answer."""
        return self.wait(self.start(method, path, headers, body))

    def grpc(self, method: str, message: bytes, timeout: str | None = None) -> int:
        """Open a unary gRPC call with ``message`` (serialized), and a ``grpc-timeout``
        (``"300m"``) if given; returns the stream id."""
        headers = [("content-type", "application/grpc"), ("te", "trailers")]
        if timeout is not None:
            headers.append(("grpc-timeout", timeout))
        prefixed = struct.pack(">BI", 0, len(message)) + message
        return self.start("POST", GRPC_SERVICE + method, headers, prefixed)

    # ---- answers --------------------------------------------------------------------

    def wait(self, stream: int, timeout: float = TIMEOUT) -> Answer:
        """Read until ``stream`` is answered whole (or reset)."""
        deadline = time.monotonic() + timeout
        while not self.answers[stream].done:
            if self.closed:
                raise ConnectionError("the server closed the connection")
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream {stream} not answered in {timeout}s")
            self._read_once()
        return self.answers[stream]

    def _read_once(self) -> None:
        data = self.sock.recv(self.read_size)
        if not data:
            self.closed = True
            return
        for event in self.conn.receive_data(data):
            self._event(event)
        self._flush()

    def _event(self, event: h2.events.Event) -> None:
        stream = getattr(event, "stream_id", 0)
        answer = self.answers.get(stream)
        if isinstance(event, h2.events.ResponseReceived) and answer is not None:
            answer.headers = dict(event.headers)  # type: ignore[arg-type]
            answer.status = int(answer.headers.pop(":status"))
        elif isinstance(event, h2.events.DataReceived):
            if answer is not None:
                answer.body += event.data or b""
            self.conn.acknowledge_received_data(event.flow_controlled_length, stream)
        elif isinstance(event, h2.events.TrailersReceived) and answer is not None:
            answer.trailers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.StreamEnded) and answer is not None:
            answer.ended = True
        elif isinstance(event, h2.events.StreamReset) and answer is not None:
            answer.reset = int(event.error_code)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway_last = event.last_stream_id
            self.closed = not self._through_goaway

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)


def _finish_after_goaway(conn: h2.connection.H2Connection) -> None:
    """python-hyper's h2 takes any GOAWAY as the connection's end and refuses each frame
    after it; RFC 9113 (6.8) lets the streams up to its last id finish, as nghttp2's and
    gRPC's clients do: here, all but a new stream's HEADERS still come and go."""
    machine = conn.state_machine
    closed = h2.connection.ConnectionState.CLOSED
    machine._transitions = {  # type: ignore[attr-defined]
        **machine._transitions,
        **{
            (closed, step): (None, closed)
            for step in h2.connection.ConnectionInputs
            if step is not h2.connection.ConnectionInputs.SEND_HEADERS
        },
    }


def grpc_message(body: bytes | bytearray) -> bytes:
    """The one message of a unary gRPC answer's body (its 5-byte prefix checked)."""
    compressed, length = struct.unpack(">BI", bytes(body[:5]))
    assert compressed == 0 and length == len(body) - 5, (compressed, length, len(body))
    return bytes(body[5:])


# ---- in memory: the server's own Connection, driven by raw frames ----------------------


class PeerTransport(FakeTransport):
    """``grpc_peer.FakeTransport``, with the socket's addresses a scope names (none here)."""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class RestPeer:
    """A client connection to the listener's ``Http2Connection``, past its preface, whose
    table serves REST with ``app`` (``RestOverH2``) and gRPC with a ``FakeService``: no
    socket, so a test can send what no real client would (a body that stops, a window
    never given back) and read every frame the server writes."""

    def __init__(
        self,
        app: App,
        settings: Settings | None = None,
        peer_settings: dict[Setting, int] | None = None,
    ) -> None:
        settings = settings or Settings(model_repository=".")
        self.service = FakeService()
        table = self.service.table(settings)
        table.rest = RestOverH2(app, ConnectionLimits.of(settings), settings.max_request_bytes)
        self.transport = PeerTransport()
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.connection = Http2Connection(
            lambda conn, stream: Call(conn, stream, table), lambda _: None
        )
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.send(PREFACE + settings_frame(peer_settings or {}))

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)

    def request(
        self, stream: int, method: str, path: str, *extra: tuple[str, str], end: bool = True
    ) -> None:
        """A request's HEADERS frame (``extra``: its regular fields)."""
        block = self.encoder.encode(
            [(":method", method), (":scheme", "http"), (":path", path), *extra]
        )
        self.send(frame(Frame.HEADERS, END_HEADERS | (END_STREAM if end else 0), stream, block))

    def data(self, stream: int, payload: bytes, end: bool = False) -> None:
        self.send(frame(Frame.DATA, END_STREAM if end else 0, stream, payload))

    async def written(self) -> list[tuple[int, int, int, bytes]]:
        await asyncio.sleep(0)  # writes leave at the end of the loop iteration
        return self.transport.frames()

    def headers_of(self, payload: bytes) -> dict[str, str]:
        """A response's header block, decoded."""
        return dict(self.decoder.decode(payload))  # type: ignore[arg-type]
