"""``--http-workers N``: the other HTTP fronts.

- ``primary``: the first front's side: starting, feeding, replacing and draining the others.
- ``process``: another front's program and its router.
- ``control``: the messages between them; ``forward`` / ``grpc_forward``: a request or call
  a front does not answer itself, handed to the primary unchanged.
- ``supervision``: child processes watched and replaced with a growing pause.
"""
