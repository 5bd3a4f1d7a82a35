"""``--http-workers N``: the other HTTP fronts.

- ``primary``: the first front's side: starting, feeding, replacing and draining the others.
- ``process``: another front's program and its router.
- ``control``: the messages between them, on a ``framed`` socket; ``forward`` /
  ``grpc_forward``: a request or call a front does not answer itself, handed to the primary
  unchanged.
- ``batch_wire``, ``batch_link``, ``batch_desk``: a batching or sequence model's request
  that another front checked, crossing to the primary's batcher (the messages, the other
  front's end, the primary's end).
- ``supervision``: child processes watched and replaced with a growing pause.
"""
