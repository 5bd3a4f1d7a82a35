"""The private parts of uvicorn and Falcon that the HTTP fast path relies on, checked by name.

``oipserve/front/http/protocol.py`` subclasses uvicorn's ``HttpToolsProtocol`` and
reads and writes its per-connection and per-request state; ``oipserve/front/http/server.py``
overrides ``uvicorn.Server.capture_signals``; ``oipserve/front/rest/app.py``
subclasses ``falcon.asgi.App`` and relies on how its ``__call__`` reads the
first body event. None of this is public API. pyproject.toml pins uvicorn,
falcon and httptools to the minor series it was read from; these tests say,
name by name, what an upgrade removed or reshaped, so that widening a pin is
a decision made with the list in hand.

When one fails: read the named attribute's new code in the dependency, adapt
the module named in the message, then widen the pin in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import weakref
from collections.abc import Callable

import falcon
import falcon.asgi
import httptools
import uvicorn
from falcon.constants import SINGLETON_HEADERS
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from oipserve.front.http.extensions import RECEIVE_INTO
from oipserve.front.http.lane_cycle import LaneCycle
from oipserve.front.http.protocol import CorkedHttpToolsProtocol
from oipserve.front.rest.app import _App
from oipserve.front.rest.media import JSON
from oipserve.runtime.http_io import CorkedTransport
from tests.support.transport import MemoryTransport, connected

#: HttpToolsProtocol methods that CorkedHttpToolsProtocol overrides or calls, with
#: their parameters after ``self``.
PROTOCOL_METHODS: dict[str, tuple[str, ...]] = {
    "connection_made": ("transport",),
    "connection_lost": ("exc",),
    "eof_received": (),
    "data_received": ("data",),
    "send_400_response": ("msg",),
    "_unsupported_upgrade_warning": (),  # two warnings for every CONNECT: ours is one debug line
    "on_message_begin": (),
    "on_url": ("url",),
    "on_header": ("name", "value"),
    "on_headers_complete": (),
    "on_body": ("body",),
    "on_message_complete": (),
    "on_response_complete": (),  # replaced, not extended: UVICORN_RESPONSE_COMPLETE_NAMES
    "_start_asgi_task": ("cycle", "app"),  # a pipelined request's turn
    "timeout_keep_alive_handler": (),  # closes an idle keep-alive connection
}
#: Every name uvicorn's ``on_response_complete`` uses. ``CorkedHttpToolsProtocol`` does its
#: steps itself, all but arming a keep-alive timer (protocol.py's docstring, 7.): when
#: uvicorn's changes, re-read it and bring ours in line.
UVICORN_RESPONSE_COMPLETE_NAMES = {
    "_start_asgi_task", "_unset_keepalive_if_required", "call_later", "flow", "is_closing",
    "loop", "pipeline", "pop", "resume_reading", "server_state", "timeout_keep_alive",
    "timeout_keep_alive_handler", "timeout_keep_alive_task", "total_requests", "transport",
}  # fmt: skip
#: HttpToolsProtocol instance state that CorkedHttpToolsProtocol reads or replaces.
PROTOCOL_ATTRIBUTES: dict[str, type] = {
    "transport": object,  # set to what connection_made got: the CorkedTransport
    "flow": object,  # FlowControl; its resume_reading() is called while a body is awaited
    "cycle": RequestResponseCycle,  # the request being received
    "scope": dict,  # that request's ASGI scope, where RECEIVE_INTO is added
    "parser": httptools.HttpRequestParser,  # replaced by a fresh one after a direct read
    "pipeline": object,  # cycles waiting for an earlier response (truthy when any)
    "server_state": ServerState,  # its default_headers go on an early 413
    "url": bytes,  # on_url: the request target, in the pieces the parser gives
    "headers": list,  # on_header: the head's fields (the scope's list)
    "expect_100_continue": bool,  # on_header: set for ``Expect: 100-continue``
    "client": object,  # the peer's address, in a dropped connection's log line
    "connections": set,  # the server's; left at an h2c handover (as its websocket upgrade)
    "timeout_keep_alive": object,  # seconds (a number): kept by our deadline timer
    "tasks": set,  # the server's request tasks (shutdown waits for them): the lane's too
    "logger": object,  # what escapes the lane, and what the parser refuses, is logged there
}
#: RequestResponseCycle state that ``_receive_into`` and ``on_body`` read or write.
CYCLE_ATTRIBUTES: dict[str, type] = {
    "scope": dict,
    "body": bytearray,  # bytes that came before the application asked for them
    "more_body": bool,
    "disconnected": bool,
    "message_event": asyncio.Event,
    "waiting_for_100_continue": bool,
    "response_started": bool,  # set, with response_complete, by an early 413
    "response_complete": bool,
    "transport": object,
    "on_response": object,
}
#: Names CorkedHttpToolsProtocol adds: uvicorn must not use them for anything of its own.
OUR_PROTOCOL_NAMES = (
    "_idle_since",
    "_sinks",
    "_watchers",
    "_receive_into",
    "_on_disconnect",
    "_chunked",
    "body_read",
    "limits",
    "configured",
    "_head_timer",
    "_head_started",
    "_loop",
    "_check_deadlines",
    "_overdue_body",
    "_count_head",
    "_refuse_head",
    "_answer_and_close",
    "_head_bytes",
    "_head_fields",
    "_head_pieces",
    "_head_began",
    "_head_refusal",
    "_body_started",
    "body_bytes",
    "_unread",
    "_sniffer",
    "_sniff",
    "_raw",
    "_corked",
    "_transfer_encoded",
    "lane",
    "_stop_head_timer",
    "_on_response",
    "_serve",
    "_asgi",
    "max_body",
    "_chunks",
    "_chunk_events",
    "_follow_chunks",
    "_refuse_chunked_body",
    "on_chunk_header",
    "on_chunk_complete",
)

HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nhost: t\r\ncontent-length: 6\r\n\r\n"


async def _never_answers(scope: dict, receive: Callable, send: Callable) -> None:
    await asyncio.Event().wait()


async def _mid_request(
    protocol_class: type[HttpToolsProtocol],
    check: Callable[[HttpToolsProtocol, MemoryTransport], None],
) -> None:
    """Feed ``protocol_class`` a request's head and 2 of its 6 body bytes, then ``check`` it."""
    protocol, state, transport = connected(protocol_class, _never_answers)
    try:
        protocol.data_received(HEAD + b"ab")
        check(protocol, transport)
    finally:
        for task in list(state.tasks):
            task.cancel()
        await asyncio.gather(*state.tasks, return_exceptions=True)
        protocol.connection_lost(None)


def _shape_problems(owner: type, expected: dict[str, tuple[str, ...]]) -> list[str]:
    problems = []
    for name, parameters in expected.items():
        method = getattr(owner, name, None)
        if not callable(method):
            problems.append(f"{owner.__qualname__}.{name} is gone")
            continue
        found = tuple(inspect.signature(method).parameters)[1:]
        if found != parameters:
            problems.append(
                f"{owner.__qualname__}.{name} now takes {found}, oipserve expects {parameters}"
            )
    return problems


def _attribute_problems(owner: str, instance: object, expected: dict[str, type]) -> list[str]:
    problems = []
    for name, kind in expected.items():
        if not hasattr(instance, name):
            problems.append(f"{owner}.{name} is gone")
        elif not isinstance(getattr(instance, name), kind):
            found = type(getattr(instance, name)).__name__
            problems.append(f"{owner}.{name} is now a {found}, oipserve expects {kind.__name__}")
    return problems


def _report(problems: list[str], module: str) -> str:
    return f"uvicorn internals that {module} relies on changed:\n  " + "\n  ".join(problems)


# ---- uvicorn's HttpToolsProtocol (oipserve/front/http/protocol.py) ------------------------


def test_protocol_methods_oipserve_overrides_or_calls_keep_their_shape() -> None:
    problems = _shape_problems(HttpToolsProtocol, PROTOCOL_METHODS)
    assert not problems, _report(problems, "oipserve/front/http/protocol.py")


def test_uvicorns_response_completion_does_what_ours_replaces() -> None:
    used = set(HttpToolsProtocol.on_response_complete.__code__.co_names)
    assert used == UVICORN_RESPONSE_COMPLETE_NAMES, (
        "uvicorn's HttpToolsProtocol.on_response_complete changed (names added: "
        f"{sorted(used - UVICORN_RESPONSE_COMPLETE_NAMES)}, gone: "
        f"{sorted(UVICORN_RESPONSE_COMPLETE_NAMES - used)}): CorkedHttpToolsProtocol."
        "on_response_complete in oipserve/front/http/protocol.py does its steps itself"
    )


def test_protocol_and_cycle_state_oipserve_uses_is_where_it_was() -> None:
    problems: list[str] = []

    def check(protocol: HttpToolsProtocol, transport: MemoryTransport) -> None:
        problems.extend(_attribute_problems("HttpToolsProtocol", protocol, PROTOCOL_ATTRIBUTES))
        flow = getattr(protocol, "flow", None)
        if not callable(getattr(flow, "resume_reading", None)):
            problems.append("HttpToolsProtocol.flow.resume_reading is gone")
        cycle = getattr(protocol, "cycle", None)
        if not isinstance(cycle, RequestResponseCycle):
            return  # reported above
        problems.extend(_attribute_problems("RequestResponseCycle", cycle, CYCLE_ATTRIBUTES))
        if getattr(protocol, "transport", None) is not transport:
            problems.append("HttpToolsProtocol.transport is no longer connection_made's transport")
        if getattr(cycle, "transport", None) is not transport:
            problems.append("RequestResponseCycle.transport is no longer the protocol's transport")
        if getattr(cycle, "scope", None) is not getattr(protocol, "scope", None):
            problems.append("RequestResponseCycle.scope is no longer HttpToolsProtocol.scope")
        if bytes(getattr(cycle, "body", b"")) != b"ab":
            problems.append(
                "RequestResponseCycle.body no longer holds the body bytes received so far"
            )
        if getattr(cycle, "more_body", None) is not True:
            problems.append("RequestResponseCycle.more_body is not True while a body is due")

    asyncio.run(_mid_request(HttpToolsProtocol, check))
    assert not problems, _report(problems, "oipserve/front/http/protocol.py")


def test_the_corked_protocol_is_what_uvicorn_calls_back_and_writes_through() -> None:
    """Corking works only if responses are written through, and completed on, our objects."""

    def check(protocol: HttpToolsProtocol, transport: MemoryTransport) -> None:
        assert isinstance(protocol, CorkedHttpToolsProtocol)
        cycle = protocol.cycle
        assert isinstance(protocol.transport, CorkedTransport)
        assert cycle.transport is protocol.transport, (
            "uvicorn's cycle writes responses through another transport than the protocol's: "
            "responses would no longer be corked"
        )
        assert getattr(cycle.on_response, "__func__", None) is (
            CorkedHttpToolsProtocol.on_response_complete
        ), "uvicorn no longer completes a response through on_response_complete: nothing flushes"
        assert RECEIVE_INTO in cycle.scope.get("extensions", {}), (
            "the request's scope is not the one on_headers_complete extends with RECEIVE_INTO"
        )

    asyncio.run(_mid_request(CorkedHttpToolsProtocol, check))


def test_names_oipserve_adds_to_the_protocol_are_not_uvicorns() -> None:
    clashes: list[str] = []

    def check(protocol: HttpToolsProtocol, transport: MemoryTransport) -> None:
        clashes.extend(name for name in OUR_PROTOCOL_NAMES if hasattr(HttpToolsProtocol, name))
        clashes.extend(name for name in OUR_PROTOCOL_NAMES if name in vars(protocol))

    asyncio.run(_mid_request(HttpToolsProtocol, check))
    assert not clashes, (
        "uvicorn's HttpToolsProtocol now has names that CorkedHttpToolsProtocol defines for "
        f"itself (rename ours in oipserve/front/http/protocol.py): {sorted(set(clashes))}"
    )


def test_the_parser_reports_chunk_events_and_the_status_line_table_is_there() -> None:
    """An early 413 needs httptools' chunk callbacks and uvicorn's status lines."""

    class Events:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def on_chunk_header(self) -> None:
            self.seen.append("header")

        def on_chunk_complete(self) -> None:
            self.seen.append("complete")

    events = Events()
    parser = httptools.HttpRequestParser(events)
    parser.feed_data(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n")
    assert events.seen == ["header", "complete", "header", "complete"], (
        "httptools no longer calls on_chunk_header/on_chunk_complete around each chunk: "
        "oipserve/front/http/protocol.py cannot place chunk-size lines"
    )
    assert STATUS_LINE[413].startswith(b"HTTP/1.1 413 "), (
        "uvicorn's STATUS_LINE table changed (front/http/lane.py's response_head writes the "
        "protocol's 413 and the lane's answers with it)"
    )
    state = ServerState()
    assert isinstance(state.default_headers, list), "ServerState.default_headers is gone"


#: uvicorn's HttpToolsProtocol hooks that CorkedHttpToolsProtocol does itself, without calling
#: them (``_parse``, ``on_message_begin``, ``on_body``, ``on_message_complete``), with every
#: name each uses: when uvicorn's change, re-read them and bring ours in line.
UVICORN_HOOKS_DONE_HERE: dict[str, set[str]] = {
    "data_received": {
        "HttpParserError", "HttpParserUpgrade", "_should_upgrade", "_unset_keepalive_if_required",
        "_unsupported_upgrade_warning", "feed_data", "handle_websocket_upgrade", "httptools",
        "logger", "parser", "send_400_response", "warning",
    },
    "on_message_begin": {
        "app_state", "asgi_version", "client", "copy", "expect_100_continue", "headers",
        "root_path", "scheme", "scope", "server", "url",
    },
    "on_body": {
        "HIGH_WATER_LIMIT", "_should_upgrade", "body", "cycle", "flow", "len", "message_event",
        "parser", "pause_reading", "response_complete", "set", "should_upgrade",
    },
    "on_message_complete": {
        "_should_upgrade", "cycle", "message_event", "more_body", "parser", "response_complete",
        "set", "should_upgrade",
    },
}  # fmt: skip
#: The scope uvicorn's ``on_message_begin`` makes: its keys and the values it writes itself.
UVICORN_SCOPE_CONSTANTS = {
    "type", "http", "asgi", "version", "spec_version", "2.3", "http_version", "1.1", "server",
    "client", "scheme", "root_path", "headers", "state",
}  # fmt: skip
#: What uvicorn's callbacks and the protocol read or set of a request's cycle, which the
#: lane's ``LaneCycle`` keeps by the same names (front/http/lane_cycle.py).
LANE_CYCLE_NAMES = (
    "scope", "transport", "flow", "default_headers", "keep_alive", "on_response",
    "message_event", "disconnected", "waiting_for_100_continue", "body", "more_body",
    "response_started", "response_complete",
)  # fmt: skip


def test_uvicorns_hooks_that_ours_do_themselves_are_unchanged() -> None:
    problems = []
    for name, expected in UVICORN_HOOKS_DONE_HERE.items():
        used = set(getattr(HttpToolsProtocol, name).__code__.co_names)
        if used != expected:
            problems.append(
                f"HttpToolsProtocol.{name} changed (names added: {sorted(used - expected)}, "
                f"gone: {sorted(expected - used)})"
            )
    begin = HttpToolsProtocol.on_message_begin.__code__
    strings = {value for value in begin.co_consts if isinstance(value, str)}
    for keys in (value for value in begin.co_consts if isinstance(value, tuple)):
        strings |= {key for key in keys if isinstance(key, str)}  # (a dict display's keys)
    if strings != UVICORN_SCOPE_CONSTANTS:
        problems.append(f"HttpToolsProtocol.on_message_begin's scope changed: {sorted(strings)}")
    gone = set(LANE_CYCLE_NAMES) - set(RequestResponseCycle.__init__.__code__.co_names)
    if gone:
        problems.append(f"RequestResponseCycle no longer keeps {sorted(gone)} (LaneCycle does)")
    assert not problems, _report(problems, "oipserve/front/http/protocol.py")


def test_the_lane_cycle_keeps_what_uvicorns_callbacks_read_of_a_cycle() -> None:
    """uvicorn's ``connection_lost``, ``shutdown`` and a pipelined request's turn read and
    set the lane's cycle as they do their own (front/http/lane_cycle.py)."""
    read = set()
    for hook in ("connection_lost", "shutdown", "on_headers_complete", "on_body"):
        read |= set(getattr(HttpToolsProtocol, hook).__code__.co_names)
    cycle_state = set(RequestResponseCycle.__init__.__code__.co_names)
    # (the loggers are the protocol's own, which uvicorn's cycle holds too; the lane writes
    #   no access log: the server runs with it off)
    expected = (read & cycle_state) - {"logger", "access_log", "access_logger"}
    assert expected <= set(LANE_CYCLE_NAMES), sorted(expected - set(LANE_CYCLE_NAMES))

    async def made() -> LaneCycle:
        transport = MemoryTransport()
        flow = FlowControl(transport)
        loop = asyncio.get_running_loop()
        return LaneCycle({}, CorkedTransport(transport, loop), flow, [], True, lambda: None, loop)

    cycle = asyncio.run(made())
    missing = [name for name in LANE_CYCLE_NAMES if not hasattr(cycle, name)]
    assert not missing, missing
    event = cycle.message_event
    for method in ("set", "clear", "is_set", "wait"):
        assert callable(getattr(event, method, None)), method
    assert SINGLETON_HEADERS >= {"content-length", "host"}, "falcon.constants changed"


# ---- uvicorn.Server (oipserve/front/http/server.py) --------------------------------------


def test_server_signal_capture_oipserve_replaces_is_still_used() -> None:
    problems = _shape_problems(uvicorn.Server, {"capture_signals": (), "serve": ("sockets",)})
    if not problems and "self.capture_signals()" not in inspect.getsource(uvicorn.Server.serve):
        problems.append(
            "uvicorn.Server.serve no longer calls self.capture_signals(): overriding it no "
            "longer keeps signals for oipserve's shutdown order"
        )
    problems += _shape_problems(uvicorn.Server, {"_wait_tasks_to_complete": ()})
    shutdown = inspect.getsource(uvicorn.Server.shutdown)
    if "self._wait_tasks_to_complete()" not in shutdown or ".cancel(" not in shutdown:
        problems.append(
            "uvicorn.Server.shutdown no longer waits with _wait_tasks_to_complete and then "
            "cancels: the 503 at --shutdown-timeout (front/http/server.py) is not given"
        )
    server = uvicorn.Server(uvicorn.Config(_never_answers, log_config=None))
    for name in ("started", "should_exit"):
        if not isinstance(getattr(server, name, None), bool):
            problems.append(f"uvicorn.Server.{name} is gone or no longer a bool")
    assert not problems, _report(problems, "oipserve/front/http/server.py")


# ---- falcon.asgi.App (oipserve/front/rest/app.py) -----------------------------------------


def test_falcon_app_call_keeps_its_shape_and_our_attribute_is_free() -> None:
    problems = _shape_problems(falcon.asgi.App, {"__call__": ("scope", "receive", "send")})
    if hasattr(falcon.asgi.App, "_limit") or hasattr(falcon.asgi.App(), "_limit"):
        problems.append("falcon.asgi.App now has its own _limit, which _App overwrites")
    assert not problems, (
        "Falcon internals that oipserve/front/rest/app.py relies on changed:\n  "
        + ("\n  ".join(problems))
    )


def test_falcon_routes_after_one_event_and_leaves_the_rest_of_the_body_to_the_stream() -> None:
    """``_App`` hands Falcon an empty first event so the body stays for ``read_body``.

    That saves a copy only if Falcon reads exactly that one event before the
    responder runs, and is correct only if its request stream then reads the
    whole body from the following events.
    """
    body = b"x" * 100
    real_reads_before_responder: list[int] = []
    real_reads = 0

    class Echo:
        async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
            real_reads_before_responder.append(real_reads)
            resp.data = await req.stream.read()

    app = _App(1 << 20, media_type=JSON)
    app.add_route("/echo", Echo())
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/echo",
        "raw_path": b"/echo",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-length", b"%d" % len(body)),
            (b"inference-header-content-length", b"0"),
        ],
        "extensions": {RECEIVE_INTO: None},
    }
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal real_reads
        real_reads += 1
        if real_reads == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # a client that sends nothing more
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 5))
    assert real_reads_before_responder == [0], (
        "falcon.asgi.App.__call__ now reads more than the first event before it routes: "
        "the body would be copied by Falcon instead of received into shared memory"
    )
    assert sent[0]["status"] == 200, sent
    assert b"".join(m.get("body", b"") for m in sent[1:]) == body, (
        "falcon's request stream no longer reads the body from the events after an empty "
        "first one with more_body: True"
    )


async def _answers_ok(scope: dict, receive: Callable, send: Callable) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_finished_request_is_freed_by_reference_counting() -> None:
    """Nothing of a request may be left for the cyclic collector.

    Our scope extensions hold the cycle, and the cycle holds the scope: left in place,
    every request was a reference cycle (~16 objects), and the collector's passes over
    them took 6-7 ms every few hundred requests, the p99 of tiny requests.
    """

    async def run() -> weakref.ref[RequestResponseCycle]:
        protocol, state, transport = connected(CorkedHttpToolsProtocol, _answers_ok)
        request = b"GET / HTTP/1.1\r\nhost: t\r\n\r\n"
        protocol.data_received(request)
        first = weakref.ref(protocol.cycle)
        assert RECEIVE_INTO in protocol.cycle.scope["extensions"]
        while state.tasks:
            await asyncio.gather(*state.tasks)
        protocol.data_received(request)  # the next request replaces the protocol's cycle
        while state.tasks:
            await asyncio.gather(*state.tasks)
        assert b"".join(transport.written).count(b"200 OK") == 2
        protocol.connection_lost(None)
        return first

    gc.collect()
    gc.disable()
    try:
        first = asyncio.run(run())
        assert first() is None, "a finished request's cycle is left for the cyclic collector"
    finally:
        gc.enable()


# ---- CorkedTransport (oipserve/runtime/http_io.py) ----------------------------------------


def test_the_corked_transport_forwards_asyncios_whole_transport_interface() -> None:
    """It forwards each method itself, without ``__getattr__`` (which made every method
    looked up on it a new object): a method asyncio's Transport gains must be added."""
    public = [name for name in vars(asyncio.Transport) if not name.startswith("_")]
    public += [name for name in vars(asyncio.BaseTransport) if not name.startswith("_")]
    public += [name for name in vars(asyncio.ReadTransport) if not name.startswith("_")]
    public += [name for name in vars(asyncio.WriteTransport) if not name.startswith("_")]
    missing = sorted({name for name in public if name not in vars(CorkedTransport)})
    assert not missing, f"CorkedTransport does not forward {missing} (runtime/http_io.py)"
    assert "__getattr__" not in vars(CorkedTransport)

    async def forwarded() -> None:
        raw = MemoryTransport()
        corked = CorkedTransport(raw, asyncio.get_running_loop())
        assert corked.get_write_buffer_size() == 0 and not corked.is_closing()
        assert corked.get_extra_info("peername", "none") == "none"
        corked.set_protocol(asyncio.Protocol())
        assert corked.get_protocol() is raw.protocol
        corked.close()
        assert raw.closing and corked.is_closing()

    asyncio.run(forwarded())


class _WritesWhileTaking(MemoryTransport):
    """A transport that, while taking a flush's writes, is written to again (by a callback
    the write runs): what it writes then must go out with the next flush."""

    def __init__(self) -> None:
        super().__init__()
        self.corked: CorkedTransport | None = None

    def writelines(self, lines: object) -> None:
        super().writelines(lines)
        if self.corked is not None and self.written == [b"head", b"body"]:
            self.corked.write(b"during")


def test_a_write_made_while_a_flush_is_taken_goes_out_after_it() -> None:
    """The corked transport's two lists take turns (no new list a flush): a write made
    while the transport takes one list goes to the other and is flushed in its turn."""

    async def written() -> list[bytes]:
        raw = _WritesWhileTaking()
        corked = raw.corked = CorkedTransport(raw, asyncio.get_running_loop())
        corked.write_whole(b"head", b"body")
        await asyncio.sleep(0)  # the flush the write during it scheduled
        corked.write(b"next")
        corked.flush()
        return raw.written

    assert asyncio.run(written()) == [b"head", b"body", b"during", b"next"]
