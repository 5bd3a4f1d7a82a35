"""What one unary gRPC call costs a Python server, by server shape: the ceiling of each design.

Each shape serves ``ModelInfer`` with a canned reply (no model, no data plane), so the
figures are the gRPC machinery alone. They are driven in turn, in interleaved rounds, by
``oipbench/grpc_client.py`` (the harness's own gRPC load generator) with the tiny
``simple`` request at c=16; the server's CPU per call is read from /proc.

- ``aio``: grpc.aio on uvloop, one generic handler (what oipserve runs).
- ``aio-registered``: the same with ``add_registered_method_handlers``.
- ``sync``: the sync ``grpc.server`` with a 16-thread pool answering in the pool thread.
- ``sync-bridge``: the sync server handing each call to an asyncio loop in another thread
  (``run_coroutine_threadsafe``), as the data plane would need.
- ``forward``: grpc.aio in a process of its own, forwarding each call over a Unix socket
  (length-prefixed frames) to a second process that answers it: gRPC served from its own
  process beside the front. CPU is both processes'.
- ``h2``: the front's own HTTP/2 (``oipserve.front.grpc.h2``, what the front runs since
  2026-11-27) with a method table answering the canned reply.

    python benchmarks/grpc_server_shapes.py --rounds 4 --seconds 3

See docs/grpc.md ("Where the time goes") for the figures and what they mean.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent import futures
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SERVICE = "inference.GRPCInferenceService"
#: A ModelInferResponse the size of the tiny model's (two 64-byte outputs).
REPLY = b"\x0a\x06simple" + (b"\x32\x40" + bytes(64)) * 2
FRAME = struct.Struct("<II")  # payload length, call id
SHAPES = ("aio", "aio-registered", "sync", "sync-bridge", "forward", "h2")


def _same(data: bytes) -> bytes:
    return data


async def _answer(request: bytes, context: object) -> bytes:
    return REPLY


def _handlers(behaviour: object) -> dict[str, object]:
    import grpc

    return {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=_same, response_serializer=_same
        )
    }


async def _serve_aio(port: int, shape: str, forward_to: str | None) -> None:
    import grpc
    import grpc.aio

    behaviour = _answer
    if forward_to is not None:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_unix_connection(_Forwarder, forward_to)
        behaviour = client.call  # type: ignore[assignment]
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handlers = _handlers(behaviour)
    if shape == "aio-registered":
        server.add_registered_method_handlers(SERVICE, handlers)
    else:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def _serve_sync(port: int, bridge: bool) -> None:
    import grpc

    def answer(request: bytes, context: object) -> bytes:
        return REPLY

    if bridge:
        import uvloop

        loop = uvloop.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        def answer(request: bytes, context: object) -> bytes:  # noqa: F811
            return asyncio.run_coroutine_threadsafe(_answer(request, None), loop).result()

    server = grpc.server(futures.ThreadPoolExecutor(16), options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, _handlers(answer)),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


class _Forwarder(asyncio.Protocol):
    """The gRPC process's end: a frame per call, written once per loop iteration."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiting: dict[int, asyncio.Future[bytes]] = {}
        self.pending: list[bytes] = []
        self.next = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    async def call(self, request: bytes, context: object) -> bytes:
        loop = asyncio.get_running_loop()
        self.next += 1
        future = loop.create_future()
        self.waiting[self.next] = future
        if not self.pending:
            loop.call_soon(self._flush)
        self.pending += (FRAME.pack(len(request), self.next), request)
        return await future

    def _flush(self) -> None:
        self.transport.write(b"".join(self.pending))  # type: ignore[attr-defined]
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= FRAME.size:
            size, ident = FRAME.unpack_from(buf)
            if len(buf) < FRAME.size + size:
                break
            body = bytes(buf[FRAME.size : FRAME.size + size])
            del buf[: FRAME.size + size]
            self.waiting.pop(ident).set_result(body)


class _Answerer(asyncio.Protocol):
    """The front's end: answers every frame, all answers of one read in one write."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        out = []
        while len(buf) >= FRAME.size:
            size, ident = FRAME.unpack_from(buf)
            if len(buf) < FRAME.size + size:
                break
            del buf[: FRAME.size + size]
            out.append(FRAME.pack(len(REPLY), ident) + REPLY)
        if out:
            self.transport.write(b"".join(out))  # type: ignore[attr-defined]


async def _serve_front(path: str) -> None:
    await asyncio.get_running_loop().create_unix_server(_Answerer, path)
    print("ready", flush=True)
    await asyncio.Event().wait()


async def _serve_h2(port: int) -> None:
    sys.path.insert(0, str(BENCH.parent))
    from oipserve.config.settings import Settings
    from oipserve.front.grpc.call_table import CallTable
    from oipserve.front.grpc.listener import H2Server
    from oipserve.front.grpc.rpcs import Method

    async def answer(request: bytes) -> bytes:
        return REPLY

    async def no_stream(request: object) -> bytes:
        raise NotImplementedError

    methods = {"ModelInfer": Method(bytes, answer, bytes)}
    table = CallTable(
        Settings(model_repository="."), methods, no_stream, deque(), asyncio.Event(), None
    )
    await H2Server(table).serve("127.0.0.1", port, reuse_port=False)
    print("ready", flush=True)
    await asyncio.Event().wait()


def serve(shape: str, port: int, path: str | None) -> None:
    import uvloop

    if shape in ("aio", "aio-registered"):
        uvloop.run(_serve_aio(port, shape, None))
    elif shape in ("sync", "sync-bridge"):
        _serve_sync(port, shape == "sync-bridge")
    elif shape == "forward":
        uvloop.run(_serve_aio(port, shape, path))
    elif shape == "h2":
        uvloop.run(_serve_h2(port))
    elif shape == "front":
        assert path is not None
        uvloop.run(_serve_front(path))


# ---- driving ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{argv}: did not start")
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=[*SHAPES, "front"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16)
    ns = parser.parse_args()
    if ns.serve:
        serve(ns.serve, ns.port, ns.path)
        return
    work = Path(tempfile.mkdtemp(prefix="grpc-shapes-"))
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        (work / name).write_bytes(bytes(64))
        inputs.append(
            {"name": name, "datatype": "INT32", "shape": [1, 16], "file": str(work / name)}
        )
    spec = work / "spec.json"
    spec.write_text(json.dumps({"model_name": "simple", "inputs": inputs, "outputs": []}))
    me = [sys.executable, str(Path(__file__).resolve())]
    procs: dict[str, tuple[int, list[subprocess.Popen[str]]]] = {}
    try:
        for shape in SHAPES:
            port = _free_port()
            started = []
            if shape == "forward":
                path = str(work / "front.sock")
                started.append(_start([*me, "--serve", "front", "--path", path]))
                started.append(_start([*me, "--serve", shape, "--port", str(port), "--path", path]))
            else:
                started.append(_start([*me, "--serve", shape, "--port", str(port)]))
            procs[shape] = (port, started)
        figures: dict[str, list[tuple[float, float]]] = {shape: [] for shape in SHAPES}
        for rnd in range(ns.rounds):
            order = SHAPES if rnd % 2 == 0 else SHAPES[::-1]
            for shape in order:
                port, started = procs[shape]
                result = work / "result.json"
                client = subprocess.Popen(
                    [sys.executable, str(BENCH / "oipbench" / "grpc_client.py"), "load",
                     "--target", f"127.0.0.1:{port}", "--spec", str(spec), "--concurrency",
                     str(ns.concurrency), "--warmup", "1", "--startup", "1.5", "--duration",
                     str(ns.seconds), "--result", str(result)]
                )  # fmt: skip
                time.sleep(2.5)
                before = [_cpu_seconds(p.pid) for p in started]
                time.sleep(ns.seconds)
                each = [_cpu_seconds(p.pid) - b for p, b in zip(started, before, strict=True)]
                spent = sum(each)
                client.wait()
                load = json.loads(result.read_text())
                rate = load["requests"] / load["duration_s"]
                figures[shape].append((rate, spent / (rate * ns.seconds) * 1e6))
                cpu = figures[shape][-1][1]
                line = f"round {rnd} {shape:15s} {rate:7.0f} calls/s {cpu:6.1f} us CPU/call"
                if len(each) > 1:
                    line += f" (answering process: {each[0] / (rate * ns.seconds) * 1e6:.1f} us)"
                print(line, flush=True)
        base_rate = statistics.median(r for r, _ in figures["aio"])
        base_cpu = statistics.median(c for _, c in figures["aio"])
        print("\n| shape | calls/s | vs aio | server CPU per call | vs aio |")
        print("|---|---:|---:|---:|---:|")
        for shape in SHAPES:
            rate = statistics.median(r for r, _ in figures[shape])
            cpu = statistics.median(c for _, c in figures[shape])
            ratios = f"{rate / base_rate:.2f}x | {cpu:.0f} us | {cpu / base_cpu:.2f}x"
            print(f"| {shape} | {rate:,.0f} | {ratios} |")
    finally:
        for _, started in procs.values():
            for proc in started:
                proc.terminate()
                proc.wait()


if __name__ == "__main__":
    main()
