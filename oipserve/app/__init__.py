"""The server as a program: the command line, the start-up and shutdown order, the ready report.

- ``cli``: ``oipserve serve`` / ``oipserve tritonserver``: flags into Settings, exit codes.
- ``server``: every port taken before any model loads; SIGTERM's drain and stop order.
- ``grpc_start``: the gRPC service on the front's own HTTP/2 (``front.grpc``).
- ``startup_report``: the ready (or not-ready) lines and ``--ready-file``.
"""
