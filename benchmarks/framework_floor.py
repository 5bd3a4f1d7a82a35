"""What the HTTP layers under the front cost a request, against the front itself.

Issue #40's missed rows all come back to the front's CPU per request. This measures the
floor under it: servers that answer a tiny JSON inference request with fixed bytes, each
one layer more than the one before, and the real front on the same request, in the same
interleaved rounds (order reversed every other round), with the CPU each server's process
spent per request read from /proc:

- ``httptools``: an asyncio protocol feeding httptools' parser, answering from the
  parser's callback (what any Python HTTP/1.1 server on uvloop pays at least);
- ``httptools+task``: the same, answering from a task, as a handler that awaits a worker
  must;
- ``uvicorn-stock``: uvicorn's own httptools protocol (``proxy_headers`` off, as the
  front) and a bare ASGI app;
- ``uvicorn``: the same on the front's protocol (``CorkedHttpToolsProtocol``: one write
  a response, the connection limits);
- ``uvicorn+falcon``: the same with a Falcon ASGI app routing ``/v2/models/{model}/infer``
  to a responder that reads the body and sets the response;
- ``oipserve``: the front itself (one HTTP front) on the harness's ``simple`` model, its
  front process only (its worker's CPU is not counted).

wrk drives each at c=16 (``--concurrency``), flat out and at a fixed rate (``--rates``,
0 for flat out): at a fixed rate every server does the same work per second, so the CPU
per request compares like with like (flat out, a faster server handles more requests a
loop turn and pays less for each).

    python benchmarks/framework_floor.py --rounds 3 --seconds 4 --rates 0,4000

Needs the source tree's oipserve (this checkout, or ``--build``), wrk, and a prior
``benchmarks/run.py`` run for the benchmark repository (benchmarks/.work/).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from oipbench.load import run_wrk  # noqa: E402
from oipbench.models import build_models  # noqa: E402
from oipbench.payloads import json_body  # noqa: E402
from oipbench.procs import cpu_snapshot, front_and_workers  # noqa: E402
from oipbench.servers import serve_from  # noqa: E402

WORK = BENCH / ".work"
LAYERS = ("httptools", "httptools+task", "uvicorn-stock", "uvicorn", "uvicorn+falcon")

#: The answer the fixed servers give: the front's answer to the request, in size and shape.
ANSWER = (
    b'{"model_name":"simple","model_version":"1","outputs":[{"name":"OUTPUT0",'
    b'"datatype":"INT32","shape":[1,16],"data":[2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,'
    b'32]},{"name":"OUTPUT1","datatype":"INT32","shape":[1,16],"data":[0,0,0,0,0,0,0,0,0,'
    b"0,0,0,0,0,0,0]}]}"
)


# --- the fixed servers (run as ``--serve LAYER PORT`` in a process of their own) ---------


def _serve_httptools(port: int, in_task: bool) -> None:
    import httptools
    import uvloop

    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    answer = head % len(ANSWER) + ANSWER

    class Answering(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body, self.body = b"".join(self.body), []
            if in_task:
                asyncio.get_running_loop().create_task(self.answer(body))
            else:
                self.transport.write(answer)  # type: ignore[attr-defined]

        async def answer(self, body: bytes) -> None:
            self.transport.write(answer)  # type: ignore[attr-defined]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Answering, "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


def _serve_uvicorn(port: int, with_falcon: bool, stock: bool, build: Path) -> None:
    sys.path.insert(0, str(build))
    import uvicorn

    from oipserve.front.http.limits import ConnectionLimits
    from oipserve.front.http.protocol import CorkedHttpToolsProtocol

    async def bare(scope: dict, receive: Callable, send: Callable) -> None:  # type: ignore[type-arg]
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": ANSWER})

    app: object = bare
    if with_falcon:
        import falcon.asgi

        class Infer:
            async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                              model: str) -> None:  # fmt: skip
                await req.stream.read()
                resp.data = ANSWER
                resp.content_type = "application/json"

        falcon_app = falcon.asgi.App()
        falcon_app.add_route("/v2/models/{model}/infer", Infer())
        app = falcon_app
    print("ready", flush=True)
    uvicorn.run(
        app,  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools" if stock else CorkedHttpToolsProtocol.configured(ConnectionLimits()),
        lifespan="off",
        access_log=False,
        proxy_headers=False,
        log_level="warning",
    )


def _serve(layer: str, port: int, build: Path) -> None:
    if layer.startswith("httptools"):
        _serve_httptools(port, in_task=layer.endswith("+task"))
    else:
        _serve_uvicorn(port, layer.endswith("+falcon"), layer.endswith("-stock"), build)


# --- the driver ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_layer(layer: str, build: Path) -> tuple[int, str, Callable[[], None]]:
    port = _free_port()
    argv = [sys.executable, __file__, "--serve", layer, str(port), "--build", str(build)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{layer} did not start")
    url = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # ready is printed before uvicorn binds
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)

    def stop() -> None:
        proc.terminate()
        proc.wait(10)

    return proc.pid, url, stop


def _start_oipserve(build: Path) -> tuple[int, str, Callable[[], None]]:
    args = ["--model-repository", str(WORK / "repos" / "oipserve"), "--http-port", "0",
            "--grpc-port", "0", "--http-workers", "1"]  # fmt: skip
    server = serve_from(build, args)
    return server.proc.pid, server.http, server.stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", nargs=2, metavar=("LAYER", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--build", type=Path, default=BENCH.parent, help="oipserve source tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rates", default="0,4000", help="wrk's requests/s, 0: flat out")
    ns = parser.parse_args()
    if ns.serve:
        _serve(ns.serve[0], int(ns.serve[1]), ns.build.resolve())
        return
    rates = [float(rate) for rate in ns.rates.split(",")]
    body = json_body(build_models(WORK / "models")["simple"], WORK / "payloads" / "simple.json")
    scratch = WORK / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    servers = {layer: _start_layer(layer, ns.build.resolve()) for layer in LAYERS}
    servers["oipserve"] = _start_oipserve(ns.build.resolve())
    rows: dict[tuple[str, float], list[tuple[float, float]]] = {}
    try:
        for rnd in range(ns.rounds):
            for rate in rates:
                names = list(servers) if rnd % 2 == 0 else list(servers)[::-1]
                for name in names:
                    pid, url, _ = servers[name]
                    before = cpu_snapshot(pid)
                    target = f"http://{url}/v2/models/simple/infer"
                    m = run_wrk(name, f"floor-{rate:g}", rnd, target, body, ns.concurrency,
                                ns.seconds, scratch, pid, rate=rate)  # fmt: skip
                    front, _ = front_and_workers(before, cpu_snapshot(pid))
                    if not m.ok:
                        raise RuntimeError(f"{name}: {m.note}")
                    rows.setdefault((name, rate), []).append((m.rps, front / m.requests * 1e6))
    finally:
        for _, _, stop in servers.values():
            stop()
    print(f"tiny JSON, c={ns.concurrency}, {ns.rounds} rounds of {ns.seconds} s (medians):")
    for rate in rates:
        print(f"  wrk {'flat out' if not rate else f'at {rate:,.0f} req/s'}:")
        for name in servers:
            measured = rows[(name, rate)]
            rps = statistics.median(r[0] for r in measured)
            cpu = statistics.median(r[1] for r in measured)
            print(f"    {name:16s} req/s {rps:8,.0f}   front CPU per request {cpu:6.1f} us")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
