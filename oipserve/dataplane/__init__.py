"""The inference path once a front has decoded a request, free of any web framework.

- ``plane``: ``DataPlane``: health, metadata, and a request checked, placed and dispatched to
  a worker (or answered in the front: ``echo``).
- ``batched``: requests of models with ``dynamic_batching``, through their batcher
  (``scheduling``).
- ``batch_io``: a batch's inputs joined once, its outputs split as views.
"""
