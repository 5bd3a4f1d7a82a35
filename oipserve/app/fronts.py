"""How many HTTP fronts serve when ``--http-workers`` is ``auto`` (the default).

Decided once at start-up, before any port is bound, from two things:

- the CPUs this process may use (``hardware.cpus.fronts_for``: 1 front on 1 CPU, 2 up to 11,
  then one per 4 CPUs, at most 4);
- the repository: each front has its own batchers, so with several fronts a model's batches,
  its queue policy (``max_queue_size``, priorities, delays) and its sequences form per front,
  over the connections that front was given. Triton forms them over all connections, and
  its clients and QA tests rely on it (a preferred batch that two fronts split waits its
  whole ``max_queue_delay``; a queue of 1 holds one request per front). So a repository
  with a model that batches (``dynamic_batching`` or ``sequence_batching`` in its
  config.pbtxt) gets one front. A number given for ``--http-workers`` is used as given.

docs/scaling.md ("The default number of fronts") has the figures.
"""

from __future__ import annotations

import logging

import msgspec

from hardware.cpus import fronts_for, usable_cpus
from oipserve.config.settings import Settings
from oipserve.models.repository import Repository

log = logging.getLogger("oipserve")

#: Models named in the start-up line that says why ``auto`` kept one front.
_NAMED = 3


def settle_fronts(settings: Settings, repository: Repository) -> Settings:
    """``settings`` with ``http_workers`` a number: ``auto`` (None) resolved, a number kept."""
    if settings.http_workers is not None:
        return settings
    fronts = fronts_for(usable_cpus())
    if fronts > 1:
        batching = repository.batching_models()
        if batching:
            named = ", ".join(batching[:_NAMED]) + (", ..." if len(batching) > _NAMED else "")
            log.info(
                "one HTTP front (--http-workers auto; the CPUs would give %d): %d model(s) "
                "batch requests (%s), and with several fronts their batches, queue limits and "
                "sequences would form per front, not over every connection as in Triton; "
                "--http-workers %d serves them so",
                fronts,
                len(batching),
                named,
                fronts,
            )
            fronts = 1
    return msgspec.structs.replace(settings, http_workers=fronts)
