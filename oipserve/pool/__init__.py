"""The worker processes as the front sees them.

- ``link``: one connection to a worker: requests, replies, deadlines, coalesced writes, and
  the protocol of its message socket (``MessageProtocol``).
- ``handle``: one worker process: start, heartbeat (its second socket, judged so that a
  stalled front never takes a healthy worker for a hung one), loads, death.
- ``worker_pool``: all of them, and one replacement per dead worker's slot.
"""
