"""The inference path once a front has decoded a request, free of any web framework.

- ``plane``: ``DataPlane``: health, metadata, and each request through the strategy its
  model version chose at its first request (``strategies``: answered in the front for
  ``echo``, run alone, or queued for a batch).
- ``intake``: a request's deadline and checks, before its inputs are placed.
- ``dispatch``: the one way to a worker and back, for a request alone or a batch.
- ``batched``: requests of models with ``dynamic_batching``, through their batcher
  (``scheduling``).
- ``batch_io``: a batch's inputs joined once, its outputs split as views.
- ``ragged``: the batches of models with Triton's ragged batching (ragged inputs flat,
  ``batch_input`` tensors made, ``batch_output`` scattered by the input's shapes).
- ``padding``: the batches of models with ``pad_batch`` (inputs padded, masks made, the
  waste bound, outputs cut back).
- ``sequenced``: requests of models with ``sequence_batching`` (stateful sequences), through
  their sequence batcher (``scheduling.sequence``; docs/sequences.md): a request's way in.
- ``sequence_batches``: when a sequence lane's batch is due, and running it on its worker.
- ``sequence_slots``: the sequences' places on the lanes, the backlog, their answers and
  timers.
- ``ensemble``: requests of ensembles: each step a request of its composing model, the
  tensors between steps left in the workers' segments (docs/ensembles.md); the request
  checked, its chains planned.
- ``ensemble_run``: one ensemble request through its steps.
- ``ensemble_tensors``: an ensemble request's tensors, where they lie, the holds on them.
- ``ensemble_chains``: consecutive steps of an ensemble sent as one request that one worker
  runs (``workers.chains``), the tensors between them never leaving its memory.
"""
