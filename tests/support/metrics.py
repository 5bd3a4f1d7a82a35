"""A ``/metrics`` page read with prometheus_client's parser (the tests' Prometheus)."""

from __future__ import annotations

import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


class Page:
    """One scrape: the raw text, the family types, every sample by (name, sorted labels)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.types: dict[str, str] = {}
        self.samples: dict[tuple[str, Labels], float] = {}
        #: Each family's samples in page order: (sample name, labels, value).
        self.ordered: dict[str, list[tuple[str, dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            rows = self.ordered.setdefault(family.name, [])
            for sample in family.samples:
                self.samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
                rows.append((sample.name, dict(sample.labels), sample.value))

    def value(self, name: str, model: str, version: str = "1", **extra: str) -> float:
        """A sample of a model version; a counter's too (the parser names it ``<name>_total``)."""
        labels = tuple(sorted({"model": model, "version": version, **extra}.items()))
        for candidate in (name, name + "_total"):
            if (candidate, labels) in self.samples:
                return self.samples[(candidate, labels)]
        raise KeyError(f"{name}{dict(labels)} not scraped")

    def buckets(self, family: str, model: str, version: str = "1") -> list[tuple[float, float]]:
        """A histogram's (upper bound, cumulative count) of a version, in page order."""
        return [
            (math.inf if labels["le"] == "+Inf" else float(labels["le"]), value)
            for name, labels, value in self.ordered.get(family, [])
            if name == family + "_bucket"
            and labels.get("model") == model
            and labels.get("version") == version
        ]

    def families_of(self, model: str) -> set[str]:
        """The families with at least one sample of ``model``."""
        return {
            name
            for name, rows in self.ordered.items()
            if any(labels.get("model") == model for _, labels, _ in rows)
        }


def scrape(metrics_url: str) -> Page:
    """``GET /metrics`` of a server (its ``metrics_url``), parsed."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=30) as resp:
        assert resp.status == 200
        return Page(resp.read().decode())
