"""gRPC served by separate processes (``--grpc-processes N``), answered by the front.

grpc.aio's machinery costs about two thirds of a gRPC call's CPU in the front
(docs/grpc.md), and receiving a large message holds its event loop for as long as
grpc copies it (docs/limits.md). With ``--grpc-processes N`` that work runs in N
child processes (``oipserve.grpc_process``) on their own cores, sharing the gRPC
port; each forwards every call's raw bytes to the front over a Unix socket, and the
front answers it with the same method table it serves in-process
(``oipserve.grpc_front.handlers``). One job per module:

- ``frames``: the frames on that socket and a protocol that reads and writes them.
- ``front_side``: the front's end of one socket: runs forwarded calls, sends replies.
- ``processes``: starts the N processes, replaces one that dies, stops them first at
  shutdown.

docs/grpc.md, "gRPC processes", has the design and the measurements.
"""
