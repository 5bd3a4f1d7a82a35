"""The server as a program: the command line, the start-up and shutdown order, the ready report.

- ``cli``: ``oipserve serve`` / ``oipserve tritonserver``: flags into Settings, exit codes.
- ``prepare``: start-up's first step, before anything starts: every port taken, the flags
  and files checked, the node read (``Sites``, ``StartupPlan``).
- ``server``: ``Server``, the runner: every port taken before any model loads; SIGTERM's
  drain and stop order (written in its docstring).
- ``sites``: one site per listening port (HTTP, metrics, gRPC) and one for the other HTTP
  fronts, each with start, drain and stop steps of its own.
- ``grpc_start``: the gRPC service on the front's own HTTP/2 (``front.grpc``).
- ``startup_report``: the ready (or not-ready) lines and ``--ready-file``.
"""
