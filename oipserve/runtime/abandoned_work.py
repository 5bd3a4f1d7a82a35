"""What a client's abandoned requests still cost the workers, counted per connection.

A request whose caller went away (a gRPC stream reset, a call cancelled or past its
deadline) ends in the front at once, but a worker that has it goes on reading its inputs
and writing its outputs until it answers: both segments stay held till then
(``dataplane.dispatch.infer_on``).
A client that resets streams as fast as it fills them (``stream-past-window`` in
``tests/e2e/test_grpc_abuse.py``) left each reset pair's requests running behind it, and
on a busy worker they piled up: 147 requests, 294 MiB of /dev/shm, where one pair holds
at most 16. So a connection's abandoned requests count against it until the workers let
go of them: at ``LIMIT`` the connection stops reading its socket, and reads again once
half of them are done. Go's HTTP/2 server does much the same since rapid reset
(CVE-2023-44487; Go's CVE-2023-39325): a reset stream's handler counts against the
stream limit until it returns.

The HTTP/2 connection (``front.grpc.h2.connection``: gRPC calls, and REST streams over
HTTP/2) makes one ``AbandonedWork`` and runs its streams' tasks in a context where
``ABANDONED_WORK`` holds it; ``infer_on`` counts a cancelled request the worker still
has, and the worker's link uncounts it at the reply (or the worker's death).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["ABANDONED_WORK", "LIMIT", "AbandonedWork"]

#: Abandoned requests a connection may leave running in the workers before it is no
#: longer read: a stream's 64 requests in flight cancelled at once stop its connection
#: for as long as the workers take to finish 56 of them.
LIMIT = 16

#: Where the connection of the task that runs a request counts them (HTTP/2's; an
#: HTTP/1.1 request has its connection to itself, and the worker's queue bounds those).
ABANDONED_WORK: ContextVar[AbandonedWork | None] = ContextVar("abandoned_work", default=None)


class AbandonedWork:
    """One connection's requests that were cancelled while a worker still has them.

    ``hold`` and ``resume`` are the connection's: stop reading, read again (which it
    does only if nothing else holds its reading).
    """

    __slots__ = ("running", "holding", "_hold", "_resume")

    def __init__(self, hold: Callable[[], None], resume: Callable[[], None]) -> None:
        self.running = 0
        #: The connection is not read while this is true: from ``LIMIT`` running down to
        #: half of it.
        self.holding = False
        self._hold = hold
        self._resume = resume

    def abandoned(self) -> Callable[[], None]:
        """Count one; the callable returned uncounts it, once the worker lets go."""
        self.running += 1
        if self.running >= LIMIT and not self.holding:
            self.holding = True
            self._hold()
        return self._done

    def _done(self) -> None:
        self.running -= 1
        if self.holding and self.running <= LIMIT // 2:
            self.holding = False
            self._resume()
