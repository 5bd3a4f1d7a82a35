"""The worker processes as the front sees them.

- ``link``: one connection to a worker: requests, replies, deadlines, coalesced writes.
- ``handle``: one worker process: start, heartbeat, loads, death.
- ``sockets``: the protocols on a worker's two sockets.
- ``worker_pool``: all of them, and one replacement per dead worker's slot.
"""
