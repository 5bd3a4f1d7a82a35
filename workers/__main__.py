"""``python -m workers``: one worker process, started by the front (``runtime.workerproc``).

The front passes one end of a socket pair as an inherited file descriptor (and,
for ``--http-workers``, a listening socket for the other fronts). This
entry point imports only the worker side (and the wire contract), never the
front's modules.
"""

from __future__ import annotations

import argparse
import socket

from workers.heartbeat import die_with_front, start_heartbeat


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--heartbeat-fd", type=int, required=True)
    # The front that started this worker: the worker does not outlive it.
    parser.add_argument("--front-pid", type=int, required=True)
    parser.add_argument("--segment-prefix", required=True)
    parser.add_argument("--log-level", default="info")
    # A listening socket where the server's other fronts connect (--http-workers).
    parser.add_argument("--fronts-fd", type=int, default=None)
    # Microseconds to poll for the next request after a reply (workers.busy_poll; 0: never).
    parser.add_argument("--busy-poll-us", type=int, default=0)
    # At low load, run on the front's CPU (workers.colocation).
    parser.add_argument("--colocate", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    args = _args()
    # NOTE: first of all, before the slow imports: a front killed while this worker
    #   starts must not leave it behind.
    die_with_front(args.front_pid)
    # NOTE: the heartbeat answers before ONNX Runtime is imported (by workers.worker);
    #   the front checks it only once the worker has said it is ready.
    start_heartbeat(socket.socket(fileno=args.heartbeat_fd))
    from workers.worker import main

    fronts = None if args.fronts_fd is None else socket.socket(fileno=args.fronts_fd)
    main(
        socket.socket(fileno=args.socket_fd),
        args.segment_prefix,
        args.log_level,
        fronts,
        args.busy_poll_us,
        args.front_pid if args.colocate else 0,
    )
