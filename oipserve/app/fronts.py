"""How many HTTP fronts serve when ``--http-workers`` is ``auto`` (the default).

Decided once at start-up, before any port is bound, from the CPUs this process may use
(``hardware.cpus.fronts_for``: 1 front on 1 CPU, 2 up to 11, then one per 4 CPUs, at most
4). The repository does not count: a model's dynamic batches and its sequences form in the
primary front over every front's connections, as in Triton's one process (the other fronts
send it their checked requests: ``scaleout.batch_link``). Until that was built (both on
2026-11-29) ``auto`` kept one front for a repository with a batching model, since each
front batched its own connections. A number given for ``--http-workers`` is used as given.

docs/scaling.md ("The default number of fronts") has the figures.
"""

from __future__ import annotations

import msgspec

from hardware.cpus import fronts_for, usable_cpus
from oipserve.config.settings import Settings


def settle_fronts(settings: Settings) -> Settings:
    """``settings`` with ``http_workers`` a number: ``auto`` (None) resolved, a number kept."""
    if settings.http_workers is not None:
        return settings
    return msgspec.structs.replace(settings, http_workers=fronts_for(usable_cpus()))
