"""The HTTP front replicas of ``--http-workers N``: the primary front and its secondaries."""
