"""How many HTTP fronts serve when ``--http-workers`` is ``auto`` (the default).

Decided once at start-up, before any port is bound, from two things:

- the CPUs this process may use (``hardware.cpus.fronts_for``: 1 front on 1 CPU, 2 up to 11,
  then one per 4 CPUs, at most 4);
- the repository: a model's dynamic batches form in the primary front whatever the number
  of fronts (the others send it their checked requests: ``scaleout.batch_link``), but a
  sequence batcher keeps its sequences, slots and batches in the front that took their
  requests, so with several fronts they would form per front, over the connections that
  front was given. Triton forms them over all connections, and its clients and QA tests
  rely on it. So a repository with a ``sequence_batching`` model gets one front. A number
  given for ``--http-workers`` is used as given.

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
        sequences = repository.sequence_models()
        if sequences:
            named = ", ".join(sequences[:_NAMED]) + (", ..." if len(sequences) > _NAMED else "")
            log.info(
                "one HTTP front (--http-workers auto; the CPUs would give %d): %d model(s) "
                "batch sequences (%s), and with several fronts their sequence slots and "
                "batches would form per front, not over every connection as in Triton; "
                "--http-workers %d serves them so",
                fronts,
                len(sequences),
                named,
                fronts,
            )
            fronts = 1
    return msgspec.structs.replace(settings, http_workers=fronts)
