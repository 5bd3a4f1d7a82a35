"""A prototype of the front's gRPC on python-hyper's ``h2``, for the base decision of
issue 37 (``results/2026-11-28-h2-base.md``). Nothing in ``oipserve`` imports it."""
