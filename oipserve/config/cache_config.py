"""``--cache-config local,size=BYTES``: Triton's flag for its response cache.

Triton's flag is repeatable and takes ``<cache>,<key>=<value>`` each. oipserve has the
``local`` cache only (an in-process LRU: ``oipserve.dataplane.response_cache``), whose one
key is ``size``, in bytes (docs/cache.md). Without the flag there is no cache, whatever
the models' ``response_cache`` says (as in Triton). A cache other than ``local`` (Triton's
``redis``), another key or a bad size stops start-up with the reason (exit 2).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MAX_CACHE_BYTES", "CacheConfigError", "cache_bytes"]

#: Largest ``size`` accepted: 1 TiB (more is a typo, not a cache).
MAX_CACHE_BYTES = 1 << 40


class CacheConfigError(ValueError):
    """A ``--cache-config`` item that cannot be used; the message says why."""


def cache_bytes(items: Iterable[str]) -> int:
    """The size of the local cache the items ask for, later ones winning; 0: no cache."""
    size = 0
    for item in items:
        name, _, setting = item.partition(",")
        if name.strip() != "local":
            raise CacheConfigError(
                f"{item!r}: oipserve has only the 'local' cache (give local,size=BYTES)"
            )
        key, sep, value = setting.partition("=")
        if key.strip() != "size" or not sep:
            raise CacheConfigError(f"{item!r}: the local cache takes one key, size=BYTES")
        size = _size(item, value)
    return size


def _size(item: str, value: str) -> int:
    try:
        size = int(value.strip())
    except ValueError:
        raise CacheConfigError(f"{item!r}: size must be a number of bytes") from None
    if not 1 <= size <= MAX_CACHE_BYTES:
        raise CacheConfigError(f"{item!r}: size must be 1 to {MAX_CACHE_BYTES} bytes")
    return size
