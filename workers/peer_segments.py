"""The segments a worker maps for a front: the front's input segments, and (ensembles)
the output segments of this server's workers, its own included.

An ensemble's step reads the outputs of an earlier step where they lie: in the output
segment of the worker that ran it (``oipserve.dataplane.ensemble``). The front names that
segment in the step's input descriptor like any input segment; the worker maps it by name
and feeds ONNX Runtime a view of it, with no copy (on the worker that wrote it, a second
mapping of its own segment).

A name is mapped only when it is one of this server's: ``oipserve-<front pid>-`` and
then letters, digits and dashes only (no ``/``, no ``..``: never a file outside
``/dev/shm``, never another server's or a client's object). A front forgets its input
segments with ``Forget``; nobody tells a worker when a peer's output segment goes (its
owner unlinks it when its pool trims, or when it dies), so those mappings are kept in a
bounded first-in first-out set instead: at most ``MAX_PEER_MAPPINGS`` stay mapped (one
still read by the running request stays valid: its views keep the mapping). A segment
larger than its owner's pool keeps idle (``idle_cap``) is not kept at all: mapped for the
request at hand, it goes with its last view, so that its owner's unlink frees it at once
(``SegmentCache``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from oipserve.wire.shm import NAME_PREFIX, Segment, SegmentCache, idle_cap

__all__ = ["MAX_PEER_MAPPINGS", "CheckedSegments", "server_prefix"]

#: Workers' output segments kept mapped at most, past the front's own input segments.
MAX_PEER_MAPPINGS = 64

_NAME_CHARACTERS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"
)


def server_prefix(segment_prefix: str) -> str:
    """``oipserve-<front pid>-`` of a worker's ``oipserve-<front pid>-w<id>-``."""
    pid = segment_prefix[len(NAME_PREFIX) :].split("-", 1)[0]
    return f"{NAME_PREFIX}{pid}-"


class CheckedSegments(SegmentCache):
    """``SegmentCache`` that maps only this server's segments, peers' in a bounded set."""

    def __init__(self, prefix: str, keep_up_to: int | None = None) -> None:
        """``keep_up_to``: the largest segment kept mapped (the pools' ``idle_cap``)."""
        super().__init__(idle_cap() if keep_up_to is None else keep_up_to)
        #: ``oipserve-<front pid>-``: every segment of this server starts so.
        self.prefix = prefix
        #: Workers' output segments start so (``oipserve-<front pid>-w<id>-...``).
        self._peer_prefix = prefix + "w"
        self._peers: OrderedDict[str, None] = OrderedDict()

    def get(self, name: str) -> Segment:
        # PERF: the same lookup as SegmentCache.get for a segment already mapped.
        segment = self._segments.get(name)
        if segment is None:
            segment = self._attach(name)
        return segment

    def _attach(self, name: str) -> Segment:
        rest = name[len(self.prefix) :]
        if not name.startswith(self.prefix) or not rest or not set(rest) <= _NAME_CHARACTERS:
            raise ValueError(f"segment '{name}' is not one of this server's")
        segment = Segment.attach(name)
        keep_up_to = self._keep_up_to
        if keep_up_to is not None and segment.size > keep_up_to:  # never kept idle
            return segment
        self._segments[name] = segment
        if name.startswith(self._peer_prefix):
            self._peers[name] = None
            while len(self._peers) > MAX_PEER_MAPPINGS:
                oldest = next(iter(self._peers))
                del self._peers[oldest]
                self.forget(oldest)
        return segment

    def forget(self, name: str) -> None:
        self._peers.pop(name, None)
        super().forget(name)

    @property
    def peer_count(self) -> int:
        """Workers' output segments mapped now (tests, and the bound above)."""
        return len(self._peers)
