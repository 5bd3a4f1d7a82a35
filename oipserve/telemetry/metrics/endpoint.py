"""``GET /metrics`` on its own port: a tiny ASGI app and the page it serves.

It runs as a second uvicorn server on the front's event loop (``oipserve.app.server``
starts and stops it with the HTTP server), so a scrape is one coroutine, never
a thread per request. As in Triton, only ``GET`` is answered (anything else is
405) and only at ``/metrics`` (anything else is 404), each refusal an ``{"error": ...}``
body as on the other ports.

A scrape renders the per-model families from the live statistics, the host
families (re-read from the hardware inventory at most every ``HOST_INTERVAL``
seconds, in a thread: NVML may take milliseconds), then prometheus_client's
process collector (``process_cpu_seconds_total``, ``process_resident_memory_bytes``…).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from hardware import InventorySource
from oipserve.telemetry.metrics.exposition import CONTENT_TYPE, Family, render
from oipserve.telemetry.metrics.families import (
    cache_families,
    cpu_utilization,
    histogram_families,
    host_families,
    load_duration_family,
    model_families,
    padding_families,
    summary_families,
)
from oipserve.telemetry.stats import StatsRegistry

log = logging.getLogger("oipserve.metrics")

#: Seconds between two readings of the hardware (Triton's --metrics-interval-ms is 2000).
HOST_INTERVAL = 2.0

Send = Callable[[dict], Awaitable[None]]


class Scraper:
    """Builds the text of one ``/metrics`` page."""

    def __init__(self, stats: StatsRegistry, inventory: InventorySource) -> None:
        self._stats = stats
        self._inventory = inventory
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        self._host: list[Family] = []
        self._host_read = -HOST_INTERVAL
        cpu_utilization()  # starts the interval the first scrape's figure covers

    async def page(self) -> bytes:
        now = time.monotonic()
        if now - self._host_read >= HOST_INTERVAL:
            self._host_read = now
            try:
                inventory = await asyncio.to_thread(self._inventory.read)
            except Exception as exc:  # e.g. a fake inventory file being rewritten
                log.warning("host metrics not refreshed: cannot read the hardware: %s", exc)
            else:
                self._host = host_families(inventory, cpu_utilization())
        await self._stats.refresh()
        ready = list(self._stats.ready())
        versions = [stats for _, stats in ready]
        config = self._stats.latency.config
        models = model_families(versions, config.counter_latencies)
        if config.histogram_latencies:
            models += histogram_families(versions)
        if config.summary_latencies:
            models += summary_families(versions, self._stats.latency, time.monotonic_ns())
        models += cache_families(versions)
        models += padding_families(versions)
        models.append(load_duration_family(model for model, _ in ready))
        text = render([*models, *self._host])
        return text.encode() + generate_latest(self._process)


class MetricsApp:
    """The ASGI app of the metrics port."""

    def __init__(self, scraper: Scraper) -> None:
        self.scraper = scraper

    async def __call__(self, scope: dict, receive: object, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "GET":
            await _refuse(
                send, 405, "only GET is allowed on the metrics port", [(b"allow", b"GET")]
            )
        elif scope["path"] != "/metrics":
            await _refuse(send, 404, "not found: the metrics port serves only /metrics")
        else:
            await _answer(send, 200, await self.scraper.page(), content_type=CONTENT_TYPE)


async def _refuse(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A refusal as every port words one: ``{"error": "..."}``."""
    body = msgspec.json.encode({"error": message})
    await _answer(send, status, body, headers, content_type="application/json")


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    content_type: str = "text/plain; charset=utf-8",
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", b"%d" % len(body)),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
