"""Prometheus metrics in Triton's names, served on their own port (docs/metrics.md).

- ``exposition``: the text format, written here because prometheus_client renames
  counters to ``<name>_total``.
- ``families``: the per-model counters from ``oipserve.telemetry.stats`` and the host gauges.
- ``endpoint``: the page (``Scraper``) and the ASGI app answering ``GET /metrics``.
"""

from oipserve.telemetry.metrics.endpoint import MetricsApp, Scraper

__all__ = ["MetricsApp", "Scraper"]
