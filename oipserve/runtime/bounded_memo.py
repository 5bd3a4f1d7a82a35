"""``BoundedMemo``: a transform's results for the few keys a request path sees again.

Header names (and the values the responder sets) repeat from request to request: lower-
casing or encoding one again is a new object each time. A memo keeps at most ``most`` of
them, none longer than ``longest``, whatever names clients send: past that a key is
transformed each time, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BoundedMemo"]

Key = TypeVar("Key", str, bytes)
Value = TypeVar("Value")


class BoundedMemo(Generic[Key, Value]):
    """``make(key)``, the same object for a key seen before (up to ``most`` keys of at most
    ``longest`` characters or bytes)."""

    __slots__ = ("_make", "_kept", "_most", "_longest")

    def __init__(self, make: Callable[[Key], Value], most: int = 256, longest: int = 64) -> None:
        self._make: Callable[[Key], Value] = make
        self._kept: dict[Key, Value] = {}
        self._most = most
        self._longest = longest

    def get(self, key: Key) -> Value:
        kept = self._kept
        value = kept.get(key)
        if value is None:
            value = self._make(key)
            if len(kept) < self._most and len(key) <= self._longest:
                kept[key] = value
        return value
