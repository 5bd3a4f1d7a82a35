"""Which content coding a response gets: gzip, deflate or identity, from the request's
``Accept-Encoding`` (``choose_encoding``).

Apart from ``coding`` (the coding itself) so that it is compiled: every response asks it
(pyproject.toml's ``[tool.oipserve] compiled``), and ``coding`` holds an async generator,
which mypyc cannot compile.
"""

from __future__ import annotations

__all__ = ["choose_encoding"]


def choose_encoding(accept: str | None) -> str:
    """Pick gzip, deflate or identity from Accept-Encoding by q-value (first wins ties)."""
    if not accept:
        return "identity"
    best, best_q = "identity", 0.0
    for item in accept.split(","):
        name, _, params = item.strip().partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate", "identity"):
            continue
        q = _quality(params)
        if q > best_q:
            best, best_q = name, q
    return best


def _quality(params: str) -> float:
    """The ``q`` of one Accept-Encoding entry's parameters (1 without one; 0 if it does not
    parse). Its name is case-insensitive and need not come first (RFC 9110, 12.4.2):
    ``gzip;Q=0`` and ``gzip;foo=1;q=0`` were compressed all the same (found by fuzzing)."""
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                return float(value.strip())
            except ValueError:
                return 0.0
    return 1.0
